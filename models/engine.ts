import { BatchQueue, flushSoon } from './batch-queue.js';
import { InlineRunner, WorkerRunner, type Runner } from './engine-runner.js';
import { blockSequence, blocksOf, SequenceCache, type Block } from './blocks.js';
import { cotangentFeed, feed, fitsOneRun, grownCaches, loraFeeds, ownCotangentFeeds, positionsOf, promptFeeds, rowCache, scoringUnits, sequenceFeeds, stepFeeds, topkRows, unpad, type DecodeRow, type DecodeState, type RowCache, type ScoredSequence, type ScoringLimits, type TopTokens } from './feeds.js';
import { freshAdapter, siteRank, versionKey, type LoraAdapter } from './lora.js';
import { columnsOf, memberGrads } from './side-by-side.js';
import type { Feed } from './runner-protocol.js';
import { DECODE_KINDS, DEFAULT_DIMS, layerSites, loraSites, MIXED_SLOTS, NUCLEUS_TESTS_UP_TO, type GraphKind, type LoraSite, type ModelDims } from './transformer.js';

export { DeviceUnavailableError } from './device-error.js';
export type { DecodeRow, DecodeState, RowCache, ScoredSequence, TopTokens } from './feeds.js';

export type Device = 'cpu' | 'cuda';

/** A graph kind's first use on an engine: its session is built then, which takes a moment on a cold engine. */
export interface GraphBuildEvent {
  model: string;
  kind: GraphKind;
  /** The kind's mixed-adapter graph (rows of several adapters in one run). */
  mixed: boolean;
  phase: 'start' | 'done';
  /** With `done`: building and the first run together. */
  ms?: number;
}

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
}

export interface BackwardResult {
  logprobs: Float32Array[];
  /** Gradient of Σ cotangent·logprob for each LoRA tensor, keyed `<site>.A` / `<site>.B`. */
  grads: Map<string, Float32Array>;
}

/** A prompt after its prefill: the first tokens drawn in the graph (one per draw asked), or the distribution to choose from. */
export interface SequenceStart {
  drawn?: { token: number; logprob: number }[];
  logprobs?: Float32Array;
  probs?: Float32Array;
  cache: RowCache;
}

/** One row after a decode step: the token drawn in the graph, or the distribution to choose from. */
export interface RowStep {
  drawn?: { token: number; logprob: number };
  logprobs?: Float32Array;
  probs?: Float32Array;
  cache: RowCache;
}

/** Requests gathered into one batch at most (prompts, or decode steps). */
const MAX_BATCH_REQUESTS = MIXED_SLOTS;
/** How long a decode batch waits for sampling streams still choosing their tokens, and a prefill for returning clients. */
const BATCH_WAIT_MS = 3;
/** A sampling stream that ended this recently counts as a client about to send its next prompt. */
const RETURN_WINDOW_MS = 10;
/**
 * Logits one scoring run may hold, in floats: 512 rows of Qwen's vocabulary (311 MB). A backward run holds
 * about three such tensors at its peak, so a 4,096-token forward_backward peaks near 1.7 GB resident
 * (bench/memory.ts); a larger vocabulary gets fewer rows per run, never more memory.
 */
const LOGIT_FLOATS_PER_RUN = 512 * 151_669;
/**
 * A run holding a tensor of more floats than this (scored rows × vocabulary, or attention scores) is heavy:
 * 4M floats is 16 MB, about 28 scored rows at Qwen's vocabulary. The guide's campaign runs stay below it.
 */
const HEAVY_FLOATS = 4 * 2 ** 20;
/** Keys and values a run reads above this many floats (1 MB, ~1,000 positions): a long sequence's (see heavy). */
const LONG_CACHE_FLOATS = 256 * 1024;
/** Padded positions a run of several calls' chunks may hold (see joinable). */
const JOINED_POSITIONS = 4096;
/**
 * Score slots a run of several calls' chunks may hold: 64 rows of Qwen's vocabulary are 39 MB a tensor, and a
 * backward run holds about ten such at its peak. Such runs are heavy (HEAVY_FLOATS): their sessions, and
 * that memory, go back once a burst of concurrent steps is over. Larger batches ran no faster.
 */
const JOINED_SCORED = 64;
/** From this many scored positions in one run on, the merged unembedding is cheaper (about the model width). */
const MERGE_FROM_POSITIONS = 64;

/** The decode graphs: the whole next-token distribution back, a token drawn in the graph, or the most likely one. */
type StepKind = 'decode' | 'draw' | 'draw_top' | 'draw_nucleus' | 'draw_nucleus_wide' | 'greedy';

/**
 * A draw among the `topK` most likely tokens (0: all), cut again to the `topP` nucleus of their mass (1:
 * none): drawn in the graph (draw_top with a top-k, draw_nucleus without; draw_nucleus_wide for a prompt's many draws).
 */
export interface TopCut {
  topK: number;
  topP: number;
}

const cutKind = (cut: TopCut, draws = 1): StepKind => (cut.topK > 0 ? 'draw_top' : draws > NUCLEUS_TESTS_UP_TO ? 'draw_nucleus_wide' : 'draw_nucleus');
const isNucleus = (kind: StepKind) => kind === 'draw_nucleus' || kind === 'draw_nucleus_wide';

