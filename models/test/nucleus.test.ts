import * as ort from 'onnxruntime-node';
import { describe, expect, it } from 'vitest';
import { GraphBuilder } from '../graph/builder.js';
import { Prng } from '../prng.js';
import { drawNucleusTokens } from '../draw-graphs.js';
import { chooseToken, SAMPLING_DEFAULTS } from '../index.js';

/** The nucleus by definition: tokens by probability (then id), taken until their mass reaches top_p. */
function bruteForceNucleus(probs: Float32Array, topP: number): Set<number> {
  const order = Array.from(probs.keys()).sort((a, b) => probs[b]! - probs[a]! || a - b);
  const total = probs.reduce((s, p) => s + p, 0);
  const out = new Set<number>();
  let kept = 0;
  for (const v of order) {
    out.add(v);
    kept += probs[v]!;
    if (kept >= topP * total) break;
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
  it('keeps a first token inside the nucleus; after one outside, gives each token of the nucleus exactly its share p / (nucleus mass) of the retry numbers', () => {
    // Peaked, with ties at several places (pairs of equal probabilities), ids of the likely ones scattered.
    const raw = new Float32Array(300).map((_, v) => Math.exp(-((v * 37) % 300) / 30));
    for (let v = 0; v + 1 < raw.length; v += 11) raw[v + 1] = raw[v]!;
    const total = raw.reduce((s, x) => s + x, 0);
    const probs = raw.map((x) => x / total);
    const logprobs = probs.map((p) => Math.log(p));
    const sum = probs.reduce((s, x) => s + x, 0);
    // u at the middle of token v's slice of the whole running sum.
    const middleOf = (v: number) => (probs.slice(0, v).reduce((s, x) => s + x, 0) + probs[v]! / 2) / sum;
    for (const topP of [0.2, 0.6, 0.95]) {
      const nucleus = bruteForceNucleus(probs, topP);
      const mass = [...nucleus].reduce((s, v) => s + probs[v]!, 0);
      const params = { ...SAMPLING_DEFAULTS, temperature: 1, top_p: topP, stop: [] };
      const numbers = (values: number[]) => {
        let i = 0;
        return { next: () => values[i++ % values.length]! } as unknown as Prng;
      };
      const inside = [...nucleus][0]!;
      expect(chooseToken(logprobs, probs, params, numbers([middleOf(inside), 0.5]))[0]).toBe(inside);
      // Every retry of a fine grid once, each after a first number that falls outside: a token's count / n is the
      // measure of the retries that give it. Drawn at the retry, or redrawn from the nucleus at the retry's place
      // among the outside tokens, each must come out p / M.
      const outside = Array.from(probs.keys()).find((v) => !nucleus.has(v))!;
      const n = 30_000;
      const grid = numbers(Array.from({ length: 2 * n }, (_, i) => (i % 2 === 0 ? middleOf(outside) : (Math.floor(i / 2) + 0.5) / n)));
      const counts = new Float64Array(probs.length);
      for (let k = 0; k < n; k++) counts[chooseToken(logprobs, probs, params, grid)[0]]! += 1;
      for (let v = 0; v < probs.length; v++) {
        const expected = nucleus.has(v) ? probs[v]! / mass : 0;
        expect(Math.abs(counts[v]! / n - expected), `token ${v} at top_p ${topP}`).toBeLessThan(2.5 / n);
      }
    }
  });
});

