/**
 * A base model's seeded weights kept between processes (cache-entries.ts): generating them takes ~80 ms of the
 * engine's thread (39 MB of random numbers for Qwen's vocabulary), reading them back ~15 ms.
 */
import { createHash } from 'node:crypto';
import { cached, type CacheOutcome, type EntryKind } from './cache-entries.js';
import { Prng } from './prng.js';
import { baseWeightShapes, baseWeights, type BaseWeight, type ModelDims } from './transformer.js';

/**
 * The entry's key: the model, its shapes, and the source of the code that makes the weights, so that a change
 * to that code (a new generator, other scales) makes a new entry rather than reading numbers it no longer makes.
 */
function entryKey(modelName: string, dims: ModelDims): string {
  return createHash('sha256')
    .update(JSON.stringify({ modelName, dims }))
    .update(baseWeights.toString())
    .update(baseWeightShapes.toString())
    .update(Prng.toString())
    .digest('hex');
}

type Layout = { name: string; shape: number[] }[];

const WEIGHTS: EntryKind<BaseWeight[]> = {
  folder: 'base-weights',
  magic: 'loops-mock base weights 2\n',
  encode: (weights) => ({
    parts: weights.map((w) => new Uint8Array(w.data.buffer, w.data.byteOffset, w.data.byteLength)),
    about: weights.map((w) => ({ name: w.name, shape: w.shape })),
  }),
  decode(bytes, about) {
    const layout = about as Layout;
    const floats = bytes.byteLength / 4;
    // A view where the bytes lie 4-aligned (a file this large has a buffer of its own), a copy where not.
    const data =
      bytes.byteOffset % 4 === 0
        ? new Float32Array(bytes.buffer, bytes.byteOffset, floats)
        : new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + floats * 4));
    const out: BaseWeight[] = [];
    let at = 0;
    for (const w of layout) {
      const n = w.shape.reduce((p, d) => p * d, 1);
      out.push({ name: w.name, shape: w.shape, data: data.subarray(at, at + n) });
      at += n;
    }
    return at === floats ? out : 'shapes that do not add up to its numbers';
  },
};

/**
 * The base weights of `modelName`: from `cacheDir` when it holds a sound entry for them, else made and kept there
 * for the next process. A cache that cannot be read or written only costs the time: the weights are made.
 */
export function cachedBaseWeights(
  modelName: string,
  dims: ModelDims,
  cacheDir: string | null,
): { weights: BaseWeight[]; outcome: CacheOutcome; refused?: string } {
  const { value, ...rest } = cached(WEIGHTS, cacheDir, entryKey(modelName, dims), () => baseWeights(modelName, dims));
  return { weights: value, ...rest };
}