/** A prompt waiting for its prefill (see startSequence). */
interface PromptRequest {
  tokens: number[];
  adapter: LoraAdapter;
  invTemperature: number;
  kind: StepKind;
  draws: number[] | null;
  /** A top_p draw's second uniform numbers, one per draw (see DecodeRow.retry). */
  retries: number[] | null;
  cut: TopCut | null;
}

/** One sampling stream's rows waiting for their next decode step (see decodeRows). */
interface RowsRequest {
  rows: DecodeRow[];
  adapter: LoraAdapter;
  invTemperature: number;
  cut: TopCut | null;
}

/** One chunk of one call's scoring (it fits one graph run), waiting for a run it may share with other runs' chunks. */
interface ScoringRequest {
  kind: 'forward' | 'backward';
  seqs: ScoredSequence[];
  adapter: LoraAdapter;
  /** backward: one per sequence. */
  cotangents?: Float32Array[];
}

/** A chunk's logprobs (one per sequence), and with backward its adapter's gradients (`grad.<site>.A` / `.B`). */
interface ScoringResult {
  logprobs: Float32Array[];
  grads?: Record<string, Float32Array>;
}

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
 * One base model's compute: its weights, and one onnxruntime session per
 * graph kind, shared by every run on that base model. Each run's LoRA
 * tensors are fed as inputs (multi-LoRA on one base, as the real service).
 */
export class ModelEngine {
  readonly dims: ModelDims;
  readonly sites: LoraSite[];
  private readonly runner: Runner;
  /** What one scoring run may hold; a sequence over it is scored in blocks (models/blocks.ts). */
  private readonly limits: ScoringLimits;
  /** Blocks of a long sequence or prompt: as many positions as one run may score, fewer where keys grow long. */
  private readonly blockLimits: { positions: number; attentionFloats: number };
  /** The scoring graphs' outputs of a block's keys and values, per layer k then v. */
  private readonly blockKv: string[];
  private readonly pastGrads: string[];
  /** Every LoRA gradient's output name, `grad.<site>.A` / `.B` in site order; and the layer sites', which a mixed-adapter run puts side by side. */
  private readonly gradNames: string[];
  private readonly layerSites: LoraSite[];
  private readonly layerGradNames: string[];
  /** The decode graphs' cache outputs, per layer k then v. */
  private readonly presents: string[];
  /** Graph runs of one engine are serialised: onnxruntime sessions already use every core. */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly batchRuns: boolean;
  /** Sampling streams in their decode loop: a decode batch waits (briefly) for each of them to send its next step. */
  private streams = 0;

  /**
   * Each scoring chunk queues one turn; the first turn to come takes every chunk of its kind waiting by then
   * that fits one run, whatever its run: concurrent runs' training steps share graph runs (each row with its
   * own adapter) rather than wait for each other's.
   */
  private readonly scoring = new BatchQueue<ScoringRequest, ScoringResult>({
    keyOf: (r) => r.kind,
    maxBatch: MAX_BATCH_REQUESTS,
    // One adapter's backward chunks of two calls stay apart: their gradients must.
    fits: (taken, next) => this.batchRuns && !(next.kind === 'backward' && taken.some((r) => versionKey(r.adapter) === versionKey(next.adapter))) && this.joinable([...taken, next].flatMap((r) => r.seqs)),
    run: (batch) => this.scoreTogether(batch),
    schedule: (queue) => void this.inTurn(() => queue.runBatch()),
  });

  /**
   * When sampling streams ended, oldest first, less one for each prompt that came since: each is likely a
   * client about to send its next prompt (an RL loop's samplers finish a step together and come back together).
   * Which prompt is whose is not known: a stream whose client never came back would make the next lone client
   * wait for itself, so a wait that runs out forgets them all.
   */
  private readonly returning: number[] = [];

  private returningClients(): number {
    const since = performance.now() - RETURN_WINDOW_MS;
    while (this.returning.length && this.returning[0]! < since) this.returning.shift();
    return this.returning.length;
  }

  /**
   * Prompts gather until the next turn of the event loop, and wait a little for clients whose streams just
   * ended: otherwise the first prompt back is prefilled alone, the others after it, and the streams that
   * finished one step together decode out of step from then on (fewer rows a step, more steps).
   */
  private readonly prompts: BatchQueue<PromptRequest, SequenceStart> = new BatchQueue<PromptRequest, SequenceStart>({
    keyOf: (p) => this.batchKey(p.adapter, p.kind, p.cut),
    maxBatch: MAX_BATCH_REQUESTS,
    run: (batch) => this.inTurn(() => this.prefill(batch)),
    schedule: flushSoon(() => this.prompts.size + this.returningClients(), BATCH_WAIT_MS, () => { this.returning.length = 0; }),
  });

  /** Decode steps gather until the next turn of the event loop, and wait a little for streams still choosing. */
  private readonly steps = new BatchQueue<RowsRequest, RowStep[]>({
    keyOf: (r) => this.batchKey(r.adapter, stepKind(r), r.cut),
    maxBatch: MAX_BATCH_REQUESTS,
    run: (batch) => this.stepRows(batch),
    schedule: flushSoon(() => this.streams, BATCH_WAIT_MS),
  });

