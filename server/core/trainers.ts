import { createHash } from 'node:crypto';
import {
  adapterConfig,
  ADAM_DEFAULTS,
  CheckpointLoadError,
  checkTrainingData,
  isLossName,
  LOSS_NAMES,
  LossInputError,
  LoraTrainer,
  resolveLossConfig,
  type AdamParams,
  MAX_TOP_K_LOGPROBS,
  type EnginePool,
  type LossName,
  type TopTokens,
  type TrainingDatum,
} from '../../models/index.js';
import type { ForwardBody, TrainerBody, TrainerOp, WireTensorData } from '../wire/trainer.js';
import { MAX_LORA_RANK, type Fleet } from './fleet.js';
import type { Checkpoints } from './checkpoints.js';
import { assertSafeCheckpointName, parseCheckpointPath } from './checkpoints.js';
import { invalid, LoopsError } from './errors.js';
import { declaredPositions, imageRule, modelInputTokens, tokenCount } from './model-input.js';
import { OperationFailure, type Operation, type Operations } from './operations.js';
import { checkLossConfigRanges, checkLossInputRanges, MAX_LEARNING_RATE, MAX_LORA_ALPHA, MIN_ADAM_EPS, nonFiniteIn } from './value-ranges.js';
import type { Principal, RunRecord } from './records.js';
import type { SamplerWeights } from './sampler-weights.js';
import type { Settings } from './settings.js';

/** One operation and its body, as the route validated it: the body's type follows the op. */
export type TrainerRequest = { [O in TrainerOp]: { op: O; body: TrainerBody<O> } }[TrainerOp];

/** Per-position inputs a datum may carry, with the dtype each must have. */
const LOSS_INPUTS: Record<string, 'int64' | 'float32'> = { target_tokens: 'int64', weights: 'float32', logprobs: 'float32', advantages: 'float32' };

interface TrainerState {
  trainer: LoraTrainer | null;
  /** Resolves once the trainer exists and any start-up checkpoint is loaded. */
  ready: Promise<void>;
  loaded: boolean;
}

/**
 * The trainer of every run: validation at submit time, operations executed
 * in order on the run's LoRA trainer, checkpoints, and publication of
 * weights to the run's paired sampler.
 */
export class Trainers {
  private readonly states = new Map<string, TrainerState>();
  /**
   * Each run's policy version: one more for every change of its weights (an optimizer step, a load, a fresh
   * adapter). It never goes back, so a publication after a load outranks what the sampler serves; kept after the
   * run stops (the version it reached stays readable).
   */
  private readonly versions = new Map<string, number>();

  constructor(
    private readonly fleet: Fleet,
    private readonly checkpoints: Checkpoints,
    private readonly engines: EnginePool,
    private readonly operations: Operations,
    private readonly samplerWeights: SamplerWeights,
    private readonly settings: Pick<Settings, 'maxBatchTokens'>,
  ) {
    fleet.onRunStopped((run, reason) => {
      this.operations.failPending(
        run.id,
        'RunDeactivated',
        `Run ${run.id} is INACTIVE (${reason}); its operations were stopped. Create a new run to continue.`,
      );
      this.states.delete(run.id);
    });
  }

  /** Whether the trainer answers health checks: cold start over and start-up checkpoint loaded. */
  isReady(run: RunRecord): boolean {
    if (this.fleet.coldStartLeft(run) > 0) return false;
    const state = this.state(run);
    return state.loaded;
  }

  policyVersion(run: RunRecord): number {
    return this.versions.get(run.id) ?? 0;
  }

  /** The version after a change of weights: one more, or the step a resumed optimizer restored if that is higher. */
  private nextVersion(run: RunRecord, atLeast = 0): number {
    const version = Math.max(this.policyVersion(run) + 1, atLeast);
    this.versions.set(run.id, version);
    return version;
  }

