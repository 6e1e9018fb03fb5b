import { describe, expect, it, vi } from 'vitest';
import {
  EnginePool,
  freshAdapter,
  LoraTrainer,
  ModelEngine,
  parameters,
  sampleSequences,
  SAMPLING_DEFAULTS,
  type SamplingParams,
  type SequenceStart,
} from '../index.js';
import { prompt, TICKETS } from '../data/support-tickets.js';

// The engine's sampling: draws in the graph, prefills and decode batches, streams, stops (training: engine-training.test.ts).
const MODEL = 'Qwen/Qwen3.5-2B';
const pool = new EnginePool();
const engine = pool.get(MODEL);
const tok = pool.tokenizers.get(MODEL);
const greedy: SamplingParams = { ...SAMPLING_DEFAULTS, temperature: 0, max_tokens: 8, seed: 0 };

/** An adapter with non-zero B, as after some training. */
function perturbedTrainer(seed: number): LoraTrainer {
  const trainer = new LoraTrainer(engine, 8, 16, seed);
  for (const [name, p] of parameters(trainer.adapter)) if (name.endsWith('.B')) for (let i = 0; i < p.length; i++) p[i] = Math.sin(i * 0.37 + seed) * 0.02;
  return trainer;
}

describe('sampling', () => {
  it('reports, at temperature 1, the logprob the trainer computes for each sampled token (invariant 2)', async () => {
    const trainer = perturbedTrainer(3);
    const promptTokens = tok.encode(prompt(TICKETS[0]![0]));
    // 8 × 16 rows: the first 64 decode through x·W + (s·x·A)·B, the rest through the merged unembedding.
    const seqs = await sampleSequences(
      engine,
      trainer.adapter,
      promptTokens,
      8,
      { ...SAMPLING_DEFAULTS, max_tokens: 16, temperature: 1, seed: 5 },
      { ...tok, eosTokenIds: [] },
    );
    let worst = 0;
    for (const s of seqs) {
      const tokens = [...promptTokens, ...s.tokens];
      const targets = tokens.map((_, i) => (i >= promptTokens.length - 1 && i + 1 < tokens.length ? tokens[i + 1]! : -100));
      const { logprobs } = await trainer.forward([{ tokens, targetTokens: targets, weights: null, logprobs: null, advantages: null }], 'cross_entropy', {});
      s.logprobs.forEach((lp, k) => {
        worst = Math.max(worst, Math.abs(lp - logprobs[0]![promptTokens.length - 1 + k]!));
      });
    }
    expect(worst).toBeLessThan(1e-4);
  });

  it('is reproducible with a seed, and differs with another', async () => {
    const adapter = perturbedTrainer(4).adapter;
    const p = tok.encode('Hello there');
    // Both drawn inside the graph: top_p 0.95 by the nucleus's rule (two numbers a token), top_p 1 by the plain draw.
    for (const top_p of [0.95, 1]) {
      const params = { ...SAMPLING_DEFAULTS, max_tokens: 10, seed: 11, top_p };
      const a = await sampleSequences(engine, adapter, p, 3, params, tok);
      const b = await sampleSequences(engine, adapter, p, 3, params, tok);
      const c = await sampleSequences(engine, adapter, p, 3, { ...params, seed: 12 }, tok);
      expect(b).toEqual(a);
      expect(c.map((s) => s.tokens)).not.toEqual(a.map((s) => s.tokens));
      expect(new Set(a.map((s) => s.tokens.join())).size).toBeGreaterThan(1);
    }
  });

  it('draws inside the graph by the inverse CDF of the distribution, in whole and padded blocks', async () => {
    // 151669 = 329 × 461 cuts into whole blocks; 1009 is prime, so its last block is padded.
    const prime = new ModelEngine('draw-check', 1009, { dims: { dModel: 16, heads: 2, ffn: 16, layers: 1 }, thread: 'inline' });
    try {
      for (const [e, adapter] of [
        [engine, perturbedTrainer(3).adapter],
        [prime, freshAdapter(prime.sites, 4, 8, 1)],
      ] as const) {
        const p = [5, 17, 300, 2];
        const invT = 1 / 0.8;
        const { probs, logprobs } = await e.decode([p], adapter, null, invT);
        const us = Array.from({ length: 64 }, (_, i) => (i + 0.5) / 64);
        const drawn = (await e.startSequence(p, adapter, invT, us)).drawn!;
        const cum = new Float64Array(probs.length + 1);
        for (let v = 0; v < probs.length; v++) cum[v + 1] = cum[v]! + probs[v]!;
        drawn.forEach(({ token, logprob }, i) => {
          // The token's slice of the running sum holds u·total (to float32 rounding of the sums).
          expect(cum[token]! - 1e-4).toBeLessThanOrEqual(us[i]! * cum[probs.length]!);
          expect(cum[token + 1]! + 1e-4).toBeGreaterThanOrEqual(us[i]! * cum[probs.length]!);
          expect(Math.abs(logprob - logprobs[token]!)).toBeLessThan(1e-5);
        });
        // Greedy: the most likely token, whatever the number of draws.
        let best = 0;
        for (let v = 1; v < logprobs.length; v++) if (logprobs[v]! > logprobs[best]!) best = v;
        const greedyDraw = await e.startSequence(p, adapter, 1, [-1, -1]);
        const { logprobs: unscaled } = await e.decode([p], adapter, null, 1);
        expect(greedyDraw.drawn!.map((d) => d.token)).toEqual([best, best]);
        expect(greedyDraw.drawn![0]!.logprob).toBeCloseTo(unscaled[best]!, 5);
      }
    } finally {
      await prime.close();
    }
  });

  it('draws in the graph with a top-k or top-p cut: only kept candidates, each where the draw by definition puts it', async () => {
    const prime = new ModelEngine('draw-cut-check', 1009, { dims: { dModel: 16, heads: 2, ffn: 16, layers: 1 }, thread: 'inline' });
    try {
      for (const [e, adapter] of [
        [engine, perturbedTrainer(4).adapter],
        [prime, freshAdapter(prime.sites, 4, 8, 2)],
      ] as const) {
        const p = [5, 17, 300, 2];
        // Temperature 50 too: the probabilities then lie within a few of the nucleus's 1/128-octave buckets, so the
        // crossing bucket, the one sorted to find how many of its tokens are in, holds hundreds of them.
        for (const invT of [1 / 0.7, 1 / 50]) {
          const { probs, logprobs } = await e.decode([p], adapter, null, invT);
          // By definition: tokens by probability, the lower id first on ties; the first k (top_k 0: all); then the
          // fewest of those whose mass reaches top_p of theirs. A top-k draw runs over them sorted, a nucleus in id order.
          const order = Array.from(probs.keys()).sort((a, b) => probs[b]! - probs[a]! || a - b);
          const us = Array.from({ length: 40 }, (_, i) => (i + 0.5) / 40);
          for (const cut of [
            { topK: 50, topP: 1 },
            { topK: 50, topP: 0.5 },
            { topK: 7, topP: 0.9 },
            { topK: 200, topP: 0.3 },
            { topK: 0, topP: 0.95 },
            { topK: 0, topP: 0.5 },
            { topK: 0, topP: 0.1 },
          ]) {
            const candidates = cut.topK ? order.slice(0, cut.topK) : order;
            const total = candidates.reduce((sum, v) => sum + probs[v]!, 0);
            const kept: number[] = [];
            let mass = 0;
            for (const v of candidates) {
              kept.push(v);
              mass += probs[v]!;
              if (mass >= cut.topP * total) break;
            }
            const drawOrder = cut.topK ? kept : [...kept].sort((a, b) => a - b);
            const keptSet = new Set(kept);
            // Where a draw at u (and its retry) must fall, by the sampler's rule: a top-k draw is u·mass into the sorted
            // kept candidates. A nucleus draw takes the token at u of the whole distribution if it is kept, else the token
            // at the retry if that one is, and else draws again in the kept ones, in id order, at the retry's place among
            // the tokens outside, as a fraction of their mass.
            const place = (u: number, retry: number): { order: number[]; at: number; kept: boolean } => {
              if (cut.topK) return { order: drawOrder, at: u * mass, kept: true };
              const whole = probs.reduce((sum, q) => sum + q, 0);
              const at = (x: number) => {
                let run = 0;
                let keptBefore = 0;
                let token = 0;
                for (; token < probs.length - 1 && run + probs[token]! <= x * whole; token++) {
                  run += probs[token]!;
                  if (keptSet.has(token)) keptBefore += probs[token]!;
                }
                return { token, keptBefore };
              };
              if (keptSet.has(at(u).token)) return { order: Array.from(probs.keys()), at: u * whole, kept: true };
              const second = at(retry);
              if (keptSet.has(second.token)) return { order: Array.from(probs.keys()), at: retry * whole, kept: true };
              return { order: drawOrder, at: ((retry * whole - second.keptBefore) / (whole - mass)) * mass, kept: false };
            };
            const retryOf = (i: number) => us[(i * 7 + 3) % us.length]!;
            // The shared engine's distribution is near-uniform (an untrained 151,669-token model): where the cut falls
            // between probabilities equal to float32 rounding, only membership is checked, to that rounding. The small
            // engine's draws are checked exactly, their place in the running sum included.
            const exact = e === prime;
            const edge = probs[kept.at(-1)!]!;
            let redrawn = 0;
            const check = (token: number, logprob: number, u: number, retry: number) => {
              const label = `token ${token} (top_k ${cut.topK}, top_p ${cut.topP})`;
              if (!exact) {
                expect(probs[token]!, `${label} is below the kept candidates`).toBeGreaterThanOrEqual(edge * (1 - 1e-5));
              } else {
                expect(keptSet.has(token), `${label} is not among the kept candidates`).toBe(true);
                const { order, at: t, kept: stayed } = place(u, retry);
                if (!stayed) redrawn++;
                const at = order.indexOf(token);
                const before = order.slice(0, at).reduce((sum, v) => sum + probs[v]!, 0);
                expect(before - 1e-5, label).toBeLessThanOrEqual(t);
                expect(before + probs[token]! + 1e-5, label).toBeGreaterThanOrEqual(t);
              }
              expect(Math.abs(logprob - logprobs[token]!)).toBeLessThan(1e-5);
            };
            const retries = cut.topK ? null : us.map((_, i) => retryOf(i));
            const drawn = (await e.startSequence(p, adapter, invT, us, cut, retries)).drawn!;
            drawn.forEach(({ token, logprob }, i) => {
              check(token, logprob, us[i]!, retryOf(i));
            });
            if (exact) expect(new Set(drawn.map((d) => d.token)).size).toBeGreaterThan(Math.min(kept.length, 40) * 0.3);
            // A decode step of rows from two requests with the same kind (and k), each with its own top_p, in one run.
            const start = await e.startSequence(p.slice(0, 3), adapter, invT, [0.5], cut, [0.5]);
            const [mine, other] = await Promise.all([
              e.decodeRows(
                us.slice(0, 8).map((u, i) => ({ token: 2, cache: start.cache, draw: u, retry: retryOf(i) })),
                adapter,
                invT,
                cut,
              ),
              e.decodeRows([{ token: 2, cache: start.cache, draw: 0.99, retry: 0.5 }], adapter, invT, { ...cut, topP: 0.999 }),
            ]);
            mine.forEach((step, i) => {
              check(step.drawn!.token, step.drawn!.logprob, us[i]!, retryOf(i));
            });
            expect(probs[other[0]!.drawn!.token]!).toBeGreaterThanOrEqual(probs[candidates.at(-1)!]! * (1 - 1e-5));
            // The small nucleus cuts leave much of the mass out: some draws of those have gone through the redraw.
            if (exact && !cut.topK && cut.topP <= 0.5) expect(redrawn, `draws redrawn at top_p ${cut.topP}`).toBeGreaterThan(0);
          }
        }
      }
    } finally {
      await prime.close();
    }
  });

  it('decodes after long caches on sessions released after use, and says so to the pool (memory goes back)', async () => {
    const pool = new EnginePool();
    const e = pool.get('Qwen/Qwen3-0.6B');
    try {
      const told = vi.fn();
      pool.onLongSequence(told);
      const runs = vi.spyOn((e as unknown as { runner: { run: (r: { kind: string; heavy?: boolean }) => unknown } }).runner, 'run');
      const adapter = freshAdapter(e.sites, 4, 8, 1);
      const short = await e.startSequence([1, 2, 3], adapter, 1, [0.5]);
      await e.decodeRows([{ token: 4, cache: short.cache, draw: 0.5 }], adapter, 1);
      expect(runs.mock.calls.map(([r]) => r.heavy)).toEqual([false, false]);
      expect(told).not.toHaveBeenCalled();
      runs.mockClear();
      // 1,100 cached positions: 1,100 × 2 layers × keys and values × 64 floats, above 1 MB.
      const long = await e.startSequence(
        Array.from({ length: 1100 }, (_, i) => 1 + (i % 500)),
        adapter,
        1,
        [0.5],
      );
      await e.decodeRows([{ token: 4, cache: long.cache, draw: 0.5 }], adapter, 1);
      expect(runs.mock.calls.at(-1)![0].heavy).toBe(true);
      expect(told).toHaveBeenCalled();
    } finally {
      await pool.close();
    }
  });

  it('prefills together the next prompts of clients whose samples ended together, though they come back in turns of their own', async () => {
    const adapter = perturbedTrainer(7).adapter;
    const prompts = [[5, 17, 300, 2], [9, 8, 7], [1000, 2000, 3000, 4000], [42]];
    const runs = vi.spyOn((engine as unknown as { runner: { run: () => unknown } }).runner, 'run');
    try {
      // Four samples end in one step; each client sends its next prompt when its answer has reached it (a few
      // turns of the event loop apart, as HTTP answers reach their clients one after another).
      const ends = prompts.map(() => engine.openStream());
      for (const end of ends) end();
      await Promise.all(
        prompts.map(async (p, i) => {
          for (let turn = 0; turn < i; turn++) await new Promise((r) => setImmediate(r));
          return engine.startSequence(p, adapter, 1, [0.5]);
        }),
      );
      expect(runs).toHaveBeenCalledTimes(1);
    } finally {
      runs.mockRestore();
    }
  });

  it('waits for a client that never came back once only: a lone client looping after it is not held up', async () => {
    const adapter = perturbedTrainer(8).adapter;
    const waits = vi.spyOn(globalThis, 'setTimeout');
    const millisecondsWaited = () => waits.mock.calls.filter(([, ms]) => ms === 1).length;
    try {
      const gone = engine.openStream();
      let mine = engine.openStream();
      gone();
      mine();
      // Its own next prompt could be taken for the one that left: the prefill waits (3 ms at most) and gives up.
      await engine.startSequence([5, 17, 300, 2], adapter, 1, [0.5]);
      expect(millisecondsWaited()).toBeLessThanOrEqual(3);
      waits.mockClear();
      for (let i = 0; i < 4; i++) {
        mine = engine.openStream();
        mine();
        await engine.startSequence([5, 17, 300, 2], adapter, 1, [0.5]);
      }
      expect(millisecondsWaited()).toBe(0);
    } finally {
      waits.mockRestore();
    }
  });

  it('prefills prompts of different lengths that arrive together in one graph run, as if each ran alone', async () => {
    const adapter = perturbedTrainer(6).adapter;
    const prompts = [
      [5, 17, 300, 2],
      [9, 8, 7, 6, 5, 4, 3, 2, 1],
      [1000, 2000, 3000, 4000, 5000, 6000],
    ];
    const draws = [[0.1, 0.7], [0.5], [0.9, 0.2, 0.4]];
    for (const mode of ['draw', 'greedy', 'distribution'] as const) {
      const args = (i: number) => (mode === 'draw' ? draws[i]! : mode === 'greedy' ? [-1] : null);
      const alone: SequenceStart[] = [];
      for (let i = 0; i < prompts.length; i++) alone.push(await engine.startSequence(prompts[i]!, adapter, 1.25, args(i)));
      const runs = vi.spyOn((engine as unknown as { runner: { run: () => unknown } }).runner, 'run');
      const together = await Promise.all(prompts.map((p, i) => engine.startSequence(p, adapter, 1.25, args(i))));
      expect(runs).toHaveBeenCalledTimes(1);
      runs.mockRestore();
      together.forEach((t, i) => {
        const a = alone[i]!;
        expect(t.cache.length).toBe(prompts[i]!.length);
        t.cache.past.forEach((layer, l) => {
          expect(layer.length).toBe(a.cache.past[l]!.length);
          layer.forEach((x, k) => {
            expect(Math.abs(x - a.cache.past[l]![k]!)).toBeLessThan(1e-5);
          });
        });
        if (mode === 'distribution') {
          let worst = 0;
          t.logprobs!.forEach((x, v) => {
            worst = Math.max(worst, Math.abs(x - a.logprobs![v]!));
          });
          expect(worst).toBeLessThan(1e-4);
        } else {
          expect(t.drawn!.map((d) => d.token)).toEqual(a.drawn!.map((d) => d.token));
          t.drawn!.forEach((d, k) => {
            expect(Math.abs(d.logprob - a.drawn![k]!.logprob)).toBeLessThan(1e-5);
          });
        }
      });
    }
  });

  it('packs the unembedding of an adapter version that keeps decoding in batches into its own session, drawing the same tokens', async () => {
    const small = new ModelEngine('pack-check', 1009, { dims: { dModel: 16, heads: 2, ffn: 16, layers: 1 }, thread: 'inline', packAfterBatchedRows: 8 });
    try {
      const adapter = freshAdapter(small.sites, 4, 8, 2);
      for (const t of adapter.tensors.values()) for (let i = 0; i < t.B.length; i++) t.B[i] = Math.cos(i * 0.61) * 0.05;
      const { cache } = await small.startSequence([5, 17, 300, 2], adapter, 1, null);
      const step = () =>
        small.decodeRows(
          [0.2, 0.8, 0.5].map((draw) => ({ token: 7, cache, draw })),
          adapter,
          1.1,
        );
      // Internals, read only: how many packed sessions the graph runner holds.
      const packedSessions = async () =>
        (await (small as unknown as { runner: { get(): Promise<{ packed: Map<string, unknown> }> } }).runner.get()).packed.size;
      const first = await step();
      // 3 rows a step: merged from the 22nd step on (past 64 rows with the prefill's), packed once 8 rows
      // more have been decoded merged, at the 24th.
      for (let i = 0; i < 22; i++) await step();
      expect(await packedSessions()).toBe(0);
      await step();
      expect(await packedSessions()).toBe(1);
      const packed = await step();
      expect(packed.map((r) => r.drawn!.token)).toEqual(first.map((r) => r.drawn!.token));
      packed.forEach((r, i) => {
        expect(Math.abs(r.drawn!.logprob - first[i]!.drawn!.logprob)).toBeLessThan(1e-5);
      });
    } finally {
      await small.close();
    }
  });

  it('top_k = 1 and a tiny top_p both sample the greedy tokens', async () => {
    const adapter = perturbedTrainer(5).adapter;
    const p = tok.encode('The quick brown fox');
    const [g] = await sampleSequences(engine, adapter, p, 1, greedy, tok);
    const [k1] = await sampleSequences(engine, adapter, p, 1, { ...greedy, temperature: 0.7, top_k: 1, seed: 1 }, tok);
    const [p0] = await sampleSequences(engine, adapter, p, 1, { ...greedy, temperature: 1.3, top_p: 1e-9, seed: 2 }, tok);
    expect(k1!.tokens).toEqual(g!.tokens);
    expect(p0!.tokens).toEqual(g!.tokens);
  });

  it('stops on stop token ids and stop strings with stop_reason "stop", else "length"', async () => {
    const adapter = perturbedTrainer(6).adapter;
    const p = tok.encode('Once upon a time');
    const [free] = await sampleSequences(engine, adapter, p, 1, { ...greedy, max_tokens: 6 }, { ...tok, eosTokenIds: [] });
    expect(free!.stop_reason).toBe('length');
    expect(free!.tokens).toHaveLength(6);
    const [byId] = await sampleSequences(engine, adapter, p, 1, { ...greedy, stop: [free!.tokens[2]!] }, { ...tok, eosTokenIds: [] });
    expect(byId!.tokens.length).toBeLessThanOrEqual(3);
    expect(byId!.stop_reason).toBe('stop');
    const text = tok.decode(free!.tokens.slice(0, 4));
    const stopString = text.slice(-2);
    const [byText] = await sampleSequences(engine, adapter, p, 1, { ...greedy, stop: [stopString] }, { ...tok, eosTokenIds: [] });
    expect(byText!.stop_reason).toBe('stop');
    expect(tok.decode(byText!.tokens)).toContain(stopString);
    expect(byText!.tokens.length).toBeLessThanOrEqual(4);
  });

  it('gives top-k prompt logprobs consistent with the target logprobs', async () => {
    const adapter = perturbedTrainer(7).adapter;
    const tokens = tok.encode('Label: access');
    const { logprobs, top } = await engine.topk([{ tokens, targets: tokens.slice(1).concat(0) }], adapter, 5);
    for (let t = 0; t < tokens.length - 1; t++) {
      const row = top[0]![t]!;
      expect(row.ids).toHaveLength(5);
      expect([...row.logprobs].sort((a, b) => b - a)).toEqual(row.logprobs);
      expect(logprobs[0]![t]!).toBeLessThanOrEqual(row.logprobs[0]! + 1e-6);
      const hit = row.ids.indexOf(tokens[t + 1]!);
      if (hit >= 0) expect(row.logprobs[hit]).toBeCloseTo(logprobs[0]![t]!, 5);
    }
  });
});