  constructor(readonly modelName: string, vocab: number, options: EngineOptions = {}) {
    this.dims = { vocab, ...DEFAULT_DIMS, ...options.dims };
    this.batchRuns = options.batchRuns ?? true;
    this.sites = loraSites(this.dims, options.unembeddingRank);
    this.presents = Array.from({ length: this.dims.layers }, (_, l) => [`present_k.${l}`, `present_v.${l}`]).flat();
    this.limits = { positions: options.maxPositionsPerRun ?? 512, scored: options.maxScoredPerRun ?? Math.max(16, Math.floor(LOGIT_FLOATS_PER_RUN / vocab)) };
    this.blockLimits = { positions: this.limits.scored, attentionFloats: options.attentionFloatsPerRun ?? 8 * 2 ** 20 };
    this.blockKv = Array.from({ length: this.dims.layers }, (_, l) => [`block_k.${l}`, `block_v.${l}`]).flat();
    this.pastGrads = Array.from({ length: this.dims.layers }, (_, l) => [`grad.past_k.${l}`, `grad.past_v.${l}`]).flat();
    const gradNames = (sites: LoraSite[]) => sites.flatMap((s) => [`grad.${s.key}.A`, `grad.${s.key}.B`]);
    this.gradNames = gradNames(this.sites);
    this.layerSites = layerSites(this.sites);
    this.layerGradNames = gradNames(this.layerSites);
    const config = { modelName, dims: this.dims, device: options.device ?? 'cpu', threads: options.threads, packAfterBatchedRows: options.packAfterBatchedRows };
    // onnxruntime is loaded only where graphs run: in the worker, or here on first use when inline.
    this.runner = options.thread === 'inline' ? new InlineRunner(config) : new WorkerRunner(config);
  }

  /** Requests that may share one graph run: the same decode graph, whatever their adapters (see rowAdapters) unless batchRuns is off. */
  private batchKey(adapter: LoraAdapter, kind: GraphKind, cut: TopCut | null): string {
    // The k of a top-k draw is one number per graph run; each row brings its own top_p.
    const graph = `${kind}${kind === 'draw_top' ? `:${cut!.topK}` : ''}`;
    return this.batchRuns ? graph : `${versionKey(adapter)}:${graph}`;
  }

  /** Stops the engine's worker thread. */
  async close(): Promise<void> {
    await this.runner.close?.();
  }

  /** Loads every session now rather than at first use (a server warming up). */
  async warm(kinds: GraphKind[] = ['forward', 'backward', ...DECODE_KINDS]): Promise<void> {
    for (const k of kinds) await this.runner.warm(k);
  }

  /**
   * Builds the graphs a train-and-sample loop uses and runs each once on a few tokens (a first run sizes
   * onnxruntime's buffers), so that a client's first step costs what its later ones do.
   */
  async warmUp(): Promise<void> {
    const adapter = freshAdapter(this.sites, 4, 8, 'warm-up');
    const seq = { tokens: [1, 2, 3], targets: [2, 3, 4] };
    // Short batches score through the unembedding and LoRA apart, long ones through their merged weight.
    const long = { tokens: Array.from({ length: MERGE_FROM_POSITIONS }, (_, i) => i + 1), targets: Array.from({ length: MERGE_FROM_POSITIONS }, (_, i) => i + 2) };
    for (const s of [seq, long]) {
      await this.forward([s], adapter);
      await this.backward([s], adapter, [new Float32Array(s.tokens.length).fill(1)]);
    }
    for (const draw of [0.5, -1]) {
      const start = await this.startSequence(seq.tokens, adapter, 1, [draw]);
      await this.decodeRows([{ token: 4, cache: start.cache, draw }], adapter, 1);
    }
  }

  /** Logprob of each target token, per sequence. */
  async forward(seqs: ScoredSequence[], adapter: LoraAdapter): Promise<Float32Array[]> {
    const out: Float32Array[] = [];
    for (const { seqs: chunk, long } of scoringUnits(seqs, this.limits)) {
      if (long) {
        out.push((await this.scoreBlocks(chunk[0]!, adapter, 'forward')).logprobs);
        continue;
      }
      // Nothing scored (a lone token, or every target -100): every logprob is 0 and no graph needs to run.
      if (chunk.every((s) => s.scored?.length === 0)) {
        out.push(...chunk.map((s) => new Float32Array(s.tokens.length)));
        continue;
      }
      out.push(...(await this.scoring.push({ kind: 'forward', seqs: chunk, adapter })).logprobs);
    }
    return out;
  }

