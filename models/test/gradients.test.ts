import { describe, expect, it } from 'vitest';
import { ModelEngine } from '../engine.js';
import { computeLoss, LOSS_CONFIG_DEFAULTS, LOSS_NAMES, type LossName } from '../losses.js';
import { parameters, touchAdapter } from '../lora.js';
import { LoraTrainer, type TrainingDatum } from '../trainer.js';

/**
 * Invariant 1: the gradient the backward graph returns, for every loss and
 * every LoRA tensor, matches a finite-difference derivative of the loss.
 *
 * The check is a directional derivative along a fixed direction per tensor,
 * by central differences at ε = 0.02 and 0.01 combined by Richardson
 * extrapolation (truncation error O(ε⁴)). In float32 the remaining
 * round-off is about 1e-7·|L|/ε ≈ 1e-5 relative; the tolerance is 1e-3
 * relative (floor 1e-3 absolute), well above that and far below any real
 * error (a wrong rule is off by O(1)).
 */
// The unembedding's rank capped below the run's 4, so that a site with a rank of its own is checked too.
const engine = new ModelEngine('gradient-check-model', 64, { dims: { dModel: 16, heads: 2, ffn: 32, layers: 2 }, unembeddingRank: 2 });

async function checkLoss(loss: LossName): Promise<string[]> {
  const trainer = new LoraTrainer(engine, 4, 8, 7);
  // Non-zero B everywhere, so every tensor's gradient is exercised (a fresh adapter has B = 0, which zeroes dA).
  for (const p of parameters(trainer.adapter).values()) for (let i = 0; i < p.length; i++) if (p[i] === 0) p[i] = Math.sin(i * 1.37 + p.length) * 0.05;
  const tokens = [
    [3, 17, 42, 9, 33, 5],
    [11, 2, 60, 8],
  ];
  // The second datum has no target_tokens: next-token for cross_entropy, token-aligned for the policy losses
  // (position 0 scores nothing, so its advantage is 0).
  const data: TrainingDatum[] = tokens.map((t, k) => ({
    tokens: t,
    targetTokens: k === 0 ? [17, 42, -100, 33, 5, 1] : null,
    weights: Float32Array.from(t, (_, i) => 0.5 + (i % 3) * 0.5),
    logprobs: null,
    advantages: Float32Array.from(t, (_, i) => (k === 1 && i === 0 ? 0 : [1, -0.5, 0, 2, -1.5, 0.7][i % 6]!)),
  }));
  const config = { ...LOSS_CONFIG_DEFAULTS[loss] };
  if (loss !== 'cross_entropy') {
    // Sampler logprobs set so each ratio sits clearly inside or outside the clip ranges: no kink within ε.
    // The learner's logprobs come from a pass of the same loss, so each datum's are in its own alignment.
    const base = await trainer.forward(
      data.map((d) => ({ ...d, logprobs: new Float32Array(d.tokens.length) })),
      loss,
      config,
    );
    data.forEach((d, k) => {
      d.logprobs = Float32Array.from(base.logprobs[k]!, (lp, i) => lp - [-0.6, 0.05, 0.6, 2.0][i % 4]!);
    });
  }
  await trainer.forwardBackward(data, loss, config);
  const grads = trainer.accumulatedGradients()!;
  let lossAt = async () => (await trainer.forward(data, loss, config)).loss;
  if (loss === 'cispo') {
    // CISPO's gradient is defined with the clipped ratio held constant (stop-gradient): differentiate that surrogate.
    const at0 = await trainer.forward(data, loss, config);
    const weightsAt0 = data.map((d, k) =>
      Float32Array.from(at0.logprobs[k]!, (lp, t) =>
        Math.min(config.clip_high_threshold!, Math.max(config.clip_low_threshold!, Math.exp(lp - d.logprobs![t]!))),
      ),
    );
    lossAt = async () => {
      const { logprobs } = await trainer.forward(data, loss, config);
      let total = 0;
      let weight = 0;
      data.forEach((d, k) => {
        d.tokens.forEach((_, t) => {
          const A = d.advantages![t]!;
          const counted = d.targetTokens !== null ? d.targetTokens[t] !== -100 : t >= 1;
          if (!counted || A === 0) return;
          total += d.weights![t]! * -weightsAt0[k]![t]! * logprobs[k]![t]! * A;
          weight += d.weights![t]!;
        });
      });
      return total / weight;
    };
  }
  const problems: string[] = [];
  for (const [name, p] of parameters(trainer.adapter)) {
    const g = grads.get(name)!;
    const dir = Float32Array.from(p, (_, i) => Math.cos(i * 0.71 + name.length));
    const orig = p.slice();
    const central = async (eps: number) => {
      // In-place edits must bump the adapter's version: the engine's worker caches tensors per version.
      for (let i = 0; i < p.length; i++) p[i] = orig[i]! + eps * dir[i]!;
      touchAdapter(trainer.adapter);
      const up = await lossAt();
      for (let i = 0; i < p.length; i++) p[i] = orig[i]! - eps * dir[i]!;
      touchAdapter(trainer.adapter);
      const down = await lossAt();
      p.set(orig);
      touchAdapter(trainer.adapter);
      return (up - down) / (2 * eps);
    };
    const fd = (4 * (await central(0.01)) - (await central(0.02))) / 3;
    let analytic = 0;
    for (let i = 0; i < p.length; i++) analytic += g[i]! * dir[i]!;
    if (Math.abs(fd - analytic) > 1e-3 * Math.max(1, Math.abs(fd))) problems.push(`${loss} ${name}: finite difference ${fd}, backward graph ${analytic}`);
  }
  return problems;
}

