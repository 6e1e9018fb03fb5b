import { describe, expect, it } from 'vitest';
import { Prng } from '../prng.js';

describe('the seeded generator', () => {
  it('fills arrays with the numbers next() gives one by one, bit for bit, and carries on where they end', () => {
    for (const [length, std] of [
      [0, 1],
      [1, 0.5],
      [7, 1 / Math.sqrt(64)],
      [100_003, 0.02],
    ] as const) {
      const filled = new Prng(`fill ${length}`);
      const oneByOne = new Prng(`fill ${length}`);
      const out = filled.fillUniform(new Float32Array(length), std);
      const bound = std * Math.sqrt(3);
      const expected = Float32Array.from({ length }, () => (oneByOne.next() * 2 - 1) * bound);
      expect(Buffer.from(out.buffer).equals(Buffer.from(expected.buffer)), `${length}`).toBe(true);
      expect(filled.nextU32()).toBe(oneByOne.nextU32());
    }
  });

  it('gives the same numbers for the same seed and others for another', () => {
    const a = new Prng('seed').fillUniform(new Float32Array(64), 1);
    const b = new Prng('seed').fillUniform(new Float32Array(64), 1);
    const c = new Prng('other').fillUniform(new Float32Array(64), 1);
    expect([...a]).toEqual([...b]);
    expect([...a]).not.toEqual([...c]);
    expect(Math.max(...a.map(Math.abs))).toBeLessThanOrEqual(Math.sqrt(3));
  });
});
