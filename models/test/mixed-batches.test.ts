import { describe, expect, it } from 'vitest';
import {
  EnginePool,
  freshAdapter,
  ModelEngine,
  sampleSequences,
  SAMPLING_DEFAULTS,
  type BackwardResult,
  type LoraAdapter,
  type SampledSequence,
  type SamplingParams,
  type ScoredSequence,
} from '../index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../data/support-tickets.js';

/**
 * Work of different runs (different adapters) that reaches the engine together shares one graph run, each
 * row with its own adapter (the mixed-adapter graphs), and comes out as it would alone.
 */
const MODEL = 'Qwen/Qwen3.5-2B';
const pool = new EnginePool();
const engine = pool.get(MODEL);
const tok = pool.tokenizers.get(MODEL);

/** An adapter as after some training (B non-zero), of its own rank and alpha: their scales differ. */
function trained(rank: number, alpha: number, seed: number): LoraAdapter {
  const adapter = freshAdapter(engine.sites, rank, alpha, seed);
  for (const t of adapter.tensors.values()) for (let i = 0; i < t.B.length; i++) t.B[i] = Math.sin(i * 0.37 + seed) * 0.02;
  return adapter;
}

/** The support tickets as scored sequences: only the label positions count, as the guide's datums say. */
const tickets: ScoredSequence[] = [...TICKETS, ...EVAL_TICKETS].map(([t, l]) => {
  const d = datum(tok, t, l);
  const scored = d.targetTokens!.flatMap((target, i) => (target >= 0 ? [i] : []));
  return { tokens: d.tokens, targets: d.targetTokens!.map((x) => Math.max(0, x)), scored };
});

/** Largest difference relative to the largest magnitude of `alone`: float32 rounding is ~1e-7. */
function relativeDifference(together: Float32Array, alone: Float32Array): number {
  let diff = 0;
  let scale = 1e-30;
  for (let i = 0; i < alone.length; i++) {
    diff = Math.max(diff, Math.abs(together[i]! - alone[i]!));
    scale = Math.max(scale, Math.abs(alone[i]!));
  }
  return diff / scale;
}

// Ranks 1 and 128 cap (or not) the unembedding's rank differently from 4 and 16; alphas give four scales.
const runs = [
  [1, 1],
  [4, 8],
  [16, 32],
  [128, 16],
].map(([rank, alpha], i) => ({
  adapter: trained(rank!, alpha!, i + 1),
  seqs: tickets.slice(i * 2, i * 2 + 2 + (i % 2)),
}));

