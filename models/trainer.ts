import type { ModelEngine, ScoredSequence, TopTokens } from './engine.js';
import { computeLoss, cotangentsNeedLogprobs, isActive, type LossDatum, type LossName, type Reduction } from './losses.js';
import { cloneAdapter, DEFAULT_LORA_ALPHA, freshAdapter, parameters, touchAdapter, type LoraAdapter } from './lora.js';
import { adamwStep, freshOptimizerState, warmOptimizer, type AdamParams, type OptimizerState } from './optimizer.js';
import { adapterFiles, CheckpointLoadError, optimizerFiles, readAdapter, readOptimizer, type CheckpointFile } from './peft.js';
import { alignmentOf, checkTrainingData, IGNORE_TARGET, type TrainingDatum } from './training-data.js';

export { alignmentOf, IGNORE_TARGET, MAX_TOP_K_LOGPROBS, type Alignment, type TrainingDatum } from './training-data.js';

export interface PassResult {
  loss: number;
  /** Per datum, the learner logprob of what each position scores (0 where nothing counts), in the datum's own alignment. */
  logprobs: Float32Array[];
  /** With `topK`: per datum and position, the k most likely tokens where the position is active (counts in the loss), an empty row elsewhere. */
  top?: TopTokens[][];
  metrics: Record<string, number>;
}

export interface PassOptions {
  /** `mean` (Loops, the default) or `sum` (Tinker). */
  reduction?: Reduction;
  /** The k most likely tokens to report at each active position (0: none). */
  topK?: number;
}

/** A datum read for the engine: what it counts, in its own positions, and how they map onto the engine's. */
interface PreparedDatum extends LossDatum {
  /** Positions that score a token (a target that is not -100), in the datum's positions. */
  targetValid: Uint8Array;
  /** The datum's position k is the engine's position k - shift: 1 for a token-aligned datum (alignmentOf), else 0. */
  shift: 0 | 1;
}

/**
 * The training state of one run on a shared engine: its LoRA adapter, the
 * gradients accumulated since the last optimizer step, and AdamW's moments.
 *
 * The engine scores next tokens: its position t scores the token that follows
 * t. A token-aligned datum (a policy loss without target_tokens) is scored
 * there one position early, its position k being the engine's k - 1; its
 * logprobs come back moved one later and its cotangents go in one earlier.
 */
export class LoraTrainer {
  adapter: LoraAdapter;
  optimizer: OptimizerState = freshOptimizerState();
  private grads: Map<string, Float32Array> | null = null;

  constructor(
    readonly engine: ModelEngine,
    rank: number,
    alpha = DEFAULT_LORA_ALPHA,
    readonly seed: number | string = 0,
  ) {
    this.adapter = freshAdapter(engine.sites, rank, alpha, seed);
  }

  /** Optimizer steps applied: the policy version. */
  get step(): number {
    return this.optimizer.step;
  }

  /** Loss and logprobs (and with `topK` the most likely tokens); no gradient is touched. */
  async forward(data: TrainingDatum[], loss: LossName, config: Record<string, number>, options: PassOptions = {}): Promise<PassResult> {
    const { seqs, lossData } = this.prepare(data, loss);
    const topK = options.topK ?? 0;
    // With a top-k the one forward pass is the topk graph's: the same logprobs, and the top tokens beside them.
    const scored = topK > 0 ? await this.engine.topk(seqs, this.adapter, topK) : { logprobs: await this.engine.forward(seqs, this.adapter), top: null };
    const logprobs = this.align(scored.logprobs, lossData);
    const result = computeLoss(loss, config, lossData, logprobs, options.reduction);
    return { loss: result.loss, logprobs, metrics: result.metrics, ...(scored.top ? { top: this.activeTop(scored.top, lossData, loss) } : {}) };
  }