  /**
   * Validates a request fully, then queues it; returns the operation (an
   * earlier one for a reused Idempotency-Key). `injectedFailure` (a fault
   * rule) makes the operation end with that error instead of running.
   */
  submit(p: Principal, run: RunRecord, request: TrainerRequest, idempotencyKey: string | undefined, injectedFailure?: OperationFailure): Operation {
    const work = this.prepare(p, run, request);
    return this.operations.submit(run.id, request.op, request.body, idempotencyKey, async () => {
      await this.state(run).ready;
      if (injectedFailure) throw injectedFailure;
      const state = this.states.get(run.id);
      if (!state?.trainer || run.status !== 'ACTIVE') throw new OperationFailure('RunDeactivated', `Run ${run.id} is INACTIVE; its trainer is gone.`);
      try {
        return await work(state.trainer);
      } catch (err) {
        if (err instanceof LossInputError || err instanceof CheckpointLoadError || (err instanceof LoopsError && err.kind === 'invalid_request'))
          throw new OperationFailure('ValueError', err.message);
        throw err;
      }
    });
  }

  // ---- per-op validation and work ---------------------------------------

  private prepare(p: Principal, run: RunRecord, request: TrainerRequest): (t: LoraTrainer) => Promise<unknown> {
    const { op } = request;
    switch (request.op) {
      case 'forward':
      case 'forward_backward': {
        const { data, loss, config, topK } = this.checkPass(run, request.body);
        return async (t) => {
          const training = op === 'forward_backward';
          const before = training ? copyGradients(t) : null;
          const r = op === 'forward' ? await t.forward(data, loss, config, { topK }) : await t.forwardBackward(data, loss, config, { topK });
          const result = {
            loss: r.loss,
            loss_fn_outputs: r.logprobs.map((lp, i) => ({
              logprobs: { data: Array.from(lp), dtype: 'float32', shape: [lp.length] },
              ...(r.top ? topTensors(r.top[i]!, topK) : {}),
            })),
            metrics: r.metrics,
          };
          // A result with NaN or Infinity would read as nulls; gradients that hold one would poison the next step.
          const bad = nonFiniteIn(result, 'result') ?? (training ? nonFiniteGradient(t) : null);
          if (bad) {
            if (training) restoreGradients(t, before);
            throw new OperationFailure(
              'ValueError',
              `${op} overflowed float32: ${bad}. The adapter's scale (lora_alpha ${t.adapter.alpha} over rank ${t.adapter.rank}), its weights after the steps so far, or the datums' values are too large for the model to compute with${training ? '; the gradients of this call were dropped, those accumulated before it kept' : ''}. Lower them (or load_state a checkpoint from before the weights grew).`,
            );
          }
          return result;
        };
      }
      case 'optim_step': {
        const hp = checkAdam(request.body.adam_params ?? {});
        return async (t) => {
          const metrics = t.optimStep(hp);
          const bad = nonFiniteIn(metrics, 'metrics');
          if (bad)
            throw new OperationFailure(
              'ValueError',
              `optim_step overflowed float32: ${bad}. The gradients or adam_params are too large for the weights to stay finite; load_state a checkpoint from before this step and lower learning_rate.`,
            );
          return { metrics, policy_version: this.nextVersion(run) };
        };
      }
      case 'save_state':
      case 'save_weights_for_sampler': {
        const { name } = request.body;
        assertSafeCheckpointName(name, 'name');
        return async (t) => {
          if (op === 'save_state') {
            const c = this.checkpoints.save(run, 'trainer', name, t.stateFiles(), adapterConfigOf(t));
            return { path: `bt://loops:${run.id}/weights/${c.name}` };
          }
          const c = this.checkpoints.save(run, 'sampler', name, t.samplerFiles(), adapterConfigOf(t));
          const path = `bt://loops:${run.id}/sampler_weights/${c.name}`;
          // Publish to the paired sampler (created now if the run has none, as the SDK does lazily).
          const sampler = this.fleet.pairSampler(run);
          const version = this.policyVersion(run);
          this.samplerWeights.publish(sampler.id, { version, adapter: t.snapshot(), path });
          return { path, policy_version: version };
        };
      }
      case 'load_state':
      case 'load_state_with_optimizer': {
        const withOptimizer = op === 'load_state_with_optimizer';
        const { path } = request.body;
        const c = this.checkpoints.resolve(p, path, 'path', withOptimizer ? 'trainer' : undefined);
        if (c.base_model !== run.base_model) throw invalid(`path is a checkpoint of ${c.base_model}; this run trains ${run.base_model}.`, { field: 'path' });
        const rank = (c.lora_adapter_config as { r?: number } | null)?.r;
        if (rank !== undefined && rank !== run.lora_rank)
          throw invalid(
            `path holds a rank-${rank} adapter; this run's lora_rank is ${run.lora_rank}. Use init_trainer_server {lora_rank: ${rank}} first, or a run of that rank.`,
            { field: 'path' },
          );
        return async (t) => {
          t.load(this.checkpoints.readFiles(c), withOptimizer);
          this.nextVersion(run, t.step);
          return { path };
        };
      }
      case 'init_trainer_server': {
        const rank = request.body.lora_rank;
        const alpha = request.body.lora_alpha ?? 32;
        if (rank < 1 || rank > MAX_LORA_RANK) throw invalid(`lora_rank ${rank} is out of range: use 1..${MAX_LORA_RANK}.`, { field: 'lora_rank' });
        if (!(alpha > 0) || alpha > MAX_LORA_ALPHA)
          throw invalid(
            `lora_alpha must be > 0 and at most ${MAX_LORA_ALPHA} (got ${alpha}): the scale lora_alpha / lora_rank multiplies every adapter output in float32.`,
            { field: 'lora_alpha' },
          );
        return async (t) => {
          t.reset(rank, alpha);
          this.fleet.setLoraRank(run, rank);
          return { lora_rank: rank, lora_alpha: alpha, policy_version: this.nextVersion(run) };
        };
      }
    }
  }

