import type { TopCut } from './draw-feeds.js';
import { Decoding, type RowStep } from './engine-decode.js';
import { GraphTurns, type GraphBuildEvent } from './engine-graphs.js';
import { Prefill, type SequenceStart } from './engine-prefill.js';
import { InlineRunner, WorkerRunner, type Runner } from './engine-runner.js';
import { Scoring, type BackwardResult } from './engine-scoring.js';
import { SamplingStreams } from './engine-streams.js';
import { WARM_UP_KINDS } from './engine-warm-up.js';
import type { DecodeRow, DecodeState, ScoredSequence, TopTokens } from './feeds.js';
import { LongSequences } from './long-sequences.js';
import type { LoraAdapter } from './lora.js';
import { DECODE_KINDS, DEFAULT_DIMS, loraSites, type GraphKind, type LoraSite, type ModelDims } from './transformer.js';

export { DeviceUnavailableError } from './device-error.js';
export type { TopCut } from './draw-feeds.js';
export type { RowStep } from './engine-decode.js';
export type { GraphBuildEvent } from './engine-graphs.js';
export type { SequenceStart } from './engine-prefill.js';
export type { BackwardResult } from './engine-scoring.js';
export type { DecodeRow, DecodeState, RowCache, ScoredSequence, TopTokens } from './feeds.js';

export type Device = 'cpu' | 'cuda';

export interface EngineOptions {
  device?: Device;
  /** Threads for one graph run (default: every core). */
  threads?: number;
  /** Rows an adapter version decodes in batches before its unembedding is packed into a session of its own (see GraphRunner.packedSession). */
  packAfterBatchedRows?: number;
  /** Largest number of (padded) positions in one graph run; longer batches are split, and a longer sequence is scored in blocks. */
  maxPositionsPerRun?: number;
  /**
   * Largest number of scored positions in one graph run (default: LOGIT_FLOATS_PER_RUN ÷ vocabulary, 512 at
   * Qwen's 151,669 tokens): the logits of a run are that many vocabulary-sized rows, and a backward run holds
   * a few of them at once.
   */
  maxScoredPerRun?: number;
  /** Attention scores one block of a long sequence may hold per layer, in floats (default 8M: 32 MB). */
  attentionFloatsPerRun?: number;
  /** Model width etc.; tests use smaller ones. */
  dims?: Partial<Omit<ModelDims, 'vocab'>>;
  /** Largest LoRA rank on the unembedding (default DEFAULT_UNEMBEDDING_RANK); a run's rank above it is capped there. */
  unembeddingRank?: number;
  /**
   * Whether work of different adapters (runs, samplers) that reaches the engine together shares graph runs
   * (default true): each row with its own adapter, results equal alone to float32 rounding. false: each
   * adapter's work runs apart, bit-reproducible whatever else runs.
   */
  batchRuns?: boolean;
  /**
   * Where graphs run: 'worker' (default) on a worker thread of this engine, so the caller's event loop never
   * waits on compute; 'inline' on the calling thread (simpler to debug, blocks while computing).
   */
  thread?: 'worker' | 'inline';
  /** Where onnxruntime's optimized graphs are kept between processes (models/optimized-models.ts); absent or null: optimized each time. */
  cacheDir?: string | null;
}

/**
 * Logits one scoring run may hold, in floats: 512 rows of Qwen's vocabulary (311 MB). A backward run holds
 * about three such tensors at its peak, so a 4,096-token forward_backward peaks near 1.7 GB resident
 * (bench/memory.ts); a larger vocabulary gets fewer rows per run, never more memory.
 */
const LOGIT_FLOATS_PER_RUN = 512 * 151_669;

/** Checks that a device can run graphs, with a tiny model; throws DeviceUnavailableError if not. */
export async function probeDevice(device: Device): Promise<void> {
  if (device === 'cpu') return;
  const engine = new ModelEngine('device-probe', 8, { device, dims: { dModel: 8, heads: 2, ffn: 8, layers: 1 } });
  try {
    await engine.warm(['forward']);
  } finally {
    await engine.close();
  }
}

