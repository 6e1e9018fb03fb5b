import { describe, expect, it } from 'vitest';
import { prompt, TICKETS } from '../data/support-tickets.js';
import { WARM_UP_KINDS } from '../engine-warm-up.js';
import { EnginePool, LoraTrainer, sampleSequences, SAMPLING_DEFAULTS, type GraphBuildEvent, type SamplingParams } from '../index.js';

// Issue 29: a client sent the moment the server listens finds every graph of the guides' flows built, and its
// calls go in between the warm-up's builds rather than after them.
const MODEL = 'Qwen/Qwen3.5-2B';

describe("an engine's warm-up", () => {
  it("builds every graph kind the guides' flows use: evals and steps short and long, every sampling kind, top-k logprobs, the policy losses", async () => {
    const pool = new EnginePool();
    const engine = pool.get(MODEL);
    try {
      const warmed: GraphBuildEvent[] = [];
      engine.onGraphBuild = (e) => warmed.push(e);
      await engine.warmUp();
      // Each kind built ahead on the worker, told once with its build's time, and none of them run.
      expect(warmed.filter((e) => e.phase === 'start').map((e) => e.kind)).toEqual(WARM_UP_KINDS);
      expect(warmed.filter((e) => e.phase === 'done' && e.ahead && (e.ms ?? -1) >= 0).map((e) => e.kind)).toEqual(WARM_UP_KINDS);
      expect(engine.graphRuns.total).toBe(0);
      const built: GraphBuildEvent[] = [];
      engine.onGraphBuild = (e) => built.push(e);
      const tok = pool.tokenizers.get(MODEL);
      const tokens = tok.encode(prompt(TICKETS[0]![0]));
      const trainer = new LoraTrainer(engine, 16, 32, 3);
      const codec = pool.sampleCodec(MODEL);
      const kinds: Partial<SamplingParams>[] = [
        { temperature: 0, stop: ['\n'] },
        { temperature: 1 },
        { temperature: 0.8, stop: ['\n'] },
        { temperature: 1, top_p: 0.9 },
        { temperature: 1, top_k: 20 },
      ];
      for (const params of kinds)
        for (const n of [1, 4]) await sampleSequences(engine, trainer.adapter, tokens, n, { ...SAMPLING_DEFAULTS, max_tokens: 6, seed: 1, ...params }, codec);
      const datum = { tokens, targetTokens: [...tokens.slice(1), -100], weights: null, logprobs: null, advantages: null };
      const short = { ...datum, tokens: tokens.slice(0, 8), targetTokens: [...tokens.slice(1, 8), -100] };
      await trainer.forward([datum, datum, datum, datum], 'cross_entropy', {});
      await trainer.forward([short], 'cross_entropy', {});
      await trainer.forwardBackward([datum, datum], 'cross_entropy', {});
      await trainer.forwardBackward([short], 'cross_entropy', {});
      await trainer.forward([short], 'cross_entropy', {}, { topK: 4 });
      const rollout = {
        tokens,
        targetTokens: null,
        weights: null,
        logprobs: Float32Array.from(tokens, (_, i) => (i ? -1 : 0)),
        advantages: Float32Array.from(tokens, (_, i) => (i ? 0.5 : 0)),
      };
      for (const loss of ['importance_sampling', 'ppo', 'cispo', 'dro', 'dppo'] as const) await trainer.forward([rollout], loss, {});
      await trainer.forwardBackward([rollout, rollout], 'ppo', {});
      expect(built.map((e) => `${e.kind}${e.mixed ? ':mixed' : ''}`)).toEqual([]);
    } finally {
      await pool.close();
    }
  }, 120_000);

  it("lets a client's call in between its builds: one sent as it begins is answered before the warm-up ends, and told of once", async () => {
    const pool = new EnginePool();
    const engine = pool.get(MODEL);
    try {
      const told: GraphBuildEvent[] = [];
      engine.onGraphBuild = (e) => told.push(e);
      let warmedUp = false;
      const warming = engine.warmUp().then(() => {
        warmedUp = true;
      });
      const trainer = new LoraTrainer(engine, 16, 32, 4);
      const tokens = [5, 6, 7, 8, 9];
      // The warm-up's last kind first: the client's run builds it itself, and the warm-up tells of it no more.
      await trainer.forward([{ tokens, targetTokens: [6, 7, 8, 9, -100], weights: null, logprobs: null, advantages: null }], 'cross_entropy', {}, { topK: 4 });
      expect(warmedUp).toBe(false);
      await warming;
      expect(engine.graphRuns.total).toBe(1);
      const topk = told.filter((e) => e.kind === 'topk');
      expect(topk.map((e) => [e.phase, e.ahead ?? false])).toEqual([
        ['start', false],
        ['done', false],
      ]);
      expect(told.filter((e) => e.phase === 'start').map((e) => e.kind)).toEqual(['topk', ...WARM_UP_KINDS.filter((k) => k !== 'topk')]);
    } finally {
      await pool.close();
    }
  }, 120_000);

  it('stops before its next build when its signal is aborted, and a closing engine does not wait for the rest', async () => {
    const pool = new EnginePool();
    const engine = pool.get(MODEL);
    try {
      const stopping = new AbortController();
      const started: string[] = [];
      engine.onGraphBuild = (e) => {
        if (e.phase === 'start') started.push(e.kind);
        if (e.phase === 'done' && e.kind === 'forward') stopping.abort();
      };
      await engine.warmUp(stopping.signal);
      expect(started.length).toBeLessThan(WARM_UP_KINDS.length);
      expect(started[0]).toBe('forward');
      // Another warm-up, cut short by the engine's close: the close ends it before all seven are built.
      const other = pool.get('Qwen/Qwen3-0.6B');
      const built: string[] = [];
      let firstBuilt = () => {};
      other.onGraphBuild = (e) => {
        if (e.phase !== 'done') return;
        built.push(e.kind);
        firstBuilt();
      };
      const warming = other.warmUp();
      await new Promise<void>((resolve) => {
        firstBuilt = resolve;
      });
      await other.close();
      await warming;
      expect(built.length).toBeLessThan(WARM_UP_KINDS.length);
    } finally {
      await pool.close();
    }
  }, 120_000);
});
