import { describe, expect, it } from 'vitest';
import { Prng } from '../prng.js';
import { chooseToken, SAMPLING_DEFAULTS } from '../index.js';

/** The nucleus by definition: tokens by probability (then id), taken until their mass reaches top_p. */
function bruteForceNucleus(probs: Float32Array, topP: number): Set<number> {
  const order = Array.from(probs.keys()).sort((a, b) => probs[b]! - probs[a]! || a - b);
  const total = probs.reduce((s, p) => s + p, 0);
  const out = new Set<number>();
  let kept = 0;
  for (const v of order) {
    out.add(v);
    if ((kept += probs[v]!) >= topP * total) break;
  }
  return out;
}

describe('top-p sampling', () => {
  it('draws only from the nucleus, ties at its edge taken in token order, on near-uniform and peaked distributions', () => {
    const rng = new Prng('nucleus');
    const cases: Float32Array[] = [];
    // Near-uniform with many exactly equal probabilities (an untrained model), and a peaked one.
    const flat = new Float32Array(5000).map((_, v) => [1, 1.0000001, 0.9999999, 1.5][v % 4]!);
    const peaked = new Float32Array(5000).map((_, v) => Math.exp(-v / 40));
    for (const p of [flat, peaked]) {
      const total = p.reduce((s, x) => s + x, 0);
      cases.push(p.map((x) => x / total));
    }
    for (const probs of cases) {
      const logprobs = probs.map((p) => Math.log(p));
      for (const topP of [0.3, 0.9, 0.95]) {
        const nucleus = bruteForceNucleus(probs, topP);
        const seen = new Set<number>();
        for (let i = 0; i < 3000; i++) {
          const [v, lp] = chooseToken(logprobs, probs, { ...SAMPLING_DEFAULTS, temperature: 1, top_p: topP, stop: [] }, rng);
          expect(nucleus.has(v), `token ${v} outside the top_p ${topP} nucleus`).toBe(true);
          expect(lp).toBe(logprobs[v]);
          seen.add(v);
        }
        // Draws spread over the nucleus rather than sticking to a corner of it.
        expect(seen.size).toBeGreaterThan(Math.min(nucleus.size, 3000) * 0.3);
      }
    }
  });
});
