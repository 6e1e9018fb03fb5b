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

/** Most top-k tokens a forward or forward_backward may ask for per position (`top_k_logprobs`). */
export const MAX_TOP_K_LOGPROBS = 20;

/**
 * How a datum's positions line up with what they score. `next`: position t scores `target_tokens[t]`, or
 * without them the next input token (Tinker's convention; cross_entropy's without targets). `token`: position
 * k scores input token k given tokens 0..k-1, so position 0 scores nothing: the policy losses without
 * `target_tokens`, as the RL guide builds its datums (the sampler's logprob of each completion token at that
 * token's own index).
 */
export type Alignment = 'next' | 'token';

export function alignmentOf(datum: Pick<TrainingDatum, 'targetTokens'>, loss: LossName): Alignment {
  return isRatioLoss(loss) && !datum.targetTokens ? 'token' : 'next';
}

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
    if (badToken >= 0)
      throw new LossInputError(
        `${at}.model_input`,
        `${at}.model_input token ${d.tokens[badToken]} at position ${badToken} is outside the vocabulary (0..${vocab - 1}).`,
      );
    const perPosition: [string, ArrayLike<number> | null][] = [
      ['target_tokens', d.targetTokens],
      ['weights', d.weights],
      ['logprobs', d.logprobs],
      ['advantages', d.advantages],
    ];
    for (const [name, values] of perPosition) {
      if (!values) continue;
      const field = `${at}.loss_fn_inputs.${name}`;
      if (values.length !== T) throw new LossInputError(field, `${field} has ${values.length} values; ${at} has ${T} tokens and needs one per position.`);
      for (let t = 0; t < T; t++) {
        if (!Number.isFinite(values[t]!))
          throw new LossInputError(field, `${field} must hold finite float32 numbers: position ${t} is ${values[t]} (float32 ends at ±3.4e38).`);
      }
    }
    if (d.targetTokens) {
      const off = d.targetTokens.findIndex((t) => t !== IGNORE_TARGET && (!Number.isInteger(t) || t < 0 || t >= vocab));
      const field = `${at}.loss_fn_inputs.target_tokens`;
      if (off >= 0)
        throw new LossInputError(
          field,
          `${field} ${d.targetTokens[off]} at position ${off} is outside the vocabulary (0..${vocab - 1}); use -100 for positions that do not count.`,
        );
    }
    if (isRatioLoss(loss) && (!d.logprobs || !d.advantages)) {
      throw new LossInputError(
        `${at}.loss_fn_inputs`,
        `${at}: loss_fn '${loss}' needs loss_fn_inputs.logprobs (the sampler's logprobs of the tokens) and loss_fn_inputs.advantages.`,
      );
    }
    if (alignmentOf(d, loss) === 'token' && d.advantages![0] !== 0) {
      const field = `${at}.loss_fn_inputs.advantages`;
      throw new LossInputError(
        field,
        `${field}[0] is ${d.advantages![0]}, but position 0 scores nothing: without target_tokens, '${loss}' scores token k at position k given the tokens before it, and the first token has none. Set advantages[0] (and logprobs[0]) to 0, as prompt positions are, or send target_tokens to score each position's next token.`,
      );
    }
  });
}