/**
 * One base model's compute: its weights, and one onnxruntime session per graph kind, shared by every run on
 * that base model. Each run's LoRA tensors are fed as inputs (multi-LoRA on one base, as the real service).
 * This class is the engine's face: it builds its parts and hands each call to one of them.
 * - GraphTurns (engine-graphs.ts): one graph run at a time on the runner, the runs counted, first builds told;
 * - Scoring (engine-scoring.ts): forward, topk and backward, chunks of concurrent calls sharing runs;
 * - LongSequences (long-sequences.ts): a sequence too long for one run, block by block;
 * - Prefill (engine-prefill.ts) and Decoding (engine-decode.ts): a sample's prompt, then its steps;
 * - SamplingStreams (engine-streams.ts): the streams decoding and the clients about to return, which
 *   the sampling batches wait for; warmUp builds the sessions of WARM_UP_KINDS (engine-warm-up.ts) ahead.
 */
export class ModelEngine {
  readonly dims: ModelDims;
  readonly sites: LoraSite[];
  /** Where graphs run: a worker thread, or inline. */
  private readonly runner: Runner;
  private readonly graphs: GraphTurns;
  private readonly scoring: Scoring;
  private readonly streams = new SamplingStreams();
  private readonly prefill: Prefill;
  private readonly decoding: Decoding;

  constructor(
    readonly modelName: string,
    vocab: number,
    options: EngineOptions = {},
  ) {
    this.dims = { vocab, ...DEFAULT_DIMS, ...options.dims };
    const batchRuns = options.batchRuns ?? true;
    this.sites = loraSites(this.dims, options.unembeddingRank);
    const limits = { positions: options.maxPositionsPerRun ?? 512, scored: options.maxScoredPerRun ?? Math.max(16, Math.floor(LOGIT_FLOATS_PER_RUN / vocab)) };
    // Blocks of a long sequence: as many positions as one run may score, fewer where keys grow long.
    const attentionFloats = options.attentionFloatsPerRun ?? 8 * 2 ** 20;
    const config = {
      modelName,
      dims: this.dims,
      device: options.device ?? 'cpu',
      threads: options.threads,
      packAfterBatchedRows: options.packAfterBatchedRows,
      cacheDir: options.cacheDir ?? null,
    };
    // onnxruntime is loaded only where graphs run: in the worker, or here on first use when inline.
    this.runner = options.thread === 'inline' ? new InlineRunner(config) : new WorkerRunner(config);
    this.graphs = new GraphTurns(this.runner, modelName, this.dims, this.sites);
    const long = new LongSequences(this.graphs, this.dims, this.sites, { positions: limits.scored, attentionFloats });
    this.scoring = new Scoring(this.graphs, long, this.dims, this.sites, limits, attentionFloats, batchRuns);
    // A prompt needs no logits but its last position's: blocks as long as a run's positions allow.
    this.prefill = new Prefill(this.graphs, this.streams, this.dims, { positions: limits.positions, attentionFloats }, batchRuns);
    this.decoding = new Decoding(this.graphs, this.streams, this.dims, batchRuns);
  }

  /** Stops the engine's worker thread. */
  async close(): Promise<void> {
    await this.runner.close?.();
  }

  /** Loads every session now rather than at first use (a server warming up). */
  async warm(kinds: GraphKind[] = ['forward', 'backward', ...DECODE_KINDS]): Promise<void> {
    await this.runner.prebuild(kinds);
  }

  /**
   * Builds each graph the guides' flows use (WARM_UP_KINDS) on the runner's thread, so that a client's first
   * call of each costs what its later ones do; a client's runs go in between the builds. `signal` stops it
   * before its next build.
   */
  async warmUp(signal?: AbortSignal): Promise<void> {
    await this.graphs.buildAhead(WARM_UP_KINDS, signal);
  }

