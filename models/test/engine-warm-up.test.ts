import { describe, expect, it } from 'vitest';
import { prompt, TICKETS } from '../data/support-tickets.js';
import { WARM_UP_KINDS } from '../engine-warm-up.js';
import { EnginePool, LoraTrainer, sampleSequences, SAMPLING_DEFAULTS, type GraphBuildEvent, type SamplingParams } from '../index.js';

// Issue 29: a client sent the moment the server listens finds every graph of the guides' flows built, and never
// waits behind more than one warm-up run.
const MODEL = 'Qwen/Qwen3.5-2B';

describe("an engine's warm-up", () => {
  it("builds every graph kind the guides' flows use: evals and steps short and long, every sampling kind, top-k logprobs, the policy losses", async () => {
    const pool = new EnginePool();
    const engine = pool.get(MODEL);
    try {
      const warmed: GraphBuildEvent[] = [];
      engine.onGraphBuild = (e) => warmed.push(e);
      await engine.warmUp();
      // The sessions built ahead on the worker are the ones the steps run, in the order they run them.
      expect(warmed.filter((e) => e.phase === 'start').map((e) => e.kind)).toEqual(WARM_UP_KINDS);
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

  it("lets a client's call go first: one sent as it begins waits behind one warm-up run at most", async () => {
    const pool = new EnginePool();
    const engine = pool.get(MODEL);
    try {
      let warmedUp = false;
      const warming = engine.warmUp().then(() => {
        warmedUp = true;
      });
      const trainer = new LoraTrainer(engine, 16, 32, 4);
      const tokens = [5, 6, 7, 8, 9];
      await trainer.forward([{ tokens, targetTokens: [6, 7, 8, 9, -100], weights: null, logprobs: null, advantages: null }], 'cross_entropy', {});
      // The warm-up's first run (already under way), then the client's.
      expect(engine.graphRuns.total).toBeLessThanOrEqual(2);
      expect(warmedUp).toBe(false);
      await warming;
    } finally {
      await pool.close();
    }
  }, 120_000);
});
