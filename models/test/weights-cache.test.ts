import { mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { baseWeights, DEFAULT_DIMS, type ModelDims } from '../transformer.js';
import { cachedBaseWeights } from '../weights-cache.js';

// A small model: the same code as Qwen's 39 MB, in a few hundred kilobytes.
const dims: ModelDims = { ...DEFAULT_DIMS, vocab: 500 };
const MODEL = 'Qwen/Qwen3.5-2B';
const root = mkdtempSync(join(tmpdir(), 'loops-mock-weights-cache-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const fresh = baseWeights(MODEL, dims);
const entryOf = (dir: string) => join(dir, 'base-weights', readdirSync(join(dir, 'base-weights'))[0]!);
const sameAsFresh = (weights: { name: string; data: Float32Array }[]) => {
  expect(weights.map((w) => w.name)).toEqual(fresh.map((w) => w.name));
  for (const [i, w] of weights.entries()) {
    const bytes = Buffer.from(w.data.buffer, w.data.byteOffset, w.data.byteLength);
    expect(bytes.equals(Buffer.from(fresh[i]!.data.buffer)), w.name).toBe(true);
  }
};

describe("the base weights' cache", () => {
  it('makes an entry on a miss and reads the same numbers back on a hit', () => {
    const dir = join(root, 'hit');
    const first = cachedBaseWeights(MODEL, dims, dir);
    expect(first.outcome).toBe('miss');
    sameAsFresh(first.weights);
    const second = cachedBaseWeights(MODEL, dims, dir);
    expect(second.outcome).toBe('hit');
    sameAsFresh(second.weights);
    // Another model or shape is another entry, never this one's numbers.
    expect(cachedBaseWeights('Qwen/Qwen3-8B', dims, dir).outcome).toBe('miss');
    expect(cachedBaseWeights(MODEL, { ...dims, vocab: 501 }, dir).outcome).toBe('miss');
    expect(readdirSync(join(dir, 'base-weights'))).toHaveLength(3);
  });

  it('detects an entry cut short, garbled numbers, a garbled header or one made by other code, and makes it again', () => {
    const damages: [string, (file: string) => void, RegExp][] = [
      ['cut short', (f) => truncateSync(f, readFileSync(f).length - 8), /bytes, not the/],
      [
        'a flipped number',
        (f) => {
          const b = readFileSync(f);
          b[b.length - 100]! ^= 0x40;
          writeFileSync(f, b);
        },
        /do not match their checksum/,
      ],
      [
        'a garbled header',
        (f) => {
          const b = readFileSync(f);
          b[40] = 0x7b;
          writeFileSync(f, b);
        },
        /garbled header|other code/,
      ],
      ['not an entry at all', (f) => writeFileSync(f, 'hello'), /not an entry of this cache/],
      [
        'made by other code',
        (f) => {
          const b = readFileSync(f);
          const text = b.toString('latin1');
          const at = text.indexOf('"key":"') + 7;
          b[at] = b[at] === 0x30 ? 0x31 : 0x30;
          writeFileSync(f, b);
        },
        /made by other code/,
      ],
    ];
    for (const [name, damage, why] of damages) {
      const dir = join(root, name.replace(/ /g, '-'));
      cachedBaseWeights(MODEL, dims, dir);
      const file = entryOf(dir);
      damage(file);
      const again = cachedBaseWeights(MODEL, dims, dir);
      expect(again.outcome, name).toBe('rebuilt');
      expect(again.refused, name).toMatch(why);
      sameAsFresh(again.weights);
      // The entry written over it is sound: the next process reads it.
      expect(cachedBaseWeights(MODEL, dims, dir).outcome, name).toBe('hit');
    }
  });

  it('keeps nothing with no cache folder, and only costs the time where the folder cannot be written', () => {
    const off = cachedBaseWeights(MODEL, dims, null);
    expect(off.outcome).toBe('off');
    sameAsFresh(off.weights);
    const blocked = join(root, 'a-file');
    writeFileSync(blocked, 'not a folder');
    const unwritable = cachedBaseWeights(MODEL, dims, blocked);
    expect(unwritable.outcome).toBe('miss');
    sameAsFresh(unwritable.weights);
  });
});
