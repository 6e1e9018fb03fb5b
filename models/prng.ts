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

  /**
   * Fills `out` with uniform values of the given standard deviation (centred: ±std·√3): the numbers `next()`
   * would give, one by one. The state is held in locals meanwhile: a base model's 10 million draws take ~30 ms
   * rather than ~50 (the weights are made at every start, faster than a cached copy could be read back).
   */
  fillUniform(out: Float32Array, std: number): Float32Array {
    const bound = std * Math.sqrt(3);
    const s = this.s;
    let s0 = s[0]!;
    let s1 = s[1]!;
    let s2 = s[2]!;
    let s3 = s[3]!;
    for (let i = 0; i < out.length; i++) {
      const m = Math.imul(s1, 5);
      const u24 = Math.imul((m << 7) | (m >>> 25), 9) >>> 8;
      const t = s1 << 9;
      s2 ^= s0;
      s3 ^= s1;
      s1 ^= s2;
      s0 ^= s3;
      s2 ^= t;
      s3 = (s3 << 11) | (s3 >>> 21);
      // (u24 / 2^24) * 2 - 1, as next() gives it: both products by powers of two are exact.
      out[i] = ((u24 / 16777216) * 2 - 1) * bound;
    }
    s[0] = s0;
    s[1] = s1;
    s[2] = s2;
    s[3] = s3;
    return out;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}
