import { isRatioLoss, LossInputError, type LossName } from './losses.js';

/** One training example, as the wire's Datum carries it. */
export interface TrainingDatum {
  tokens: number[];
  /** `target_tokens`; null = each position predicts the next input token (the last one counts for nothing). -100 = not counted. */
  targetTokens: number[] | null;
  weights: Float32Array | null;
  /** Sampler logprobs (`loss_fn_inputs.logprobs`). */
  logprobs: Float32Array | null;
  advantages: Float32Array | null;
}

export const IGNORE_TARGET = -100;

/**
 * The one check of training data, for the trainer plane at submit time and
 * for LoraTrainer itself: tokens and targets inside the vocabulary, one value
 * per position in every per-position input, finite float32 values (a number
 * that only float64 can hold became Infinity on the way in), and what a ratio
 * loss needs. Errors name the datum and field as the wire spells them.
 */
export function checkTrainingData(data: TrainingDatum[], vocab: number, loss: LossName): void {
  data.forEach((d, i) => {
    const at = `data[${i}]`;
    const T = d.tokens.length;
    if (T === 0) throw new LossInputError(`${at}.model_input`, `${at}.model_input has no tokens.`);
    const badToken = d.tokens.findIndex((t) => !Number.isInteger(t) || t < 0 || t >= vocab);
    if (badToken >= 0) throw new LossInputError(`${at}.model_input`, `${at}.model_input token ${d.tokens[badToken]} at position ${badToken} is outside the vocabulary (0..${vocab - 1}).`);
    const perPosition: [string, ArrayLike<number> | null][] = [['target_tokens', d.targetTokens], ['weights', d.weights], ['logprobs', d.logprobs], ['advantages', d.advantages]];
    for (const [name, values] of perPosition) {
      if (!values) continue;
      const field = `${at}.loss_fn_inputs.${name}`;
      if (values.length !== T) throw new LossInputError(field, `${field} has ${values.length} values; ${at} has ${T} tokens and needs one per position.`);
      for (let t = 0; t < T; t++) {
        if (!Number.isFinite(values[t]!)) throw new LossInputError(field, `${field} must hold finite float32 numbers: position ${t} is ${values[t]} (float32 ends at ±3.4e38).`);
      }
    }
    if (d.targetTokens) {
      const off = d.targetTokens.findIndex((t) => t !== IGNORE_TARGET && (!Number.isInteger(t) || t < 0 || t >= vocab));
      const field = `${at}.loss_fn_inputs.target_tokens`;
      if (off >= 0) throw new LossInputError(field, `${field} ${d.targetTokens[off]} at position ${off} is outside the vocabulary (0..${vocab - 1}); use -100 for positions that do not count.`);
    }
    if (isRatioLoss(loss) && (!d.logprobs || !d.advantages)) {
      throw new LossInputError(`${at}.loss_fn_inputs`, `${at}: loss_fn '${loss}' needs loss_fn_inputs.logprobs (the sampler's logprobs of the tokens) and loss_fn_inputs.advantages.`);
    }
  });
}
