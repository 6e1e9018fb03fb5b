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

describe('the top-p draw by definition', () => {
  it('gives each token of the nucleus exactly its share p / (nucleus mass) of the uniform numbers, and none outside', () => {
    // Every u of a fine grid drawn once: a token's count / n is the measure of the u that give it. A draw kept when it
    // falls inside, and otherwise redrawn at u's place among the outside tokens, must give each token p / M.
    const n = 30_000;
    let i = 0;
    const grid = { next: () => (i++ + 0.5) / n } as unknown as Prng;
    // Peaked, with ties at several places (pairs of equal probabilities), ids of the likely ones scattered.
    const raw = new Float32Array(300).map((_, v) => Math.exp(-((v * 37) % 300) / 30));
    for (let v = 0; v + 1 < raw.length; v += 11) raw[v + 1] = raw[v]!;
    const total = raw.reduce((s, x) => s + x, 0);
    const probs = raw.map((x) => x / total);
    const logprobs = probs.map((p) => Math.log(p));
    for (const topP of [0.2, 0.6, 0.95]) {
      const nucleus = bruteForceNucleus(probs, topP);
      const mass = [...nucleus].reduce((s, v) => s + probs[v]!, 0);
      const counts = new Float64Array(probs.length);
      i = 0;
      for (let k = 0; k < n; k++) counts[chooseToken(logprobs, probs, { ...SAMPLING_DEFAULTS, temperature: 1, top_p: topP, stop: [] }, grid)[0]]! += 1;
      for (let v = 0; v < probs.length; v++) {
        const expected = nucleus.has(v) ? probs[v]! / mass : 0;
        expect(Math.abs(counts[v]! / n - expected), `token ${v} at top_p ${topP}`).toBeLessThan(2.5 / n);
      }
    }
  });
});