describe('the top_p draw in the graph', () => {
  it('gives the token of the rule in JavaScript for every draw: rows of their own distributions and top_p, ties at the edge, few and many draws per row, a padded vocabulary', async () => {
    const V = 1009; // prime: the draw's last block is padded
    // Each draw tested on its own (draw_nucleus), and each row's nucleus found once (draw_nucleus_wide).
    const sessions = await Promise.all(
      [false, true].map((wide) => {
        const g = new GraphBuilder('nucleus-draw-check');
        const logits = g.input('logits', 'float32', ['B', V]);
        const { token, logprob } = drawNucleusTokens(
          g,
          logits,
          g.input('u', 'float32', ['B', 'N']),
          g.input('u_retry', 'float32', ['B', 'N']),
          g.input('top_p', 'float32', ['B', 1]),
          V,
          wide,
        );
        g.output(g.softmax(logits), 'probs');
        g.output(token, 'token');
        g.output(logprob, 'token_logprob');
        return ort.InferenceSession.create(g.toOnnx());
      }),
    );
    const rng = new Prng('graph-nucleus');
    // Peaked; near-uniform; four exactly equal levels (ties everywhere, so at the edge); peaked with every logit twice.
    const rows = [
      Float32Array.from({ length: V }, () => rng.next() * 6),
      Float32Array.from({ length: V }, () => rng.next() * 0.05),
      Float32Array.from({ length: V }, (_, v) => [0, 0.3, 0.6, 0.9][(v * 7) % 4]!),
      Float32Array.from({ length: V }, (_, v) => (Math.floor(v / 2) % 97) / 20),
    ];
    const topPs = [0.9, 0.37, 0.61, 0.95];
    const paths = { first: 0, retry: 0, redrawn: 0 };
    let edgeTies = 0;
    for (const [N, session] of [
      [1, sessions[0]!],
      [3, sessions[0]!],
      [3, sessions[1]!],
      [8, sessions[1]!],
    ] as const) {
      for (let trial = 0; trial < 12; trial++) {
        const u = Float32Array.from({ length: rows.length * N }, () => rng.next());
        const retry = Float32Array.from({ length: rows.length * N }, () => rng.next());
        const out = await session.run({
          logits: new ort.Tensor('float32', Float32Array.from(rows.flatMap((r) => [...r])), [rows.length, V]),
          u: new ort.Tensor('float32', u, [rows.length, N]),
          u_retry: new ort.Tensor('float32', retry, [rows.length, N]),
          top_p: new ort.Tensor('float32', Float32Array.from(topPs), [rows.length, 1]),
        });
        const allProbs = out.probs!.data as Float32Array;
        const tokens = out.token!.data as BigInt64Array;
        const logps = out.token_logprob!.data as Float32Array;
        rows.forEach((_, b) => {
          const probs = allProbs.slice(b * V, (b + 1) * V);
          const logprobs = probs.map((p) => Math.log(p));
          const params = { ...SAMPLING_DEFAULTS, temperature: 1, top_p: topPs[b]!, stop: [] };
          const nucleus = bruteForceNucleus(probs, topPs[b]!);
          const whole = probs.reduce((sum, q) => sum + q, 0);
          const edge = Math.min(...[...nucleus].map((v) => probs[v]!));
          if (trial === 0 && N === 1 && probs.some((p, v) => p === edge && !nucleus.has(v))) edgeTies++;
          for (let n = 0; n < N; n++) {
            const i = b * N + n;
            let k = 0;
            const numbers = [u[i]!, retry[i]!];
            const scripted = { next: () => numbers[k++]! } as unknown as Prng;
            const [expected, lp] = chooseToken(logprobs, probs, params, scripted);
            expect(Number(tokens[i]), `row ${b}, draw ${n} of ${N}${session === sessions[1] ? ', wide' : ''}`).toBe(expected);
            expect(logps[i]).toBeCloseTo(lp, 5);
            const at = (x: number) => {
              let run = 0;
              for (let v = 0; v < V; v++) {
                run += probs[v]!;
                if (run > x * whole) return v;
              }
              return V - 1;
            };
            paths[nucleus.has(at(u[i]!)) ? 'first' : nucleus.has(at(retry[i]!)) ? 'retry' : 'redrawn']++;
          }
        });
      }
    }
    // Every branch of the rule was taken, and the edge fell inside a group of equal probabilities.
    expect(
      Object.values(paths).every((count) => count > 5),
      JSON.stringify(paths),
    ).toBe(true);
    expect(edgeTies).toBeGreaterThan(0);
    await Promise.all(sessions.map((s) => s.release()));
  });
});