  /** Logprob of each target token, per sequence. */
  forward(seqs: ScoredSequence[], adapter: LoraAdapter): Promise<Float32Array[]> {
    return this.scoring.forward(seqs, adapter);
  }

  /**
   * For each sequence: the target logprobs of its scored positions (all by default), and at each of them the k
   * most likely tokens with their logprobs (an empty row at every other position). The top-k is taken in the
   * graph, over the log-softmax the logprobs come from: only k values per scored position leave it.
   */
  topk(seqs: ScoredSequence[], adapter: LoraAdapter, k: number): Promise<{ logprobs: Float32Array[]; top: TopTokens[][] }> {
    return this.scoring.topk(seqs, adapter, k);
  }

  /** Logprobs and the gradient of Σ_t cotangent_t·logprob_t for every LoRA tensor, summed over all sequences. */
  backward(seqs: ScoredSequence[], adapter: LoraAdapter, cotangents: Float32Array[]): Promise<BackwardResult> {
    return this.scoring.backward(seqs, adapter, cotangents);
  }

  /**
   * Runs the decode graph on `tokens` ([batch][n], all rows the same length)
   * after the cached positions in `state`; returns, for the last position,
   * the log-softmax of logits × `invTemperature` and its exp ([batch × vocab]
   * each), and the grown cache.
   */
  decode(
    tokens: number[][],
    adapter: LoraAdapter,
    state: DecodeState | null,
    invTemperature = 1,
  ): Promise<{ logprobs: Float32Array; probs: Float32Array; state: DecodeState }> {
    return this.decoding.decode(tokens, adapter, state, invTemperature);
  }

  /**
   * Prefills one prompt and gives what its first tokens are chosen from:
   * with `draws`, the graph draws `draws.length` tokens itself, one per
   * uniform number (negative: the most likely token, for every draw), and
   * only they and their logprobs come back; without, the whole next-token
   * distribution. A top_p draw (no top-k) takes a second number per draw,
   * in `retries` (see DecodeRow.retry). Prompts that arrive while the engine is busy are prefilled
   * together in one graph run (rows of different lengths, padded and masked).
   */
  startSequence(
    tokens: number[],
    adapter: LoraAdapter,
    invTemperature: number,
    draws: number[] | null,
    cut: TopCut | null = null,
    retries: number[] | null = null,
  ): Promise<SequenceStart> {
    return this.prefill.start(tokens, adapter, invTemperature, draws, cut, retries);
  }

  /**
   * One decode step for independent rows, each with its own cache: rows from
   * concurrent requests on the same adapter are gathered into one graph run
   * (continuous batching), caches padded to the longest and masked.
   */
  decodeRows(rows: DecodeRow[], adapter: LoraAdapter, invTemperature: number, cut: TopCut | null = null): Promise<RowStep[]> {
    return this.decoding.step(rows, adapter, invTemperature, cut);
  }

  /** Marks a sampling stream as decoding until the returned function is called. */
  openStream(): () => void {
    return this.streams.openStream();
  }

  /** Graph runs so far, and how many of them held rows of several adapters (concurrent runs or samplers batched together). */
  get graphRuns(): { readonly total: number; readonly mixed: number } {
    return this.graphs.graphRuns;
  }

  /** Told when a graph kind is first built and run on this engine (EnginePool.onGraphBuild). */
  get onGraphBuild(): ((event: GraphBuildEvent) => void) | undefined {
    return this.graphs.onGraphBuild;
  }

  set onGraphBuild(listener: ((event: GraphBuildEvent) => void) | undefined) {
    this.graphs.onGraphBuild = listener;
  }

  /**
   * Told after each heavy run (a block of a long sequence, or a decode step after long caches, each step
   * copying them): megabytes of its buffers are garbage soon after (EnginePool.onLongSequence).
   */
  get onLongSequence(): (() => void) | undefined {
    return this.graphs.onLongSequence;
  }

  set onLongSequence(listener: (() => void) | undefined) {
    this.graphs.onLongSequence = listener;
  }
}