describe('gradients match finite differences', () => {
  for (const loss of LOSS_NAMES) {
    it(`${loss}: every LoRA tensor`, async () => {
      expect(await checkLoss(loss)).toEqual([]);
    });
  }
});

describe('loss functions', () => {
  const datum = (n: number) => ({
    counted: new Uint8Array(n).fill(1),
    weights: null,
    samplerLogprobs: new Float32Array(n).fill(-1),
    advantages: new Float32Array(n).fill(1),
  });

  it('cross_entropy is the weighted mean of -logprob over counted positions; sum reduction is the sum', () => {
    const d = { counted: Uint8Array.from([1, 1, 0]), weights: Float32Array.from([1, 3, 5]), samplerLogprobs: null, advantages: null };
    const lp = [Float32Array.from([-1, -2, -9])];
    const mean = computeLoss('cross_entropy', {}, [d], lp, 'mean');
    expect(mean.loss).toBeCloseTo((1 * 1 + 3 * 2) / 4, 6);
    expect(mean.metrics.active_tokens).toBe(2);
    expect(Array.from(mean.cotangents[0]!)).toEqual([-0.25, -0.75, 0]);
    expect(computeLoss('cross_entropy', {}, [d], lp, 'sum').loss).toBeCloseTo(7, 6);
  });

  it('ratio losses count positions with a non-zero advantage and report ratio, clipping and KL', () => {
    const d = { ...datum(3), advantages: Float32Array.from([1, 0, -1]) };
    const lp = [Float32Array.from([-1 + Math.log(1.5), -1, -1])];
    const ppo = computeLoss('ppo', LOSS_CONFIG_DEFAULTS.ppo, [d], lp);
    expect(ppo.metrics.active_tokens).toBe(2);
    // Position 0: r = 1.5 > 1.2 with A > 0, clipped: -1.2; position 2: r = 1, A = -1: +1.
    expect(ppo.loss).toBeCloseTo((-1.2 + 1) / 2, 5);
    expect(ppo.cotangents[0]![0]).toBe(0);
    expect(ppo.metrics.clip_fraction).toBeCloseTo(0.5, 6);
    expect(ppo.metrics.ratio_mean).toBeCloseTo(1.25, 5);
    expect(ppo.metrics.kl_sampler_trainer).toBeGreaterThan(0);
    const same = computeLoss('importance_sampling', {}, [datum(2)], [Float32Array.from([-1, -1])]);
    expect(same.metrics.kl_sampler_trainer).toBeCloseTo(0, 9);
    expect(same.loss).toBeCloseTo(-1, 6);
  });
});