  /**
   * A forward/forward_backward request read into training data: the wire's
   * own rules here (chunks, length, input names, dtypes, shapes), the data's
   * rules in checkTrainingData (the engine's one check), all at submit time.
   */
  private checkPass(run: RunRecord, body: ForwardBody): { data: TrainingDatum[]; loss: LossName; config: Record<string, number>; topK: number } {
    // Absent: the SDK's default.
    const loss = body.loss_fn ?? 'cross_entropy';
    if (!isLossName(loss))
      throw invalid(`loss_fn '${loss}' is not a loss of Loops: use one of ${LOSS_NAMES.join(', ')} (or leave it out for cross_entropy).`, { field: 'loss_fn' });
    const topK = body.top_k_logprobs ?? 0;
    if (topK < 0 || topK > MAX_TOP_K_LOGPROBS)
      throw invalid(`top_k_logprobs ${topK} is out of range: use 0..${MAX_TOP_K_LOGPROBS} (0 or absent: none).`, { field: 'top_k_logprobs' });
    checkBatchSize(body, this.settings.maxBatchTokens, this.fleet.lengthLimit(run.max_seq_len, "run's max_seq_len"));
    const vocab = this.engines.vocabSize(run.base_model);
    try {
      checkLossConfigRanges(body.loss_fn_config);
      const config = resolveLossConfig(loss, body.loss_fn_config);
      const length = this.fleet.lengthLimit(run.max_seq_len, "run's max_seq_len");
      const data = body.data.map((d, i): TrainingDatum => {
        const at = `data[${i}]`;
        const tokens = modelInputTokens(d.model_input, `${at}.model_input`, { ...length, images: () => imageRule(this.engines, run.base_model) });
        const arrays: Record<string, number[]> = {};
        for (const [name, tensor] of Object.entries(d.loss_fn_inputs ?? {})) {
          const field = `${at}.loss_fn_inputs.${name}`;
          // Own keys only: `__proto__` and its kin are names like any other, and none of them is an input.
          const want = Object.hasOwn(LOSS_INPUTS, name) ? LOSS_INPUTS[name] : undefined;
          if (!want) throw invalid(`${field} is not an input of Loops losses: use ${Object.keys(LOSS_INPUTS).join(', ')}.`, { field });
          if (tensor.dtype !== want) throw invalid(`${field} must have dtype '${want}' (got '${tensor.dtype}').`, { field: `${field}.dtype` });
          if (tensor.shape && (tensor.shape.length !== 1 || tensor.shape[0] !== tensor.data.length)) {
            throw invalid(
              `${field}.shape ${JSON.stringify(tensor.shape)} does not fit its ${tensor.data.length} values: per-position inputs are 1-D, [${tokens.length}].`,
              { field: `${field}.shape` },
            );
          }
          if (want === 'int64' && tensor.data.some((v) => !Number.isInteger(v))) throw invalid(`${field} must hold integers.`, { field });
          arrays[name] = tensor.data;
        }
        const f32 = (a?: number[]) => (a ? Float32Array.from(a) : null);
        return {
          tokens,
          targetTokens: arrays.target_tokens ?? null,
          weights: f32(arrays.weights),
          logprobs: f32(arrays.logprobs),
          advantages: f32(arrays.advantages),
        };
      });
      checkTrainingData(data, vocab, loss);
      checkLossInputRanges(data, loss);
      return { data, loss, config, topK };
    } catch (err) {
      if (err instanceof LossInputError) throw invalid(err.message, { field: err.field });
      throw err;
    }
  }