  /** Loss and logprobs (and with `topK` the most likely tokens), and the loss's gradient added to those accumulated since the last optimizer step. */
  async forwardBackward(data: TrainingDatum[], loss: LossName, config: Record<string, number>, options: PassOptions = {}): Promise<PassResult> {
    const { seqs, lossData } = this.prepare(data, loss);
    const { reduction } = options;
    const topK = options.topK ?? 0;
    let result: ReturnType<typeof computeLoss>;
    let top: TopTokens[][] | null = null;
    if (cotangentsNeedLogprobs(loss)) {
      const scored = topK > 0 ? await this.engine.topk(seqs, this.adapter, topK) : { logprobs: await this.engine.forward(seqs, this.adapter), top: null };
      top = scored.top;
      result = computeLoss(loss, config, lossData, this.align(scored.logprobs, lossData), reduction);
    } else {
      // Cross-entropy's cotangents are fixed by the weights: one backward pass gives logprobs and gradients.
      result = computeLoss(
        loss,
        config,
        lossData,
        lossData.map((d) => new Float32Array(d.counted.length)),
        reduction,
      );
      // Its top-k takes a forward pass of its own, over the active positions only.
      if (topK > 0) top = (await this.engine.topk(this.activeSeqs(seqs, lossData, loss), this.adapter, topK)).top;
    }
    const cotangents = result.cotangents.map((c, i) => toEnginePositions(c, lossData[i]!.shift));
    const { logprobs: rawLogprobs, grads } = await this.engine.backward(seqs, this.adapter, cotangents);
    const logprobs = this.align(rawLogprobs, lossData);
    if (!cotangentsNeedLogprobs(loss)) result = computeLoss(loss, config, lossData, logprobs, reduction);
    this.accumulate(grads);
    return { loss: result.loss, logprobs, metrics: result.metrics, ...(top ? { top: this.activeTop(top, lossData, loss) } : {}) };
  }

  /** The gradients accumulated since the last optimizer step (null when none). */
  accumulatedGradients(): ReadonlyMap<string, Float32Array> | null {
    return this.grads;
  }

  /** One AdamW step over the accumulated gradients (none accumulated: a step with zero gradients), which are then cleared. */
  optimStep(hp: AdamParams): Record<string, number> {
    const params = parameters(this.adapter);
    const grads = this.grads ?? new Map();
    const metrics = adamwStep(params, grads, this.optimizer, hp);
    touchAdapter(this.adapter);
    this.grads = null;
    return metrics;
  }

  /** A fresh adapter (B = 0) of the given rank; optimizer state and gradients are dropped. */
  reset(rank: number, alpha: number): void {
    this.adapter = freshAdapter(this.engine.sites, rank, alpha, this.seed);
    this.optimizer = freshOptimizerState();
    this.grads = null;
  }

  /** A copy of the adapter as it is now (what a publish hands to samplers). */
  snapshot(): LoraAdapter {
    return cloneAdapter(this.adapter);
  }

  samplerFiles(): CheckpointFile[] {
    return this.currentAdapterFiles();
  }

  stateFiles(): CheckpointFile[] {
    return [...this.currentAdapterFiles(), ...optimizerFiles(this.adapter, this.optimizer, this.engine.modelName)];
  }

  /** The adapter files of the current weights, made once per version: a save usually writes a trainer and a sampler checkpoint of the same step. */
  private adapterFilesCache: { id: string; version: number; files: CheckpointFile[] } | null = null;

  private currentAdapterFiles(): CheckpointFile[] {
    const { id, version } = this.adapter;
    if (this.adapterFilesCache?.id !== id || this.adapterFilesCache.version !== version) {
      this.adapterFilesCache = { id, version, files: adapterFiles(this.adapter, this.engine.sites, this.engine.modelName) };
    }
    return this.adapterFilesCache.files;
  }

  /** Restores adapter weights (and, with `withOptimizer`, moments and step) from checkpoint files. */
  load(files: Map<string, Uint8Array>, withOptimizer: boolean): void {
    const adapter = readAdapter(files, this.engine.sites, this.engine.modelName);
    const optimizer = withOptimizer ? readOptimizer(files) : freshOptimizerState();
    if (withOptimizer) {
      for (const [name, p] of parameters(adapter)) {
        const m = optimizer.m.get(name);
        if (m && m.length !== p.length) throw new CheckpointLoadError(`optimizer state for ${name} does not fit the adapter`);
      }
    }
    this.adapter = adapter;
    this.optimizer = optimizer;
    this.grads = null;
  }

