import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, describe, expect, it } from 'vitest';
import { keep } from '../cache-entries.js';
import { ModelEngine } from '../engine.js';
import { freshAdapter } from '../lora.js';
import { graphDigest } from '../graph-digests.js';
import { OPTIMIZED_MODEL_ENTRIES, OptimizedModels, optimizedModelKey } from '../optimized-models.js';
import { DEFAULT_DIMS, type ModelDims } from '../transformer.js';
import { buildGraph } from '../transformer-graphs.js';

// Issue 29: onnxruntime's optimized graphs kept between processes; an entry that is damaged, or one onnxruntime
// will not load, is detected and made again, never used.
const dims: ModelDims = { ...DEFAULT_DIMS, vocab: 500 };
const root = mkdtempSync(join(tmpdir(), 'loops-mock-optimized-models-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const options: ort.InferenceSession.SessionOptions = { executionProviders: ['cpu'], intraOpNumThreads: 1, graphOptimizationLevel: 'all' };
const { onnx } = buildGraph('forward', dims);
/** The graph as the runner hands it over: built when asked, its digest unknown ahead. */
const graph = { build: () => onnx };
const digest = graphDigest(onnx);
const folderOf = (dir: string) => join(dir, 'onnxruntime-models');
const sameFace = async (session: ort.InferenceSession) => {
  const plain = await ort.InferenceSession.create(onnx, options);
  expect(session.inputNames).toEqual(plain.inputNames);
  expect(session.outputNames).toEqual(plain.outputNames);
};

/** A folder under `root` holding the graph's entry with one byte flipped. */
async function damagedEntry(name: string): Promise<string> {
  const dir = join(root, name);
  await new OptimizedModels(dir).create(graph, options);
  const file = join(folderOf(dir), readdirSync(folderOf(dir))[0]!);
  const bytes = readFileSync(file);
  bytes[bytes.length - 50]! ^= 0x10;
  writeFileSync(file, bytes);
  return dir;
}

describe("onnxruntime's optimized graphs kept in the cache folder", () => {
  it('are saved on a miss, loaded by the next process on a hit, and held for a session built again in this one', async () => {
    const dir = join(root, 'hit');
    const first = new OptimizedModels(dir);
    await sameFace(await first.create(graph, options));
    expect(first.counts).toMatchObject({ miss: 1, hit: 0 });
    expect(readdirSync(folderOf(dir))).toHaveLength(1);
    // A heavy run's session, released and built again: from memory.
    await first.create(graph, options);
    expect(first.counts).toMatchObject({ miss: 1, held: 1 });
    const next = new OptimizedModels(dir);
    await sameFace(await next.create(graph, options));
    expect(next.counts).toMatchObject({ hit: 1, miss: 0, rebuilt: 0 });
    // Nothing but the entry is left in the folder (onnxruntime's own file is removed once read).
    expect(readdirSync(folderOf(dir))).toHaveLength(1);
  });

  it('are keyed by the graph, the runtime, the options and the machine: a change of any is another entry', () => {
    const key = optimizedModelKey(digest, options);
    expect(optimizedModelKey(graphDigest(buildGraph('forward', dims).onnx), options)).toBe(key);
    expect(optimizedModelKey(graphDigest(buildGraph('backward', dims).onnx), options)).not.toBe(key);
    expect(optimizedModelKey(digest, options, '0.0.0')).not.toBe(key);
    expect(optimizedModelKey(digest, { ...options, intraOpNumThreads: 2 })).not.toBe(key);
  });

  it('refuse an entry with a flipped byte, or one onnxruntime will not load, and optimize the graph again', async () => {
    const flipped = await damagedEntry('flipped');
    const again = new OptimizedModels(flipped);
    await sameFace(await again.create(graph, options));
    expect(again.counts).toMatchObject({ rebuilt: 1, hit: 0 });
    expect(again.lastRefused).toMatch(/do not match their checksum/);
    const healed = new OptimizedModels(flipped);
    await healed.create(graph, options);
    expect(healed.counts.hit).toBe(1);

    // A sound entry (its checksum right) whose bytes are no graph onnxruntime loads.
    const junk = join(root, 'junk');
    keep(OPTIMIZED_MODEL_ENTRIES, junk, optimizedModelKey(digest, options), new Uint8Array([1, 2, 3, 4, 5]));
    const refused = new OptimizedModels(junk);
    await sameFace(await refused.create(graph, options));
    expect(refused.counts).toMatchObject({ rebuilt: 1, hit: 0 });
    expect(refused.lastRefused).toMatch(/a graph onnxruntime refused/);
    const mended = new OptimizedModels(junk);
    await mended.create(graph, options);
    expect(mended.counts.hit).toBe(1);
  });

  it('serve a graph whose digest came ahead without building it, and build it only on a miss', async () => {
    const dir = join(root, 'ahead');
    let built = 0;
    const ahead = {
      digest,
      build: () => {
        built++;
        return onnx;
      },
    };
    const first = new OptimizedModels(dir);
    await first.create(ahead, options);
    expect([built, first.graphsBuilt]).toEqual([1, 1]);
    const next = new OptimizedModels(dir);
    await sameFace(await next.create(ahead, options));
    expect(next.counts.hit).toBe(1);
    expect([built, next.graphsBuilt]).toEqual([1, 0]);
    // Without the digest the graph is built to be hashed, and finds the same entry.
    const hashed = new OptimizedModels(dir);
    await hashed.create(graph, options);
    expect([hashed.counts.hit, hashed.graphsBuilt]).toEqual([1, 1]);
  });

  it("read the package's entries where the cache folder has none, write nothing there, and pass over a damaged one", async () => {
    const shipped = join(root, 'shipped');
    await new OptimizedModels(shipped).create(graph, options);
    const shippedFiles = () => readdirSync(folderOf(shipped)).map((f) => readFileSync(join(folderOf(shipped), f)).toString('base64'));
    const before = shippedFiles();
    // An empty cache folder, and none at all (--cache-dir none): the package's entry serves both.
    const empty = join(root, 'empty');
    const fromShipped = new OptimizedModels(empty, shipped);
    await sameFace(await fromShipped.create({ digest, build: () => onnx }, options));
    expect(fromShipped.counts).toMatchObject({ shipped: 1, hit: 0, miss: 0 });
    expect(fromShipped.graphsBuilt).toBe(0);
    expect(() => readdirSync(folderOf(empty))).toThrow(/ENOENT/);
    const noCache = new OptimizedModels(null, shipped);
    await noCache.create(graph, options);
    expect(noCache.counts).toMatchObject({ shipped: 1, off: 0 });
    expect(shippedFiles()).toEqual(before);
    // Another machine's (or runtime's) entries are under other keys: passed over, optimized here.
    const elsewhere = new OptimizedModels(null, shipped);
    await elsewhere.create(graph, { ...options, intraOpNumThreads: 2 });
    expect(elsewhere.counts).toMatchObject({ shipped: 0, off: 1 });

    const damaged = await damagedEntry('damaged');
    const file = join(folderOf(damaged), readdirSync(folderOf(damaged))[0]!);
    const bytes = readFileSync(file);
    const passedOver = new OptimizedModels(join(root, 'beside-damaged'), damaged);
    await sameFace(await passedOver.create(graph, options));
    expect(passedOver.counts).toMatchObject({ shipped: 0, miss: 1 });
    expect(readdirSync(folderOf(join(root, 'beside-damaged')))).toHaveLength(1);
    // The package's folder is never mended: it is the build's.
    expect(readFileSync(file)).toEqual(bytes);
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