  /** The run's trainer, created on first use; a run created with `path` loads it (weights) before it is ready. */
  private state(run: RunRecord): TrainerState {
    let state = this.states.get(run.id);
    if (!state) {
      const s: TrainerState = { trainer: null, ready: Promise.resolve(), loaded: false };
      s.ready = (async () => {
        const engine = this.engines.get(run.base_model);
        const trainer = new LoraTrainer(engine, run.lora_rank, 32, run.seed ?? seedOf(run.id));
        if (run.path) {
          const where = parseCheckpointPath(run.path, 'path');
          const c = this.checkpoints.find(where.runId, where.target, where.name);
          if (c) trainer.load(this.checkpoints.readFiles(c), false);
        }
        s.trainer = trainer;
        s.loaded = true;
      })();
      s.ready.catch(() => undefined);
      state = s;
      this.states.set(run.id, state);
    }
    return state;
  }
}

/**
 * The batch's size from its chunks' lengths alone, before any id is read (issue 31 items 13, 15): each datum within
 * the run's length, the positions of all datums together at most --max-batch-tokens.
 */
function checkBatchSize(body: ForwardBody, limit: number, length: { maxLength: number; lengthName: string }): void {
  let positions = 0;
  body.data.forEach((d, i) => {
    const n = declaredPositions(d.model_input);
    // A datum too long for the run says so first: the more precise of the two.
    if (n.positions > length.maxLength)
      throw invalid(`data[${i}].model_input has ${tokenCount(n)}; the ${length.lengthName} is ${length.maxLength}.`, { field: `data[${i}].model_input` });
    positions += n.positions;
  });
  if (positions > limit) {
    throw invalid(
      `data has ${positions} positions in ${body.data.length} datums; one forward or forward_backward may carry at most ${limit} (the server's --max-batch-tokens): split it into several calls, whose gradients add up before optim_step.`,
      { field: 'data', limit: 'max_batch_tokens', limit_value: limit },
    );
  }
}