  private accumulate(grads: Map<string, Float32Array>): void {
    if (!this.grads) {
      this.grads = grads;
      return;
    }
    for (const [k, g] of grads) {
      const acc = this.grads.get(k)!;
      for (let i = 0; i < g.length; i++) acc[i]! += g[i]!;
    }
  }

  /** The engine's logprobs in each datum's own positions, 0 wherever the datum scores nothing. */
  private align(raw: Float32Array[], lossData: PreparedDatum[]): Float32Array[] {
    return raw.map((lp, i) => {
      const { targetValid, shift } = lossData[i]!;
      const out = new Float32Array(lp.length);
      for (let t = shift; t < lp.length; t++) if (targetValid[t]) out[t] = lp[t - shift]!;
      return out;
    });
  }

  /** The engine's top-k rows in each datum's own positions, kept where the position is active. */
  private activeTop(raw: TopTokens[][], lossData: PreparedDatum[], loss: LossName): TopTokens[][] {
    return raw.map((rows, i) => {
      const d = lossData[i]!;
      return rows.map((_, t) => (t >= d.shift && isActive(loss, d, t) ? rows[t - d.shift]! : { ids: [], logprobs: [] }));
    });
  }

  /** The sequences with only their active positions scored, in the engine's positions. */
  private activeSeqs(seqs: ScoredSequence[], lossData: PreparedDatum[], loss: LossName): ScoredSequence[] {
    return seqs.map((s, i) => {
      const d = lossData[i]!;
      const scored: number[] = [];
      for (let t = d.shift; t < d.counted.length; t++) if (isActive(loss, d, t)) scored.push(t - d.shift);
      return { ...s, scored };
    });
  }

  /**
   * Checks the data (checkTrainingData), then resolves what each position scores: `target_tokens`, or without
   * them the next input token (the engine's position t), which a token-aligned datum reads at position t + 1.
   */
  private prepare(data: TrainingDatum[], loss: LossName): { seqs: ScoredSequence[]; lossData: PreparedDatum[] } {
    checkTrainingData(data, this.engine.dims.vocab, loss);
    const seqs: ScoredSequence[] = [];
    const lossData: PreparedDatum[] = [];
    for (const d of data) {
      const T = d.tokens.length;
      const shift = alignmentOf(d, loss) === 'token' ? 1 : 0;
      const targets = new Array<number>(T);
      const scored: number[] = [];
      const valid = new Uint8Array(T);
      for (let t = 0; t < T; t++) {
        const target = d.targetTokens ? d.targetTokens[t]! : t + 1 < T ? d.tokens[t + 1]! : IGNORE_TARGET;
        targets[t] = target === IGNORE_TARGET ? 0 : target;
        if (target === IGNORE_TARGET) continue;
        scored.push(t);
        valid[t + shift] = 1;
      }
      const counted = Uint8Array.from(valid, (v, t) => (v && (d.weights?.[t] ?? 1) !== 0 ? 1 : 0));
      seqs.push({ tokens: d.tokens, targets, scored });
      lossData.push({ counted, targetValid: valid, shift, weights: d.weights, samplerLogprobs: d.logprobs, advantages: d.advantages });
    }
    return { seqs, lossData };
  }
}

/** A datum's per-position cotangents in the engine's positions: position k of a datum shifted by `shift` is the engine's k - shift. */
function toEnginePositions(cotangents: Float32Array, shift: 0 | 1): Float32Array {
  return shift ? Float32Array.from(cotangents, (_, t) => (t + 1 < cotangents.length ? cotangents[t + 1]! : 0)) : cotangents;
}

/**
 * Runs the trainer's code that needs no graph run once, on this thread while the engine's worker builds its
 * sessions (it is idle meanwhile): AdamW's loops on small tensors (warmOptimizer) and a throwaway adapter's
 * files of both checkpoint kinds, so that a fresh server's first optim_step and saves do not run in V8's
 * interpreter. Graph runs are left out: they would take the worker's time while it builds.
 */
export function warmTrainerCode(engine: ModelEngine): void {
  warmOptimizer();
  const trainer = new LoraTrainer(engine, 16, DEFAULT_LORA_ALPHA, 'warm-up');
  trainer.stateFiles();
  trainer.samplerFiles();
}
