/**
 * A base model's seeded weights kept between processes: generating them takes ~80 ms of the engine's thread
 * (39 MB of random numbers for Qwen's vocabulary), reading them back ~15 ms. Each entry says what it was made
 * from and carries a checksum of its numbers; one that is cut short, garbled or made by other code is detected,
 * never used, and made again.
 */
import { createHash } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Prng } from './prng.js';
import { baseWeightShapes, baseWeights, type BaseWeight, type ModelDims } from './transformer.js';

const MAGIC = 'loops-mock base weights 1\n';

/** What a lookup found: a usable entry, none, one it refused (and replaced), or no cache to use. */
export type WeightsCacheOutcome = 'hit' | 'miss' | 'rebuilt' | 'off';

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

/**
 * A 32-bit checksum of the numbers, over the arrays in turn as if they were one (~10 ms for 39 MB: a hash would
 * cost what generating them does).
 */
function checksum(parts: Float32Array[]): number {
  let h = 0x811c9dc5;
  for (const part of parts) {
    const words = new Uint32Array(part.buffer, part.byteOffset, part.length);
    for (let i = 0; i < words.length; i++) h = Math.imul(h ^ words[i]!, 0x01000193) ^ (h >>> 15);
  }
  return h >>> 0;
}

interface Header {
  key: string;
  weights: { name: string; shape: number[] }[];
  floats: number;
  checksum: number;
}

/** The entry's weights, or why they cannot be used. */
function readEntry(file: string, key: string): BaseWeight[] | string {
  let bytes: Buffer;
  try {
    bytes = readFileSync(file);
  } catch {
    return 'missing';
  }
  const headerEnd = bytes.indexOf(0x0a, MAGIC.length);
  if (bytes.toString('latin1', 0, MAGIC.length) !== MAGIC || headerEnd < 0) return 'not an entry of this cache';
  let header: Header;
  try {
    header = JSON.parse(bytes.toString('utf8', MAGIC.length, headerEnd)) as Header;
  } catch {
    return 'a garbled header';
  }
  if (header.key !== key) return 'made by other code or for another model';
  // The numbers start at a multiple of 4 bytes (the header is padded to it, see writeEntry).
  const start = headerEnd + 1;
  if (bytes.length - start !== header.floats * 4) return `${bytes.length} bytes, not the ${start + header.floats * 4} it should have`;
  // A view where the bytes are aligned to 4 (a file this large has a buffer of its own), a copy where not.
  const offset = bytes.byteOffset + start;
  const data =
    offset % 4 === 0 ? new Float32Array(bytes.buffer, offset, header.floats) : new Float32Array(bytes.buffer.slice(offset, offset + header.floats * 4));
  if (checksum([data]) !== header.checksum) return 'numbers that do not match their checksum';
  const out: BaseWeight[] = [];
  let at = 0;
  for (const w of header.weights) {
    const n = w.shape.reduce((p, d) => p * d, 1);
    out.push({ name: w.name, shape: w.shape, data: data.subarray(at, at + n) });
    at += n;
  }
  return at === header.floats ? out : 'shapes that do not add up to its numbers';
}

/** Writes an entry whole or not at all (a temporary file renamed over it): a reader never sees half of one. */
function writeEntry(file: string, key: string, weights: BaseWeight[]): void {
  const floats = weights.reduce((n, w) => n + w.data.length, 0);
  const header: Header = { key, weights: weights.map((w) => ({ name: w.name, shape: w.shape })), floats, checksum: checksum(weights.map((w) => w.data)) };
  let head = `${MAGIC}${JSON.stringify(header)}`;
  head += ' '.repeat((4 - ((head.length + 1) % 4)) % 4);
  const tmp = `${file}.${process.pid}.tmp`;
  try {
    // Each weight written from where it lies: no 39 MB copy on the engine's thread at its first start.
    const fd = openSync(tmp, 'w');
    try {
      writeSync(fd, `${head}\n`, null, 'latin1');
      for (const w of weights) writeSync(fd, new Uint8Array(w.data.buffer, w.data.byteOffset, w.data.byteLength));
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, file);
  } finally {
    rmSync(tmp, { force: true });
  }
}

/**
 * The base weights of `modelName`: from `cacheDir` when it holds a sound entry for them, else made and kept there
 * for the next process. A cache that cannot be read or written only costs the time: the weights are made.
 */
export function cachedBaseWeights(
  modelName: string,
  dims: ModelDims,
  cacheDir: string | null,
): { weights: BaseWeight[]; outcome: WeightsCacheOutcome; refused?: string } {
  if (!cacheDir) return { weights: baseWeights(modelName, dims), outcome: 'off' };
  const key = entryKey(modelName, dims);
  const dir = join(cacheDir, 'base-weights');
  const file = join(dir, `${key.slice(0, 24)}.bin`);
  const found = readEntry(file, key);
  if (typeof found !== 'string') return { weights: found, outcome: 'hit' };
  const weights = baseWeights(modelName, dims);
  try {
    mkdirSync(dir, { recursive: true });
    writeEntry(file, key, weights);
  } catch {
    // A full or read-only disk: this process made them, the next one will again.
  }
  return found === 'missing' ? { weights, outcome: 'miss' } : { weights, outcome: 'rebuilt', refused: found };
}