  /**
   * For each sequence: the target logprobs of its scored positions (all by default), and at each of them the k
   * most likely tokens with their logprobs (an empty row at every other position). The top-k is taken in the
   * graph, over the log-softmax the logprobs come from: only k values per scored position leave it.
   */
  async topk(seqs: ScoredSequence[], adapter: LoraAdapter, k: number): Promise<{ logprobs: Float32Array[]; top: TopTokens[][] }> {
    const logprobs: Float32Array[] = [];
    const top: TopTokens[][] = [];
    for (const { seqs: chunk, long } of scoringUnits(seqs, this.limits)) {
      if (long) {
        const scored = await this.scoreBlocks(chunk[0]!, adapter, 'topk', k);
        logprobs.push(scored.logprobs);
        top.push(scored.top);
        continue;
      }
      const feeds = { ...sequenceFeeds(this.dims, chunk), k: feed('int64', BigInt64Array.from([BigInt(k)]), [1]) };
      const result = await this.run('topk', feeds, ['logprobs', 'topk_values', 'topk_indices'], adapter);
      logprobs.push(...unpad(result.logprobs!, chunk));
      top.push(...topkRows(result.topk_values!, result.topk_indices! as unknown as BigInt64Array, chunk, k));
    }
    return { logprobs, top };
  }

  /** Logprobs and the gradient of Σ_t cotangent_t·logprob_t for every LoRA tensor, summed over all sequences. */
  async backward(seqs: ScoredSequence[], adapter: LoraAdapter, cotangents: Float32Array[]): Promise<BackwardResult> {
    const grads = new Map<string, Float32Array>();
    const logprobs: Float32Array[] = [];
    let start = 0;
    for (const { seqs: chunk, long } of scoringUnits(seqs, this.limits)) {
      const own = cotangents.slice(start, start + chunk.length);
      start += chunk.length;
      if (long) {
        logprobs.push(await this.backwardBlocks(chunk[0]!, adapter, own[0]!, grads));
        continue;
      }
      if (chunk.every((s) => s.scored?.length === 0)) {
        // Nothing scored: logprobs 0 and no gradient from this chunk.
        logprobs.push(...chunk.map((s) => new Float32Array(s.tokens.length)));
        continue;
      }
      const result = await this.scoring.push({ kind: 'backward', seqs: chunk, adapter, cotangents: own });
      logprobs.push(...result.logprobs);
      this.addGrads(grads, result.grads!);
    }
    for (const site of this.sites) {
      const r = siteRank(adapter.tensors.get(site.key)!, site);
      if (!grads.has(`${site.key}.A`)) grads.set(`${site.key}.A`, new Float32Array(site.inDim * r));
      if (!grads.has(`${site.key}.B`)) grads.set(`${site.key}.B`, new Float32Array(r * site.outDim));
    }
    return { logprobs, grads };
  }

  /**
   * Scoring chunks of one kind in one graph run, from a turn already taken in the engine's queue. One
   * adapter version (forward chunks of several calls may share one): its graph, as a call alone would run
   * it. Several: the mixed-adapter graph, each adapter's rows together, its gradients taken back apart.
   */
  private async scoreTogether(arrived: ScoringRequest[]): Promise<ScoringResult[]> {
    // Each adapter version once (a backward batch never holds one twice: see fits), and each row's.
    const { batch, adapters, slots, rowAdapters } = byAdapter(arrived, (r) => r.seqs.length);
    const { kind } = batch[0]!;
    const seqs = batch.flatMap((r) => r.seqs);
    const feeds = sequenceFeeds(this.dims, seqs);
    if (kind === 'backward') {
      const T = Math.max(...seqs.map((s) => s.tokens.length));
      Object.assign(feeds, { cotangent: cotangentFeed(seqs, batch.flatMap((r) => r.cotangents!)) }, ownCotangentFeeds(this.dims, seqs.length, T));
    }
    const grads = !rowAdapters ? this.gradNames : [...this.layerGradNames, ...adapters.flatMap((_, j) => [`grad.lm_head.A.${j}`, `grad.lm_head.B.${j}`])];
    const outputs = kind === 'backward' ? ['logprobs', ...grads] : ['logprobs'];
    const result = await this.runNow(kind, feeds, outputs, adapters, rowAdapters);
    // Every layer site has the adapter's rank (SideBySide checks): one site's ranks place every site's columns.
    const columns = kind === 'backward' && rowAdapters ? columnsOf(adapters.map((a) => siteRank(a.tensors.get(this.layerSites[0]!.key)!, this.layerSites[0]!))) : null;
    const logprobs = unpad(result.logprobs!, seqs);
    let at = 0;
    const results = batch.map((r, i): ScoringResult => {
      const own = logprobs.slice(at, at + r.seqs.length);
      at += r.seqs.length;
      if (kind === 'forward') return { logprobs: own };
      if (!rowAdapters) return { logprobs: own, grads: result };
      const j = slots[i]!;
      const ownGrads = memberGrads(this.layerSites, columns!, j, result);
      ownGrads['grad.lm_head.A'] = result[`grad.lm_head.A.${j}`]!;
      ownGrads['grad.lm_head.B'] = result[`grad.lm_head.B.${j}`]!;
      return { logprobs: own, grads: ownGrads };
    });
    return inArrivalOrder(arrived, batch, results);
  }

