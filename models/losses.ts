/**
 * Loss functions over per-position logprobs. Each returns the loss, its
 * metrics and the cotangents c_t = dLoss/dlogprob_t; the engine's one
 * backward graph turns any cotangents into LoRA gradients.
 *
 * Notation per position: lp = learner logprob of the target, q = sampler
 * logprob sent as `logprobs`, A = advantage, r = exp(lp - q), w = weight.
 */
export type LossName = 'cross_entropy' | 'importance_sampling' | 'ppo' | 'cispo' | 'dro' | 'dppo';
export const LOSS_NAMES: LossName[] = ['cross_entropy', 'importance_sampling', 'ppo', 'cispo', 'dro', 'dppo'];

/** Config keys and defaults of each loss; a loss with none accepts no config. */
export const LOSS_CONFIG_DEFAULTS: Record<LossName, Record<string, number>> = {
  cross_entropy: {},
  importance_sampling: {},
  ppo: { clip_low_threshold: 0.8, clip_high_threshold: 1.2 },
  cispo: { clip_low_threshold: 0.0, clip_high_threshold: 4.0 },
  dro: { beta: 0.05 },
  // PPO whose trust region is a band on the log-ratio lp - q: [-delta_low, +delta_high].
  dppo: { delta_low: 0.2, delta_high: 0.2 },
};

/** A bad loss request, naming the field at fault. */
export class LossInputError extends Error {
  constructor(
    readonly field: string,
    message: string,
  ) {
    super(message);
  }
}

export interface LossDatum {
  /** Positions whose target is -100 (or whose weight is 0) do not count. */
  counted: Uint8Array;
  weights: Float32Array | null;
  /** Sampler logprobs (`loss_fn_inputs.logprobs`): ratio losses only. */
  samplerLogprobs: Float32Array | null;
  advantages: Float32Array | null;
}

export interface LossResult {
  loss: number;
  cotangents: Float32Array[];
  metrics: Record<string, number>;
}

export type Reduction = 'mean' | 'sum';

export function isLossName(name: string): name is LossName {
  return (LOSS_NAMES as string[]).includes(name);
}

/** Merges a request's `loss_fn_config` over the defaults; unknown keys and configs for losses that take none are errors. */
export function resolveLossConfig(name: LossName, config: Record<string, unknown> | null | undefined): Record<string, number> {
  const defaults = LOSS_CONFIG_DEFAULTS[name];
  const keys = Object.keys(defaults);
  const given = config ?? {};
  if (!keys.length && Object.keys(given).length) {
    throw new LossInputError('loss_fn_config', `loss_fn '${name}' takes no loss_fn_config; remove it (got keys: ${Object.keys(given).join(', ')}).`);
  }
  const out = { ...defaults };
  for (const [k, v] of Object.entries(given)) {
    if (!keys.includes(k))
      throw new LossInputError(`loss_fn_config.${k}`, `loss_fn_config.${k} is not a setting of '${name}'; its settings are ${keys.join(', ')}.`);
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new LossInputError(`loss_fn_config.${k}`, `loss_fn_config.${k} must be a finite number.`);
    out[k] = v;
  }
  const lo = out.clip_low_threshold ?? out.delta_low;
  const hi = out.clip_high_threshold ?? out.delta_high;
  if (name === 'ppo' || name === 'cispo') {
    if (lo! < 0 || hi! <= lo!) throw new LossInputError('loss_fn_config', `'${name}' needs 0 <= clip_low_threshold < clip_high_threshold (got ${lo}, ${hi}).`);
  }
  if (name === 'dppo' && (lo! < 0 || hi! < 0))
    throw new LossInputError('loss_fn_config', `'dppo' needs delta_low >= 0 and delta_high >= 0 (got ${lo}, ${hi}).`);
  if (name === 'dro' && out.beta! < 0) throw new LossInputError('loss_fn_config.beta', `'dro' needs beta >= 0 (got ${out.beta}).`);
  return out;
}

/** Whether the loss's inputs need sampler logprobs and advantages. */
export function isRatioLoss(name: LossName): boolean {
  return name !== 'cross_entropy';
}

/** Cross-entropy's cotangents do not depend on the logprobs, so the forward pass can be skipped. */
export function cotangentsNeedLogprobs(name: LossName): boolean {
  return name !== 'cross_entropy';
}

interface Term {
  /** Per-position loss. */
  value: number;
  /** d value / d lp. */
  grad: number;
  clipped?: boolean;
}

