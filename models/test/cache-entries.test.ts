import { mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cached, type EntryKind } from '../cache-entries.js';
import { Prng } from '../prng.js';

const root = mkdtempSync(join(tmpdir(), 'loops-mock-cache-entries-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A kind laid out as the real ones are: numbers in parts, their names and lengths in the header. */
type Vectors = { name: string; data: Float32Array }[];
const VECTORS: EntryKind<Vectors> = {
  folder: 'test-vectors',
  magic: 'loops-mock test vectors 1\n',
  encode: (vectors) => ({
    parts: vectors.map((v) => new Uint8Array(v.data.buffer, v.data.byteOffset, v.data.byteLength)),
    about: vectors.map((v) => ({ name: v.name, length: v.data.length })),
  }),
  decode(bytes, about) {
    const layout = about as { name: string; length: number }[];
    const floats = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    const out: Vectors = [];
    let at = 0;
    for (const v of layout) {
      out.push({ name: v.name, data: floats.subarray(at, at + v.length) });
      at += v.length;
    }
    return at === floats.length ? out : 'lengths that do not add up to its numbers';
  },
};

const made = (seed: string): Vectors => {
  const rng = new Prng(seed);
  return [
    { name: 'a', data: rng.fillUniform(new Float32Array(1000), 1) },
    { name: 'b', data: rng.fillUniform(new Float32Array(333), 0.1) },
  ];
};
let makes = 0;
const lookUpIn = (dir: string, key = 'key-1', seed = 'one') =>
  cached(VECTORS, dir, key, () => {
    makes++;
    return made(seed);
  });
const entryOf = (dir: string) => join(dir, VECTORS.folder, readdirSync(join(dir, VECTORS.folder))[0]!);
const sameAs = (seed: string, vectors: Vectors) => {
  const fresh = made(seed);
  expect(vectors.map((v) => v.name)).toEqual(fresh.map((v) => v.name));
  for (const [i, v] of vectors.entries())
    expect(Buffer.from(v.data.buffer, v.data.byteOffset, v.data.byteLength).equals(Buffer.from(fresh[i]!.data.buffer)), v.name).toBe(true);
};

describe('entries of the cache folder', () => {
  it('are made on a miss and read back, the same bytes, on a hit; another key is another entry', () => {
    const dir = join(root, 'hit');
    const first = lookUpIn(dir);
    expect(first.outcome).toBe('miss');
    sameAs('one', first.value);
    const before = makes;
    const second = lookUpIn(dir);
    expect(second.outcome).toBe('hit');
    expect(makes).toBe(before);
    sameAs('one', second.value);
    const other = lookUpIn(dir, 'key-2', 'two');
    expect(other.outcome).toBe('miss');
    sameAs('two', other.value);
    expect(readdirSync(join(dir, VECTORS.folder))).toHaveLength(2);
  });

  it('are refused when cut short, garbled, edited in the header or made under another key, and made again', () => {
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
      [
        'a length edited in the header',
        (f) => {
          const text = readFileSync(f, 'latin1');
          writeFileSync(f, Buffer.from(text.replace('"length":333', '"length":332'), 'latin1'));
        },
        /header that does not match its checksum/,
      ],
      ['not an entry at all', (f) => writeFileSync(f, 'hello'), /not an entry of this cache/],
      [
        'made under another key',
        (f) => {
          const b = readFileSync(f);
          const at = b.toString('latin1').indexOf('"key":"') + 7;
          b[at] = b[at] === 0x30 ? 0x31 : 0x30;
          writeFileSync(f, b);
        },
        /made by other code/,
      ],
    ];
    for (const [name, damage, why] of damages) {
      const dir = join(root, name.replace(/ /g, '-'));
      lookUpIn(dir);
      damage(entryOf(dir));
      const again = lookUpIn(dir);
      expect(again.outcome, name).toBe('rebuilt');
      expect(again.refused, name).toMatch(why);
      sameAs('one', again.value);
      // The entry written over it is sound: the next process reads it.
      expect(lookUpIn(dir).outcome, name).toBe('hit');
    }
  });

  it('are not kept with no cache folder, and a folder that cannot be written only costs the time', () => {
    const off = cached(VECTORS, null, 'key-1', () => made('one'));
    expect(off.outcome).toBe('off');
    sameAs('one', off.value);
    const blocked = join(root, 'a-file');
    writeFileSync(blocked, 'not a folder');
    const unwritable = lookUpIn(blocked);
    expect(unwritable.outcome).toBe('miss');
    sameAs('one', unwritable.value);
  });
});