  /**
   * Whether chunks of different calls may share one run: short sequences only (their attention is small,
   * so more padded positions than one call's chunk may hold), and at most JOINED_SCORED score slots, about
   * where a vocabulary-sized pass stops getting cheaper per row; one call's own chunk may hold more.
   */
  private joinable(seqs: ScoredSequence[]): boolean {
    const T = Math.max(...seqs.map((s) => s.tokens.length));
    const attention = seqs.length * this.dims.heads * T * T;
    const limits = { positions: JOINED_POSITIONS, scored: Math.min(this.limits.scored, JOINED_SCORED) };
    return attention <= this.blockLimits.attentionFloats && fitsOneRun(seqs, limits);
  }

  /** Adds a run's LoRA gradients into `grads` (by `<site>.A` / `<site>.B`). */
  private addGrads(grads: Map<string, Float32Array>, result: Record<string, Float32Array>): void {
    for (const name of this.gradNames) {
      const key = name.slice('grad.'.length);
      const g = result[name]!;
      const acc = grads.get(key);
      if (!acc) grads.set(key, g);
      else for (let i = 0; i < acc.length; i++) acc[i]! += g[i]!;
    }
  }

  /**
   * Scores one long sequence block by block, each block attending to the
   * keys and values of those before it. Blocks after the last scored
   * position are not run (forward); topk scores every position.
   */
  private async scoreBlocks(seq: ScoredSequence, adapter: LoraAdapter, kind: 'forward' | 'topk', k = 0, keysForBackward = false): Promise<{ logprobs: Float32Array; top: TopTokens[]; cache: SequenceCache; blocks: Block[] }> {
    const lastScored = Math.max(-1, ...positionsOf(seq));
    const blocks = blocksOf(seq.tokens.length, this.dims.heads, this.blockLimits).filter(([start]) => start <= lastScored);
    const cache = new SequenceCache(this.dims, seq.tokens.length);
    const logprobs = new Float32Array(seq.tokens.length);
    const top: TopTokens[] = kind === 'topk' ? Array.from({ length: seq.tokens.length }, () => ({ ids: [], logprobs: [] })) : [];
    // For a backward pass only the keys and values before the last block are needed: no block reads the last one's.
    for (const block of keysForBackward ? blocks.slice(0, -1) : blocks) {
      const part = blockSequence(seq, block);
      const feeds = sequenceFeeds(this.dims, [part], cache.past(block[0]));
      if (kind === 'topk') feeds.k = feed('int64', BigInt64Array.from([BigInt(k)]), [1]);
      // A backward pass takes every block's logprobs from its own backward run: here only the keys and values.
      const result = await this.run(kind, feeds, [...(keysForBackward ? [] : ['logprobs']), ...this.blockKv, ...(kind === 'topk' ? ['topk_values', 'topk_indices'] : [])], adapter);
      if (!keysForBackward) logprobs.set(unpad(result.logprobs!, [part])[0]!, block[0]);
      if (kind === 'topk') topkRows(result.topk_values!, result.topk_indices! as unknown as BigInt64Array, [part], k)[0]!.forEach((row, i) => { if (row.ids.length) top[block[0] + i] = row; });
      this.blockKv.forEach((name, i) => cache.write(i, block[0], result[name]!));
    }
    return { logprobs, top, cache, blocks };
  }

  /**
   * The backward pass of one long sequence: a forward pass through its
   * blocks but the last for their keys and values, then the blocks in reverse, each
   * given what later blocks' losses owe to its keys and values and handing
   * on what its own losses owe to earlier ones. Returns the logprobs; adds
   * the LoRA gradients into `grads`.
   */
  private async backwardBlocks(seq: ScoredSequence, adapter: LoraAdapter, cotangent: Float32Array, grads: Map<string, Float32Array>): Promise<Float32Array> {
    const { logprobs, cache, blocks } = await this.scoreBlocks(seq, adapter, 'forward', 0, true);
    const owed = new SequenceCache(this.dims, seq.tokens.length);
    for (const block of [...blocks].reverse()) {
      const [start, end] = block;
      const part = blockSequence(seq, block);
      const feeds = {
        ...sequenceFeeds(this.dims, [part], cache.past(start)),
        cotangent: cotangentFeed([part], [cotangent.subarray(start, end)]),
        ...ownCotangentFeeds(this.dims, 1, end - start, owed.tensors.map((_, i) => owed.read(i, start, end))),
      };
      const result = await this.run('backward', feeds, ['logprobs', ...this.gradNames, ...this.pastGrads], adapter);
      // The logprobs of every block from its backward run (the last block had no forward run).
      logprobs.set(unpad(result.logprobs!, [part])[0]!, start);
      this.addGrads(grads, result);
      if (start > 0) this.pastGrads.forEach((name, i) => owed.write(i, 0, result[name]!, true));
    }
    return logprobs;
  }

