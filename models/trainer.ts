import type { ModelEngine, ScoredSequence } from './engine.js';
import { computeLoss, cotangentsNeedLogprobs, type LossDatum, type LossName, type Reduction } from './losses.js';
import { cloneAdapter, DEFAULT_LORA_ALPHA, freshAdapter, parameters, touchAdapter, type LoraAdapter } from './lora.js';
import { ADAM_DEFAULTS, adamwStep, freshOptimizerState, type AdamParams, type OptimizerState } from './optimizer.js';
import { adapterFiles, CheckpointLoadError, optimizerFiles, readAdapter, readOptimizer, type CheckpointFile } from './peft.js';
import { checkTrainingData, IGNORE_TARGET, type TrainingDatum } from './training-data.js';

export { IGNORE_TARGET, type TrainingDatum } from './training-data.js';

export interface PassResult {
  loss: number;
  /** Per datum, the learner logprob of each position's target (0 where no target counts). */
  logprobs: Float32Array[];
  metrics: Record<string, number>;
}

/**
 * The training state of one run on a shared engine: its LoRA adapter, the
 * gradients accumulated since the last optimizer step, and AdamW's moments.
 */
export class LoraTrainer {
  adapter: LoraAdapter;
  optimizer: OptimizerState = freshOptimizerState();
  private grads: Map<string, Float32Array> | null = null;

  constructor(readonly engine: ModelEngine, rank: number, alpha = DEFAULT_LORA_ALPHA, readonly seed: number | string = 0) {
    this.adapter = freshAdapter(engine.sites, rank, alpha, seed);
  }

  /** Optimizer steps applied: the policy version. */
  get step(): number {
    return this.optimizer.step;
  }

  /** Loss and logprobs; no gradient is touched. */
  async forward(data: TrainingDatum[], loss: LossName, config: Record<string, number>, reduction: Reduction = 'mean'): Promise<PassResult> {
    const { seqs, lossData } = this.prepare(data, loss);
    const logprobs = this.mask(await this.engine.forward(seqs, this.adapter), lossData);
    const result = computeLoss(loss, config, lossData, logprobs, reduction);
    return { loss: result.loss, logprobs, metrics: result.metrics };
  }

  /** Loss and logprobs, and the loss's gradient added to those accumulated since the last optimizer step. */
  async forwardBackward(data: TrainingDatum[], loss: LossName, config: Record<string, number>, reduction: Reduction = 'mean'): Promise<PassResult> {
    const { seqs, lossData } = this.prepare(data, loss);
    let cotangents: Float32Array[];
    let result;
    if (cotangentsNeedLogprobs(loss)) {
      const logprobs = this.mask(await this.engine.forward(seqs, this.adapter), lossData);
      result = computeLoss(loss, config, lossData, logprobs, reduction);
      cotangents = result.cotangents;
    } else {
      // Cross-entropy's cotangents are fixed by the weights: one backward pass gives logprobs and gradients.
      result = computeLoss(loss, config, lossData, lossData.map((d) => new Float32Array(d.counted.length)), reduction);
      cotangents = result.cotangents;
    }
    const { logprobs: rawLogprobs, grads } = await this.engine.backward(seqs, this.adapter, cotangents);
    const logprobs = this.mask(rawLogprobs, lossData);
    if (!cotangentsNeedLogprobs(loss)) result = computeLoss(loss, config, lossData, logprobs, reduction);
    this.accumulate(grads);
    return { loss: result.loss, logprobs, metrics: result.metrics };
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

  private mask(logprobs: Float32Array[], lossData: { targetValid: Uint8Array }[]): Float32Array[] {
    return logprobs.map((lp, i) => {
      const counted = lossData[i]!.targetValid;
      for (let t = 0; t < lp.length; t++) if (!counted[t]) lp[t] = 0;
      return lp;
    });
  }

  /** Checks the data (checkTrainingData), then resolves each position's target: explicit, or the next input token. */
  private prepare(data: TrainingDatum[], loss: LossName): { seqs: ScoredSequence[]; lossData: (LossDatum & { targetValid: Uint8Array })[] } {
    checkTrainingData(data, this.engine.dims.vocab, loss);
    const seqs: ScoredSequence[] = [];
    const lossData: (LossDatum & { targetValid: Uint8Array })[] = [];
    for (const d of data) {
      const T = d.tokens.length;
      const targets = new Array<number>(T);
      const valid = new Uint8Array(T);
      for (let t = 0; t < T; t++) {
        const target = d.targetTokens ? d.targetTokens[t]! : t + 1 < T ? d.tokens[t + 1]! : IGNORE_TARGET;
        valid[t] = target === IGNORE_TARGET ? 0 : 1;
        targets[t] = target === IGNORE_TARGET ? 0 : target;
      }
      const counted = Uint8Array.from(valid, (v, t) => (v && (d.weights?.[t] ?? 1) !== 0 ? 1 : 0));
      seqs.push({ tokens: d.tokens, targets, scored: [...valid.keys()].filter((t) => valid[t]) });
      lossData.push({ counted, targetValid: valid, weights: d.weights, samplerLogprobs: d.logprobs, advantages: d.advantages });
    }
    return { seqs, lossData };
  }
}

/**
 * Takes a throwaway trainer through one turn of a training loop (an eval, a step with its AdamW update over
 * every parameter, both kinds of checkpoint files), so that a fresh server's first client does not run this
 * code in V8's interpreter: the first round's eval took ~25 ms more without.
 */
export async function warmTrainingLoop(engine: ModelEngine): Promise<void> {
  const trainer = new LoraTrainer(engine, 16, DEFAULT_LORA_ALPHA, 'warm-up');
  const tokens = [1, 2, 3, 4, 5, 6, 7, 8];
  const datum: TrainingDatum = { tokens, targetTokens: tokens.map((_, i) => (i >= 5 && i < 7 ? tokens[i + 1]! : IGNORE_TARGET)), weights: null, logprobs: null, advantages: null };
  await trainer.forward([datum], 'cross_entropy', {});
  await trainer.forwardBackward([datum], 'cross_entropy', {});
  trainer.optimStep(ADAM_DEFAULTS);
  trainer.stateFiles();
  trainer.samplerFiles();
}
