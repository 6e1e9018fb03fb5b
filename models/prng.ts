/**
 * xoshiro128**: a small PRNG built only from 32-bit integer operations, so
 * the same seed gives bit-identical numbers on every machine and Node version.
 */
export class Prng {
  private s: Uint32Array;

  constructor(seed: string | number) {
    // Seed the state with splitmix32 over an FNV-1a hash of the seed text.
    let h = 0x811c9dc5;
    for (const ch of String(seed)) h = Math.imul(h ^ ch.codePointAt(0)!, 0x01000193) >>> 0;
    this.s = new Uint32Array(4);
    for (let i = 0; i < 4; i++) {
      h = (h + 0x9e3779b9) >>> 0;
      let z = h;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      this.s[i] = (z ^ (z >>> 16)) >>> 0;
    }
  }

  nextU32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5), 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2]! ^= s[0]!;
    s[3]! ^= s[1]!;
    s[1]! ^= s[2]!;
    s[0]! ^= s[3]!;
    s[2]! ^= t;
    s[3] = rotl(s[3]!, 11);
    return result;
  }

  /** Uniform in [0, 1), 24 bits: exact in float32 and float64 alike. */
  next(): number {
    return (this.nextU32() >>> 8) / 16777216;
  }

  /** Fills `out` with uniform values of the given standard deviation (centred: ±std·√3). */
  fillUniform(out: Float32Array, std: number): Float32Array {
    const bound = std * Math.sqrt(3);
    for (let i = 0; i < out.length; i++) out[i] = (this.next() * 2 - 1) * bound;
    return out;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}