type TermFn = (lp: number, q: number, A: number, cfg: Record<string, number>) => Term;

const clip = (x: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, x));

/** The per-position loss of each function and its derivative: the table to read when checking a formula. */
export const TERMS: Record<LossName, TermFn> = {
  cross_entropy: (lp) => ({ value: -lp, grad: -1 }),
  importance_sampling: (lp, q, A) => {
    const r = Math.exp(lp - q);
    return { value: -r * A, grad: -r * A };
  },
  // -min(r·A, clip(r)·A): no gradient where the clipped branch is the smaller one.
  ppo: (lp, q, A, c) => {
    const r = Math.exp(lp - q);
    const rc = clip(r, c.clip_low_threshold!, c.clip_high_threshold!);
    const clipped = rc * A < r * A;
    return { value: -Math.min(r * A, rc * A), grad: clipped ? 0 : -r * A, clipped: rc !== r };
  },
  // -stopgrad(clip(r))·lp·A
  cispo: (lp, q, A, c) => {
    const r = Math.exp(lp - q);
    const rc = clip(r, c.clip_low_threshold!, c.clip_high_threshold!);
    return { value: -rc * lp * A, grad: -rc * A, clipped: rc !== r };
  },
  // -(lp·A - β/2·(lp - q)²)
  dro: (lp, q, A, c) => ({ value: -(lp * A - 0.5 * c.beta! * (lp - q) ** 2), grad: -(A - c.beta! * (lp - q)) }),
  // PPO with the ratio clipped to [e^-delta_low, e^delta_high]: a band on lp - q.
  dppo: (lp, q, A, c) => {
    const r = Math.exp(lp - q);
    const rc = Math.exp(clip(lp - q, -c.delta_low!, c.delta_high!));
    const clipped = rc * A < r * A;
    return { value: -Math.min(r * A, rc * A), grad: clipped ? 0 : -r * A, clipped: rc !== r };
  },
};

/** Whether position t of a datum counts in the loss (and in `active_tokens`): counted, and for a ratio loss a non-zero advantage. */
export function isActive(name: LossName, d: LossDatum, t: number): boolean {
  return d.counted[t] === 1 && (!isRatioLoss(name) || (d.advantages?.[t] ?? 0) !== 0);
}

/**
 * Loss over a batch. `mean` (Loops): the weighted mean over counted
 * positions, gradients of that mean; `sum` (Tinker): the weighted sum.
 * For ratio losses a position counts where its advantage is non-zero.
 */
export function computeLoss(
  name: LossName,
  config: Record<string, number>,
  data: LossDatum[],
  logprobs: Float32Array[],
  reduction: Reduction = 'mean',
): LossResult {
  const term = TERMS[name];
  const ratio = isRatioLoss(name);
  let total = 0;
  let weightSum = 0;
  let active = 0;
  let ratioSum = 0;
  let clippedCount = 0;
  let klSum = 0;
  const grads = data.map((d) => new Float32Array(d.counted.length));
  data.forEach((d, i) => {
    const lp = logprobs[i]!;
    for (let t = 0; t < d.counted.length; t++) {
      if (!isActive(name, d, t)) continue;
      const A = d.advantages?.[t] ?? 0;
      const w = d.weights?.[t] ?? 1;
      const q = d.samplerLogprobs?.[t] ?? 0;
      const { value, grad, clipped } = term(lp[t]!, q, A, config);
      total += w * value;
      grads[i]![t] = w * grad;
      weightSum += w;
      active++;
      if (ratio) {
        const r = Math.exp(lp[t]! - q);
        ratioSum += r;
        klSum += r - 1 - Math.log(r);
        if (clipped) clippedCount++;
      }
    }
  });
  const divisor = reduction === 'mean' && weightSum > 0 ? weightSum : 1;
  for (const g of grads) for (let t = 0; t < g.length; t++) g[t]! /= divisor;
  const metrics: Record<string, number> = { loss: total / divisor, active_tokens: active };
  if (ratio) {
    metrics.ratio_mean = active ? ratioSum / active : 0;
    metrics.kl_sampler_trainer = active ? klSum / active : 0;
    if (name === 'ppo' || name === 'cispo' || name === 'dppo') metrics.clip_fraction = active ? clippedCount / active : 0;
  }
  return { loss: total / divisor, cotangents: grads, metrics };
}