describe('concurrent runs batched together', () => {
  it('forward_backward of four runs that arrive together is one graph run; each gets the logprobs and gradients it gets alone', async () => {
    const cotangents = runs.map(({ seqs }, i) => seqs.map((s) => Float32Array.from(s.tokens, (_, t) => Math.cos(t + i))));
    const alone: BackwardResult[] = [];
    for (const [i, { adapter, seqs }] of runs.entries()) alone.push(await engine.backward(seqs, adapter, cotangents[i]!));
    const before = { ...engine.graphRuns };
    const together = await Promise.all(runs.map(({ adapter, seqs }, i) => engine.backward(seqs, adapter, cotangents[i]!)));
    expect(engine.graphRuns.total - before.total).toBe(1);
    expect(engine.graphRuns.mixed - before.mixed).toBe(1);
    let [worstLogprob, worstGrad] = [0, 0];
    together.forEach((result, i) => {
      result.logprobs.forEach((lp, s) => {
        worstLogprob = Math.max(worstLogprob, relativeDifference(lp, alone[i]!.logprobs[s]!));
      });
      expect([...result.grads.keys()]).toEqual([...alone[i]!.grads.keys()]);
      for (const [name, grad] of alone[i]!.grads) {
        expect(result.grads.get(name)!.length).toBe(grad.length);
        worstGrad = Math.max(worstGrad, relativeDifference(result.grads.get(name)!, grad));
      }
    });
    // Sums over the batch's rows in another order: float32 rounding, no more (measured: logprobs equal to
    // the bit or within 1e-7, gradients within 6e-6 of their largest element; a leak between runs is ~1).
    expect(worstLogprob).toBeLessThan(1e-6);
    expect(worstGrad).toBeLessThan(5e-5);
  });

  it('nothing leaks between runs of one batch: a run whose cotangents are all 0 gets gradients of exactly 0', async () => {
    const silent = trained(16, 32, 9);
    const before = { ...engine.graphRuns };
    const [quiet] = await Promise.all([
      engine.backward(
        tickets.slice(0, 2),
        silent,
        tickets.slice(0, 2).map((s) => new Float32Array(s.tokens.length)),
      ),
      ...runs.map(({ adapter, seqs }) =>
        engine.backward(
          seqs,
          adapter,
          seqs.map((s) => new Float32Array(s.tokens.length).fill(1)),
        ),
      ),
    ]);
    expect(engine.graphRuns.mixed - before.mixed).toBe(1);
    for (const [name, grad] of quiet!.grads)
      expect(
        grad.every((x) => x === 0),
        name,
      ).toBe(true);
  });

  it('every graph run waits its turn: training and sampling of several runs at once never overlap on the engine', async () => {
    const runner = (engine as unknown as { runner: { run: (req: unknown) => Promise<unknown> } }).runner;
    const run = runner.run.bind(runner);
    let inFlight = 0;
    let most = 0;
    runner.run = async (req) => {
      most = Math.max(most, ++inFlight);
      try {
        return await run(req);
      } finally {
        inFlight--;
      }
    };
    try {
      const promptTokens = tok.encode(prompt(TICKETS[1]![0]));
      const before = { ...engine.graphRuns };
      // Samplers decode step after step while training steps keep arriving between them.
      const sampling = Promise.all(
        runs.map(({ adapter }) =>
          sampleSequences(engine, adapter, promptTokens, 2, { ...SAMPLING_DEFAULTS, max_tokens: 24, seed: 1 }, { ...tok, eosTokenIds: [] }),
        ),
      );
      for (let i = 0; i < 6; i++) {
        await new Promise((r) => setTimeout(r, 3));
        await Promise.all(
          runs.map(({ adapter, seqs }) =>
            engine.backward(
              seqs,
              adapter,
              seqs.map((s) => new Float32Array(s.tokens.length).fill(1)),
            ),
          ),
        );
      }
      await sampling;
      expect(engine.graphRuns.total - before.total).toBeGreaterThan(12);
      expect(most).toBe(1);
    } finally {
      runner.run = run;
    }
  });

  it('forward of several runs is one graph run, and two calls on one adapter share its own graph; logprobs as alone', async () => {
    const alone: Float32Array[][] = [];
    for (const { adapter, seqs } of runs) alone.push(await engine.forward(seqs, adapter));
    const before = { ...engine.graphRuns };
    const together = await Promise.all(runs.map(({ adapter, seqs }) => engine.forward(seqs, adapter)));
    expect(engine.graphRuns.total - before.total).toBe(1);
    together.forEach((lps, i) => {
      lps.forEach((lp, s) => {
        expect(relativeDifference(lp, alone[i]![s]!)).toBeLessThan(1e-5);
      });
    });

    const same = { ...engine.graphRuns };
    const [a, b] = await Promise.all([engine.forward(runs[1]!.seqs, runs[1]!.adapter), engine.forward(runs[3]!.seqs, runs[1]!.adapter)]);
    expect(engine.graphRuns.total - same.total).toBe(1);
    expect(engine.graphRuns.mixed - same.mixed).toBe(0);
    a!.forEach((lp, s) => {
      expect(relativeDifference(lp, alone[1]![s]!)).toBeLessThan(1e-5);
    });
    expect(b!.length).toBe(runs[3]!.seqs.length);
  });

  it('a shared run that fails is run again call by call: only the call that fails gets the error', async () => {
    const alone = await engine.forward(runs[0]!.seqs, runs[0]!.adapter);
    // A token beyond the vocabulary (the trainer refuses it at submit; the engine's graph fails on it).
    const bad = [{ tokens: [1, engine.dims.vocab + 5], targets: [2, 3] }];
    const before = { ...engine.graphRuns };
    const [good, failed] = await Promise.allSettled([engine.forward(runs[0]!.seqs, runs[0]!.adapter), engine.forward(bad, runs[1]!.adapter)]);
    // The shared run was tried (and failed), then each call alone.
    expect(engine.graphRuns.mixed - before.mixed).toBe(1);
    expect(engine.graphRuns.total - before.total).toBe(3);
    expect(good.status).toBe('fulfilled');
    (good as PromiseFulfilledResult<Float32Array[]>).value.forEach((lp, s) => {
      expect(Array.from(lp)).toEqual(Array.from(alone[s]!));
    });
    expect(failed.status).toBe('rejected');
  });

  it("with batchRuns off, each adapter's work runs apart and gives what it gives alone to the bit", async () => {
    const apart = new ModelEngine(MODEL, tok.vocabSize, { batchRuns: false });
    try {
      const cotangents = runs.map(({ seqs }) => seqs.map((s) => new Float32Array(s.tokens.length).fill(1)));
      const alone = [];
      for (const [i, { adapter, seqs }] of runs.entries()) alone.push(await apart.backward(seqs, adapter, cotangents[i]!));
      const before = { ...apart.graphRuns };
      const together = await Promise.all(runs.map(({ adapter, seqs }, i) => apart.backward(seqs, adapter, cotangents[i]!)));
      expect(apart.graphRuns.total - before.total).toBe(runs.length);
      expect(together).toEqual(alone);
      // Samplers' prompts and decode steps too: one batch per adapter version.
      const promptTokens = tok.encode(prompt(TICKETS[2]![0]));
      const params = { ...SAMPLING_DEFAULTS, max_tokens: 6, seed: 4 };
      const sampledAlone = [];
      for (const { adapter } of runs) sampledAlone.push(await sampleSequences(apart, adapter, promptTokens, 2, params, tok));
      expect(await Promise.all(runs.map(({ adapter }) => sampleSequences(apart, adapter, promptTokens, 2, params, tok)))).toEqual(sampledAlone);
      expect(apart.graphRuns.mixed).toBe(0);
    } finally {
      await apart.close();
    }
  });

  it('samplers with different weights decode in shared graph runs and draw the tokens they draw alone', async () => {
    const adapters = runs.map((r) => r.adapter);
    const noEos = { ...tok, eosTokenIds: [] };
    const promptTokens = tok.encode(prompt(TICKETS[0]![0]));
    const settings: SamplingParams[] = [
      { ...SAMPLING_DEFAULTS, temperature: 0, max_tokens: 12, seed: 0 },
      { ...SAMPLING_DEFAULTS, temperature: 1, max_tokens: 12, seed: 7 },
      { ...SAMPLING_DEFAULTS, temperature: 1, top_p: 0.95, max_tokens: 6, seed: 3 },
      { ...SAMPLING_DEFAULTS, temperature: 0.8, top_k: 20, max_tokens: 6, seed: 9 },
    ];
    for (const params of settings) {
      const alone: SampledSequence[][] = [];
      for (const a of adapters) alone.push(await sampleSequences(engine, a, promptTokens, 2, params, noEos));
      // Different weights draw different tokens, so the comparison below says something.
      expect(new Set(alone.map((s) => JSON.stringify(s.map((x) => x.tokens)))).size).toBeGreaterThan(1);
      const before = { ...engine.graphRuns };
      const together = await Promise.all(adapters.map((a) => sampleSequences(engine, a, promptTokens, 2, params, noEos)));
      const runsTaken = engine.graphRuns.total - before.total;
      // One prefill and one run per decode step for all four samplers, not four of each.
      expect(runsTaken).toBe(params.max_tokens);
      expect(engine.graphRuns.mixed - before.mixed).toBe(runsTaken);
      together.forEach((seqs, i) => {
        expect(seqs.map((s) => s.tokens)).toEqual(alone[i]!.map((s) => s.tokens));
        seqs.forEach((s, k) => {
          s.logprobs.forEach((lp, t) => {
            expect(Math.abs(lp - alone[i]![k]!.logprobs[t]!)).toBeLessThan(1e-4);
          });
        });
      });
    }
  });
});