function checkAdam(given: Partial<AdamParams>): AdamParams {
  const hp = { ...ADAM_DEFAULTS, ...Object.fromEntries(Object.entries(given).filter(([, v]) => v !== null && v !== undefined)) } as AdamParams;
  // Ranges that keep every weight finite in float32 (server/core/value-ranges.ts says why each).
  const rules: [keyof AdamParams, (v: number) => boolean, string][] = [
    ['learning_rate', (v) => v >= 0 && v <= MAX_LEARNING_RATE, `in [0, ${MAX_LEARNING_RATE}]`],
    ['beta1', (v) => v >= 0 && v < 1, 'in [0, 1)'],
    ['beta2', (v) => v >= 0 && v < 1, 'in [0, 1)'],
    ['eps', (v) => v >= MIN_ADAM_EPS, `>= ${MIN_ADAM_EPS}`],
    [
      'weight_decay',
      (v) => v >= 0 && v * hp.learning_rate <= 1,
      '>= 0, with learning_rate × weight_decay at most 1 (the share of each weight a step takes away)',
    ],
    ['grad_clip_norm', (v) => v >= 0, '>= 0 (0 = no clipping)'],
  ];
  for (const [k, ok, want] of rules) {
    if (!Number.isFinite(hp[k]) || !ok(hp[k])) throw invalid(`adam_params.${k} must be ${want} (got ${hp[k]}).`, { field: `adam_params.${k}` });
  }
  return hp;
}

/**
 * A datum's top-k as `loss_fn_outputs` carries it [M: the wire names are not published]: `top_k_token_ids`
 * (int64) and `top_k_logprobs` (float32), each [L, k] row-major like Tinker's TopkLogprobs matrices, most
 * likely first; a position that is not active holds Tinker's sentinels (token 0, logprob -99999).
 */
function topTensors(rows: TopTokens[], k: number): { top_k_token_ids: WireTensorData; top_k_logprobs: WireTensorData } {
  const ids = new Array<number>(rows.length * k).fill(0);
  const logprobs = new Array<number>(rows.length * k).fill(TOP_K_SENTINEL_LOGPROB);
  rows.forEach((row, t) => {
    row.ids.forEach((id, j) => {
      ids[t * k + j] = id;
      logprobs[t * k + j] = row.logprobs[j]!;
    });
  });
  const shape = [rows.length, k];
  return { top_k_token_ids: { data: ids, dtype: 'int64', shape }, top_k_logprobs: { data: logprobs, dtype: 'float32', shape } };
}

/** The logprob a top-k slot of an inactive position holds (Tinker's sentinel for empty positions). */
const TOP_K_SENTINEL_LOGPROB = -99999;

/** A copy of the gradients accumulated so far (null: none), to put back if a forward_backward's own would poison them. */
function copyGradients(t: LoraTrainer): Map<string, Float32Array> | null {
  const acc = t.accumulatedGradients();
  return acc ? new Map([...acc].map(([k, g]) => [k, g.slice()])) : null;
}

/** Puts the accumulated gradients back as they were before the call (none before: zeros, which a step treats alike). */
function restoreGradients(t: LoraTrainer, before: Map<string, Float32Array> | null): void {
  for (const [k, g] of t.accumulatedGradients() ?? []) {
    const kept = before?.get(k);
    if (kept) g.set(kept);
    else g.fill(0);
  }
}

function nonFiniteGradient(t: LoraTrainer): string | null {
  for (const [k, g] of t.accumulatedGradients() ?? []) {
    for (let i = 0; i < g.length; i++) if (!Number.isFinite(g[i]!)) return `the gradient of ${k} holds ${g[i]}`;
  }
  return null;
}

/** The checkpoint record's summary of adapter_config.json. */
function adapterConfigOf(t: LoraTrainer): Record<string, unknown> {
  const { r, lora_alpha, target_modules, rank_pattern, alpha_pattern, base_model_name_or_path } = adapterConfig(t.adapter, t.engine.sites, t.engine.modelName);
  return { r, lora_alpha, target_modules, rank_pattern, alpha_pattern, base_model_name_or_path };
}

function seedOf(runId: string): number {
  return createHash('sha256').update(runId).digest().readUInt32LE(0);
}