  /**
   * Runs the decode graph on `tokens` ([batch][n], all rows the same length)
   * after the cached positions in `state`; returns, for the last position,
   * the log-softmax of logits × `invTemperature` and its exp ([batch × vocab]
   * each), and the grown cache.
   */
  async decode(tokens: number[][], adapter: LoraAdapter, state: DecodeState | null, invTemperature = 1): Promise<{ logprobs: Float32Array; probs: Float32Array; state: DecodeState }> {
    const B = tokens.length;
    const Tq = tokens[0]!.length;
    const P = state?.length ?? 0;
    const feeds = promptFeeds(this.dims, tokens, Array(B).fill(invTemperature), state);
    const result = await this.run('decode', feeds, ['logprobs', 'probs', ...this.presents], adapter);
    return { logprobs: result.logprobs!, probs: result.probs!, state: { past: this.presents.map((n) => result[n]!), batch: B, length: P + Tq } };
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
  startSequence(tokens: number[], adapter: LoraAdapter, invTemperature: number, draws: number[] | null, cut: TopCut | null = null, retries: number[] | null = null): Promise<SequenceStart> {
    const kind = draws === null ? 'decode' : draws[0]! < 0 ? 'greedy' : cut ? cutKind(cut, draws.length) : 'draw';
    if (isNucleus(kind) && retries?.length !== draws!.length) throw new Error('a top_p draw needs one retry number per draw');
    // This prompt is one of the clients counted as returning (stale ones dropped first, so it takes a fresh one).
    if (this.returningClients()) this.returning.shift();
    return this.prompts.push({ tokens, adapter, invTemperature, kind, draws, retries, cut: kind === 'draw_top' || isNucleus(kind) ? cut : null });
  }

  /** Prefills prompts of one key, from a turn already taken in the queue: short ones in one graph run, long ones in blocks. */
  private async prefill(batch: PromptRequest[]): Promise<SequenceStart[]> {
    const long = (p: PromptRequest) => p.tokens.length > this.limits.positions;
    if (!batch.some(long)) return this.prefillRows(batch, null);
    const starts = new Map<PromptRequest, SequenceStart>();
    const short = batch.filter((p) => !long(p));
    if (short.length) (await this.prefillRows(short, null)).forEach((start, i) => starts.set(short[i]!, start));
    for (const p of batch.filter(long)) starts.set(p, await this.prefillBlocks(p));
    return batch.map((p) => starts.get(p)!);
  }

  /** A long prompt's keys and values block by block, then its first tokens from the last block. */
  private async prefillBlocks(p: PromptRequest): Promise<SequenceStart> {
    // No logits but the last position's: blocks as long as a run's positions allow.
    const blocks = blocksOf(p.tokens.length, this.dims.heads, { ...this.blockLimits, positions: this.limits.positions });
    let state: DecodeState | null = null;
    for (const [start, end] of blocks.slice(0, -1)) {
      const feeds = promptFeeds(this.dims, [p.tokens.slice(start, end)], [p.invTemperature], state);
      // Only the last block's draws are kept: the others draw once, at any number.
      if (p.kind === 'draw' || p.cut) Object.assign(feeds, uniformFeeds(p.kind, [[{ u: 0.5, retry: 0.5 }]], 1));
      if (p.cut) Object.assign(feeds, cutFeeds(p.cut, [p.cut.topP]));
      const result = await this.runNow(p.kind, feeds, this.presents, [p.adapter]);
      state = { past: this.presents.map((n) => result[n]!), batch: 1, length: end };
    }
    return (await this.prefillRows([{ ...p, tokens: p.tokens.slice(blocks.at(-1)![0]) }], state))[0]!;
  }

  /** Prefills prompts in one graph run, after the cached positions of `state` (one prompt's earlier blocks) or none. */
  private async prefillRows(arrived: PromptRequest[], state: DecodeState | null): Promise<SequenceStart[]> {
    // Each adapter's rows together (a mixed-adapter run needs them so); the answers go back in arrival order.
    const { batch, adapters, rowAdapters } = byAdapter(arrived, () => 1);
    const { kind } = batch[0]!;
    const P = state?.length ?? 0;
    const feeds = promptFeeds(this.dims, batch.map((p) => p.tokens), batch.map((p) => p.invTemperature), state);
    const N = Math.max(...batch.map((p) => p.draws?.length ?? 0));
    const cut = batch[0]!.cut;
    if (kind === 'draw' || cut) Object.assign(feeds, uniformFeeds(kind, batch.map((p) => p.draws!.map((u, i) => ({ u, retry: p.retries?.[i] }))), N));
    if (cut) Object.assign(feeds, cutFeeds(cut, batch.map((p) => p.cut!.topP)));
    const outputs = kind === 'decode' ? ['logprobs', 'probs'] : ['token', 'token_logprob'];
    const result = await this.runNow(kind, feeds, [...outputs, ...this.presents], adapters, rowAdapters);
    const T = feeds.tokens!.dims[1]!;
    const { vocab } = this.dims;
    return inArrivalOrder(arrived, batch, batch.map((p, b) => {
      const cache = { past: this.presents.map((n) => rowCache(this.dims, result[n]!, b, P + T, P + p.tokens.length)), length: P + p.tokens.length };
      if (kind === 'decode') return { logprobs: result.logprobs!.subarray(b * vocab, (b + 1) * vocab), probs: result.probs!.subarray(b * vocab, (b + 1) * vocab), cache };
      const ids = result.token as unknown as BigInt64Array;
      const width = kind === 'greedy' ? 1 : N;
      const drawn = p.draws!.map((_, i) => {
        const at = b * width + (kind === 'greedy' ? 0 : i);
        return { token: Number(ids[at]!), logprob: result.token_logprob![at]! };
      });
      return { drawn, cache };
    }));
  }

  /**
   * One decode step for independent rows, each with its own cache: rows from
   * concurrent requests on the same adapter are gathered into one graph run
   * (continuous batching), caches padded to the longest and masked.
   */
  decodeRows(rows: DecodeRow[], adapter: LoraAdapter, invTemperature: number, cut: TopCut | null = null): Promise<RowStep[]> {
    // Refused here, before the rows can share a graph run with other requests' and fail theirs too.
    if (cut && !cut.topK && rows.some((r) => r.draw !== undefined && r.draw >= 0 && r.retry === undefined)) throw new Error('a top_p draw needs a retry number');
    return this.steps.push({ rows, adapter, invTemperature, cut: rows[0]?.draw !== undefined && rows[0].draw >= 0 ? cut : null });
  }

  /** Marks a sampling stream as decoding until the returned function is called. */
  openStream(): () => void {
    this.streams++;
    let open = true;
    return () => {
      if (open) { open = false; this.streams--; this.returning.push(performance.now()); }
    };
  }

  /** One decode step for the rows of requests of one key, in one graph run; each request gets its rows' steps. */
  private async stepRows(arrived: RowsRequest[]): Promise<RowStep[][]> {
    const { batch, adapters, rowAdapters } = byAdapter(arrived, (r) => r.rows.length);
    const rows = batch.flatMap((r) => r.rows);
    const { vocab } = this.dims;
    const feeds = stepFeeds(this.dims, rows, batch.flatMap((r) => r.rows.map(() => r.invTemperature)));
    const kind = stepKind(batch[0]!);
    const cut = batch[0]!.cut;
    if (kind === 'draw' || cut) Object.assign(feeds, uniformFeeds(kind, rows.map((r) => [{ u: r.draw!, retry: r.retry }]), 1));
    if (cut) Object.assign(feeds, cutFeeds(cut, batch.flatMap((r) => r.rows.map(() => r.cut!.topP))));
    const drawn = kind !== 'decode';
    const outputs = [...(drawn ? ['token', 'token_logprob'] : ['logprobs', 'probs']), ...this.presents];
    // A turn of the engine's queue, as every graph run takes: one graph at a time, in order with training work.
    const result = await this.inTurn(() => this.runNow(kind, feeds, outputs, adapters, rowAdapters));
    const caches = grownCaches(this.dims, this.presents.map((n) => result[n]!), rows);
    const steps = caches.map((cache, b): RowStep => {
      if (drawn) return { drawn: { token: Number((result.token as unknown as BigInt64Array)[b]!), logprob: result.token_logprob![b]! }, cache };
      return { logprobs: result.logprobs!.subarray(b * vocab, (b + 1) * vocab), probs: result.probs!.subarray(b * vocab, (b + 1) * vocab), cache };
    });
    let at = 0;
    return inArrivalOrder(arrived, batch, batch.map((r) => steps.slice(at, (at += r.rows.length))));
  }

  private run(kind: GraphKind, feeds: Record<string, Feed>, outputs: string[], adapter: LoraAdapter): Promise<Record<string, Float32Array>> {
    // (topk_indices and token come back as BigInt64Arrays; callers that read them say so.)
    return this.inTurn(() => this.runNow(kind, feeds, outputs, [adapter]));
  }

  /**
   * Whether a run's largest tensors are far above a usual one's (see HEAVY_FLOATS), or it decodes after long
   * caches (its arena would keep their size for good): it runs on a session released after use.
   */
  private heavy(feeds: Record<string, Feed>): boolean {
    const [B = 1, S = 0] = feeds.targets?.dims ?? [];
    const bias = feeds.attn_bias?.dims ?? [];
    const attention = this.dims.heads * (bias[0] ?? 0) * (bias[2] ?? 0) * (bias[3] ?? 0);
    const cached = (feeds['past_k.0']?.data.length ?? 0) * 2 * this.dims.layers;
    return B * S * this.dims.vocab > HEAVY_FLOATS || attention > HEAVY_FLOATS || cached > LONG_CACHE_FLOATS;
  }

  /** Runs `fn` after everything queued before it, whether that failed or not. */
  private inTurn<T>(fn: () => Promise<T>): Promise<T> {
    const turn = this.queue.then(fn);
    this.queue = turn.catch(() => undefined);
    return turn;
  }

  /** Runs a graph now: only from a turn already taken in the engine's queue. With `rowAdapters` (each row's index into `adapters`), the mixed-adapter graph. */
  private async runNow(kind: GraphKind, feeds: Record<string, Feed>, outputs: string[], adapters: LoraAdapter[], rowAdapters?: number[]): Promise<Record<string, Float32Array>> {
    // Many scored positions of one adapter: LoRA merged into the unembedding weight first (see GraphOptions).
    const scored = feeds.targets?.dims.reduce((p, n) => p * n, 1) ?? 0;
    const merged = !rowAdapters && !DECODE_KINDS.includes(kind) && scored >= MERGE_FROM_POSITIONS;
    // A graph kind's first run builds its session (seconds, on a cold engine): said, for a person waiting on it.
    const mixed = rowAdapters !== undefined;
    const graph = `${kind}${mixed ? ':mixed' : ''}`;
    const first = !this.ranKinds.has(graph);
    const started = first ? performance.now() : 0;
    if (first) {
      this.ranKinds.add(graph);
      this.onGraphBuild?.({ model: this.modelName, kind, mixed, phase: 'start' });
    }
    const heavy = this.heavy(feeds);
    this.graphRuns.total++;
    if (mixed) this.graphRuns.mixed++;
    const refs = adapters.map((a) => ({ id: a.id, version: a.version, feeds: loraFeeds(this.sites, a) }));
    // Mixed runs come only while several runs or samplers work at once: on sessions released once that is over,
    // so that the batches' larger buffers do not stay resident after a burst of concurrent work.
    const result = await this.runner.run({ kind, merged, heavy: heavy || mixed, feeds, outputs, adapters: refs, rowAdapters });
    if (first) this.onGraphBuild?.({ model: this.modelName, kind, mixed, phase: 'done', ms: performance.now() - started });
    if (heavy) this.onLongSequence?.();
    return Object.fromEntries(outputs.map((n) => [n, result[n]!.data as Float32Array]));
  }

  /** Graph kinds run so far, `<kind>` or `<kind>:mixed`. */
  private readonly ranKinds = new Set<string>();
  /** Graph runs so far, and how many of them held rows of several adapters (concurrent runs or samplers batched together). */
  readonly graphRuns = { total: 0, mixed: 0 };
  /** Told when a graph kind is first built and run on this engine (EnginePool.onGraphBuild). */
  onGraphBuild?: (event: GraphBuildEvent) => void;
  /**
   * Told after each heavy run (a block of a long sequence, or a decode step after long caches, each step
   * copying them): megabytes of its buffers are garbage soon after (EnginePool.onLongSequence).
   */
  onLongSequence?: () => void;
}

/**
 * A batch's requests with each adapter version's together, versions in order of first arrival (stable within
 * each): the batch in that order, its adapters, each request's index among them, and with several adapters
 * each row's (`rowsOf`: a request's rows), as a mixed-adapter run takes them.
 */
function byAdapter<T extends { adapter: LoraAdapter }>(arrived: T[], rowsOf: (request: T) => number): { batch: T[]; adapters: LoraAdapter[]; slots: number[]; rowAdapters?: number[] } {
  const groups = new Map<string, T[]>();
  for (const r of arrived) {
    const key = versionKey(r.adapter);
    const group = groups.get(key);
    if (group) group.push(r);
    else groups.set(key, [r]);
  }
  const lists = [...groups.values()];
  const batch = lists.flat();
  const slots = lists.flatMap((group, j) => group.map(() => j));
  const rowAdapters = lists.length > 1 ? batch.flatMap((r, i) => Array<number>(rowsOf(r)).fill(slots[i]!)) : undefined;
  return { batch, adapters: lists.map((group) => group[0]!.adapter), slots, rowAdapters };
}

/** Results computed in `batch`'s order (byAdapter), each handed back where its request arrived. */
function inArrivalOrder<T, R>(arrived: T[], batch: T[], results: R[]): R[] {
  const at = new Map(batch.map((r, i) => [r, i]));
  return arrived.map((r) => results[at.get(r)!]!);
}

/** Which decode graph serves a row: every row of one graph run shares it. */
function stepKind(r: RowsRequest): StepKind {
  const draw = r.rows[0]!.draw;
  return draw === undefined ? 'decode' : draw < 0 ? 'greedy' : r.cut ? cutKind(r.cut) : 'draw';
}

/** One draw's uniform numbers: `retry` only for a top_p draw (see DecodeRow.retry). */
interface Uniforms {
  u: number;
  retry?: number;
}

/**
 * The uniform numbers of a drawing graph run, `N` per row (rows with fewer padded at 0.5): `u`, and `u_retry`
 * for a top_p draw (startSequence and decodeRows see that each such draw brings one).
 */
function uniformFeeds(kind: StepKind, rows: Uniforms[][], N: number): Record<string, Feed> {
  const of = (pick: (d: Uniforms) => number) =>
    feed('float32', Float32Array.from({ length: rows.length * N }, (_, i) => { const d = rows[Math.floor(i / N)]![i % N]; return d ? pick(d) : 0.5; }), [rows.length, N]);
  return isNucleus(kind) ? { u: of((d) => d.u), u_retry: of((d) => d.retry!) } : { u: of((d) => d.u) };
}

/** The inputs of a cut draw: each row's top_p, and k for a top-k one (one k per graph run). */
function cutFeeds(cut: TopCut, topP: number[]): Record<string, Feed> {
  // A top_p below float32's smallest number would become 0 and keep nothing: the smallest keeps the most likely token.
  const rows = { top_p: feed('float32', Float32Array.from(topP, (p) => Math.max(p, 2 ** -149)), [topP.length, 1]) };
  return cut.topK > 0 ? { ...rows, k: feed('int64', BigInt64Array.from([BigInt(cut.topK)]), [1]) } : rows;
}
