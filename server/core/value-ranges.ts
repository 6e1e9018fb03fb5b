import { isRatioLoss, type LossName, type TrainingDatum } from '../../models/index.js';
import { invalid } from './errors.js';

/**
 * The ranges numbers must be in before they reach the model (issue 31 item 11): a number can be finite and still
 * overflow float32 once the model multiplies it (lora_alpha 1e308 is Infinity as a float32 scale; a learning rate
 * of 1e308 throws every weight to Infinity). Each bound keeps what the number does there inside float32 with room
 * to spare, and sits far outside any value a training recipe uses [M: Baseten publishes no ranges].
 */

/** lora_alpha: 64 × the largest lora_rank. The scale alpha / r multiplies every adapter output. */
export const MAX_LORA_ALPHA = 8192;

/** AdamW moves each weight by about learning_rate a step: 1 already moves a LoRA weight by its own scale. */
export const MAX_LEARNING_RATE = 1;

/**
 * Below this, a second moment that rounded to 0 in float32 beside a first moment that did not (gradients near
 * 1e-22) divides by eps alone and throws the weight past float32; Tinker's default is 1e-12.
 */
export const MIN_ADAM_EPS = 1e-20;

/** Every loss_fn_config value (clip thresholds are ratios, dppo's deltas log-ratios, dro's beta a penalty weight). */
export const MAX_LOSS_CONFIG_VALUE = 100;

/** |weights| and |advantages|: the per-position loss is scaled by both. */
export const MAX_ABS_LOSS_SCALE = 1e4;

/**
 * The smallest sampler logprob where it counts (a non-zero advantage): the ratio exp(lp - q) overflows float32
 * past about 88; a token of probability e^-60 cannot have been sampled (draws take 24 bits).
 */
export const MIN_COUNTED_LOGPROB = -60;

/** The smallest temperature but 0 (greedy): 1 / T scales the hidden state in float32 [I: vLLM samples greedily below 1e-5]. */
export const MIN_TEMPERATURE = 1e-5;

/** A float32 as it was most likely written (1e30, not 1.0000000150474662e+30). */
const shown = (v: number) => Number(v.toPrecision(7));

/** A non-zero temperature below MIN_TEMPERATURE is refused; 0 is greedy. */
export function checkTemperature(t: number, field: string): void {
  if (t > 0 && t < MIN_TEMPERATURE)
    throw invalid(
      `${field} ${t} is too small to sample with: use 0 for greedy sampling, or at least ${MIN_TEMPERATURE} (1 / ${field} scales the model's float32 activations).`,
      { field },
    );
}

/** loss_fn_config values inside 0..MAX_LOSS_CONFIG_VALUE (their own rules, e.g. low < high, are the loss's). */
export function checkLossConfigRanges(config: Record<string, unknown> | null | undefined): void {
  for (const [k, v] of Object.entries(config ?? {})) {
    if (typeof v === 'number' && Math.abs(v) > MAX_LOSS_CONFIG_VALUE) {
      throw invalid(`loss_fn_config.${k} is ${v}: loss settings are ratios, log-ratios or penalty weights, at most ${MAX_LOSS_CONFIG_VALUE}.`, {
        field: `loss_fn_config.${k}`,
      });
    }
  }
}

/**
 * The float32 inputs of each datum in the ranges the loss can compute with: |weights| and |advantages| at most
 * MAX_ABS_LOSS_SCALE; for a ratio loss, `logprobs` at least MIN_COUNTED_LOGPROB wherever the advantage is non-zero
 * (elsewhere the position does not count, and a placeholder there is harmless).
 */
export function checkLossInputRanges(data: TrainingDatum[], loss: LossName): void {
  data.forEach((d, i) => {
    const scaled: ['weights' | 'advantages', Float32Array | null][] = [
      ['weights', d.weights],
      ['advantages', d.advantages],
    ];
    for (const [name, values] of scaled) {
      const t = values ? values.findIndex((v) => Math.abs(v) > MAX_ABS_LOSS_SCALE) : -1;
      if (t >= 0) {
        const field = `data[${i}].loss_fn_inputs.${name}`;
        throw invalid(
          `${field}[${t}] is ${shown(values![t]!)}: ${name} scale each position's loss and are at most ${MAX_ABS_LOSS_SCALE} in magnitude; normalise them.`,
          { field },
        );
      }
    }
    if (!isRatioLoss(loss) || !d.logprobs || !d.advantages) return;
    const t = d.logprobs.findIndex((q, k) => d.advantages![k] !== 0 && q < MIN_COUNTED_LOGPROB);
    if (t >= 0) {
      const field = `data[${i}].loss_fn_inputs.logprobs`;
      throw invalid(
        `${field}[${t}] is ${shown(d.logprobs[t]!)} where the advantage is ${shown(d.advantages[t]!)}: the ratio exp(logprob - ${field}) overflows float32 below ${MIN_COUNTED_LOGPROB}, and no sampled token is that unlikely; send the sampler's logprob of the token (or advantage 0 where the position should not count).`,
        { field },
      );
    }
  });
}

/** The first number that is not finite in a result (NaN, ±Infinity; `null` stands for them once in JSON), as its path; null if none. */
export function nonFiniteIn(value: unknown, path: string): string | null {
  const stack: [unknown, string][] = [[value, path]];
  while (stack.length) {
    const [v, at] = stack.pop()!;
    if (typeof v === 'number') {
      if (!Number.isFinite(v)) return `${at} is ${v}`;
    } else if (ArrayBuffer.isView(v) && !(v instanceof DataView)) {
      const a = v as unknown as ArrayLike<number | bigint>;
      for (let i = 0; i < a.length; i++) if (typeof a[i] === 'number' && !Number.isFinite(a[i])) return `${at}[${i}] is ${a[i]}`;
    } else if (Array.isArray(v)) {
      for (let i = v.length - 1; i >= 0; i--) stack.push([v[i], `${at}[${i}]`]);
    } else if (v !== null && typeof v === 'object') {
      for (const [k, child] of Object.entries(v)) stack.push([child, `${at}.${k}`]);
    }
  }
  return null;
}
