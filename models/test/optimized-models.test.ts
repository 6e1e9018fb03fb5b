import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, describe, expect, it } from 'vitest';
import { keep } from '../cache-entries.js';
import { ModelEngine } from '../engine.js';
import { freshAdapter } from '../lora.js';
import { OPTIMIZED_MODEL_ENTRIES, OptimizedModels, optimizedModelKey } from '../optimized-models.js';
import { buildGraph, DEFAULT_DIMS, type ModelDims } from '../transformer.js';

// Issue 29: onnxruntime's optimized graphs kept between processes; an entry that is damaged, or one onnxruntime
// will not load, is detected and made again, never used.
const dims: ModelDims = { ...DEFAULT_DIMS, vocab: 500 };
const root = mkdtempSync(join(tmpdir(), 'loops-mock-optimized-models-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const options: ort.InferenceSession.SessionOptions = { executionProviders: ['cpu'], intraOpNumThreads: 1, graphOptimizationLevel: 'all' };
const { onnx } = buildGraph('forward', dims);
const folderOf = (dir: string) => join(dir, 'onnxruntime-models');
const sameFace = async (session: ort.InferenceSession) => {
  const plain = await ort.InferenceSession.create(onnx, options);
  expect(session.inputNames).toEqual(plain.inputNames);
  expect(session.outputNames).toEqual(plain.outputNames);
};

describe("onnxruntime's optimized graphs kept in the cache folder", () => {
  it('are saved on a miss, loaded by the next process on a hit, and held for a session built again in this one', async () => {
    const dir = join(root, 'hit');
    const first = new OptimizedModels(dir);
    await sameFace(await first.create(onnx, options));
    expect(first.counts).toMatchObject({ miss: 1, hit: 0 });
    expect(readdirSync(folderOf(dir))).toHaveLength(1);
    // A heavy run's session, released and built again: from memory.
    await first.create(onnx, options);
    expect(first.counts).toMatchObject({ miss: 1, held: 1 });
    const next = new OptimizedModels(dir);
    await sameFace(await next.create(onnx, options));
    expect(next.counts).toMatchObject({ hit: 1, miss: 0, rebuilt: 0 });
    // Nothing but the entry is left in the folder (onnxruntime's own file is removed once read).
    expect(readdirSync(folderOf(dir))).toHaveLength(1);
  });

  it('are keyed by the graph, the runtime, the options and the machine: a change of any is another entry', () => {
    const key = optimizedModelKey(onnx, options);
    expect(optimizedModelKey(onnx, options)).toBe(key);
    expect(optimizedModelKey(buildGraph('backward', dims).onnx, options)).not.toBe(key);
    expect(optimizedModelKey(onnx, options, '0.0.0')).not.toBe(key);
    expect(optimizedModelKey(onnx, { ...options, intraOpNumThreads: 2 })).not.toBe(key);
  });

  it('refuse an entry with a flipped byte, or one onnxruntime will not load, and optimize the graph again', async () => {
    const flipped = join(root, 'flipped');
    await new OptimizedModels(flipped).create(onnx, options);
    const file = join(folderOf(flipped), readdirSync(folderOf(flipped))[0]!);
    const bytes = readFileSync(file);
    bytes[bytes.length - 50]! ^= 0x10;
    writeFileSync(file, bytes);
    const again = new OptimizedModels(flipped);
    await sameFace(await again.create(onnx, options));
    expect(again.counts).toMatchObject({ rebuilt: 1, hit: 0 });
    expect(again.lastRefused).toMatch(/do not match their checksum/);
    const healed = new OptimizedModels(flipped);
    await healed.create(onnx, options);
    expect(healed.counts.hit).toBe(1);

    // A sound entry (its checksum right) whose bytes are no graph onnxruntime loads.
    const junk = join(root, 'junk');
    keep(OPTIMIZED_MODEL_ENTRIES, junk, optimizedModelKey(onnx, options), new Uint8Array([1, 2, 3, 4, 5]));
    const refused = new OptimizedModels(junk);
    await sameFace(await refused.create(onnx, options));
    expect(refused.counts).toMatchObject({ rebuilt: 1, hit: 0 });
    expect(refused.lastRefused).toMatch(/a graph onnxruntime refused/);
    const mended = new OptimizedModels(junk);
    await mended.create(onnx, options);
    expect(mended.counts.hit).toBe(1);
  });

  it('give an engine the same numbers as a session optimizing its own graph: logprobs and gradients, bit for bit', async () => {
    const dir = join(root, 'engine');
    const seqs = [{ tokens: [1, 2, 3, 4, 5, 6], targets: [2, 3, 4, 5, 6, 7] }];
    const results: { forward: Float32Array[]; logprobs: Float32Array[]; grads: [string, Float32Array][] }[] = [];
    // No cache, then the process that writes the entries, then one that reads them.
    for (const cacheDir of [null, dir, dir]) {
      const engine = new ModelEngine('Qwen/Qwen3.5-2B', dims.vocab, { thread: 'inline', cacheDir, dims });
      try {
        const adapter = freshAdapter(engine.sites, 4, 8, 'optimized-models');
        const forward = await engine.forward(seqs, adapter);
        const back = await engine.backward(seqs, adapter, [new Float32Array(6).fill(1)]);
        results.push({ forward, logprobs: back.logprobs, grads: [...back.grads].sort(([a], [b]) => a.localeCompare(b)) });
      } finally {
        await engine.close();
      }
    }
    expect(readdirSync(folderOf(dir)).length).toBeGreaterThanOrEqual(2);
    const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('base64');
    const flat = (r: (typeof results)[number]) => [...r.forward.map(bytes), ...r.logprobs.map(bytes), ...r.grads.map(([k, v]) => `${k}:${bytes(v)}`)];
    expect(flat(results[1]!)).toEqual(flat(results[0]!));
    expect(flat(results[2]!)).toEqual(flat(results[0]!));
  }, 60_000);
});
