import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { GraphRunner } from './graph-runner.js';
import { ADAPTER_CACHE_SIZE, type Feed, type RunnerConfig, type RunRequest } from './runner-protocol.js';
import { DECODE_KINDS, DEFAULT_DIMS, loraSites, ROPE_BASE, type GraphKind, type LoraSite, type ModelDims } from './transformer.js';

export { DeviceUnavailableError } from './device-error.js';
import { siteRank, type LoraAdapter } from './lora.js';

export type Device = 'cpu' | 'cuda';

export interface EngineOptions {
  device?: Device;
  /** Threads for one graph run (default: every core). */
  threads?: number;
  /** Rows an adapter version decodes in batches before its unembedding is packed into a session of its own (see GraphRunner.packedSession). */
  packAfterBatchedRows?: number;
  /** Largest number of (padded) positions in one graph run; longer batches are split. Bounds memory: the logits of one run are positions × vocab floats. */
  maxPositionsPerRun?: number;
  /** Model width etc.; tests use smaller ones. */
  dims?: Partial<Omit<ModelDims, 'vocab'>>;
  /** Largest LoRA rank on the unembedding (default DEFAULT_UNEMBEDDING_RANK); a run's rank above it is capped there. */
  unembeddingRank?: number;
  /**
   * Where graphs run: 'worker' (default) on a worker thread of this engine, so the caller's event loop never
   * waits on compute; 'inline' on the calling thread (simpler to debug, blocks while computing).
   */
  thread?: 'worker' | 'inline';
}

/** One sequence to score: `targets[i]` is the token position i predicts. */
export interface ScoredSequence {
  tokens: number[];
  targets: number[];
  /** Positions whose logprob is wanted (default: all). Others come back 0 and cost no unembedding. */
  scored?: number[];
}

export interface BackwardResult {
  logprobs: Float32Array[];
  /** Gradient of Σ cotangent·logprob for each LoRA tensor, keyed `<site>.A` / `<site>.B`. */
  grads: Map<string, Float32Array>;
}

/** One sequence's KV cache: per layer k then v, each [heads, length, headDim]. */
export interface RowCache {
  past: Float32Array[];
  length: number;
}

export interface DecodeRow {
  token: number;
  cache: RowCache;
  /**
   * Draw the next token inside the graph at this uniform number in [0, 1)
   * (negative: the most likely token), so that only the token comes back.
   * Absent: the whole next-token distribution comes back.
   */
  draw?: number;
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

/** Requests gathered into one decode batch at most. */
const MAX_BATCH_REQUESTS = 16;
/** How long a decode batch waits for sampling streams still choosing their tokens. */
const BATCH_WAIT_MS = 3;

export interface DecodeState {
  /** Cache per layer: k then v, each [B, heads, P, headDim]. */
  past: Float32Array[];
  batch: number;
  length: number;
}

const NEG_INF = -1e9;
/** From this many scored positions in one run on, the merged unembedding is cheaper (about the model width). */
const MERGE_FROM_POSITIONS = 64;


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
  private readonly maxPositions: number;
  private readonly headDim: number;
  /** The decode graphs' cache outputs, per layer k then v. */
  private readonly presents: string[];
  /** Graph runs of one engine are serialised: onnxruntime sessions already use every core. */
  private queue: Promise<unknown> = Promise.resolve();
  private pendingRows: { rows: DecodeRow[]; adapter: LoraAdapter; invTemperature: number; resolve: (s: RowStep[]) => void; reject: (e: Error) => void }[] = [];
  private flushing = false;

  constructor(readonly modelName: string, vocab: number, options: EngineOptions = {}) {
    this.dims = { vocab, ...DEFAULT_DIMS, ...options.dims };
    this.sites = loraSites(this.dims, options.unembeddingRank);
    this.headDim = this.dims.dModel / this.dims.heads;
    this.presents = Array.from({ length: this.dims.layers }, (_, l) => [`present_k.${l}`, `present_v.${l}`]).flat();
    this.maxPositions = options.maxPositionsPerRun ?? 512;
    const config = { modelName, dims: this.dims, device: options.device ?? 'cpu', threads: options.threads, packAfterBatchedRows: options.packAfterBatchedRows };
    // onnxruntime is loaded only where graphs run: in the worker, or here on first use when inline.
    this.runner = options.thread === 'inline' ? new InlineRunner(config) : new WorkerRunner(config);
  }

  /** Stops the engine's worker thread. */
  async close(): Promise<void> {
    await this.runner.close?.();
  }

  /** Loads every session now rather than at first use (a server warming up). */
  async warm(kinds: GraphKind[] = ['forward', 'backward', ...DECODE_KINDS]): Promise<void> {
    for (const k of kinds) await this.runner.warm(k);
  }

  /** Logprob of each target token, per sequence. */
  async forward(seqs: ScoredSequence[], adapter: LoraAdapter): Promise<Float32Array[]> {
    const out: Float32Array[] = [];
    for (const chunk of this.chunks(seqs)) {
      // Nothing scored (a lone token, or every target -100): every logprob is 0 and no graph needs to run.
      if (chunk.every((s) => s.scored?.length === 0)) {
        out.push(...chunk.map((s) => new Float32Array(s.tokens.length)));
        continue;
      }
      const result = await this.run('forward', this.sequenceFeeds(chunk), ['logprobs'], adapter);
      out.push(...this.unpad(result.logprobs!, chunk));
    }
    return out;
  }

  /** For each sequence: the target logprobs, and the k most likely tokens with their logprobs at every position. */
  async topk(seqs: ScoredSequence[], adapter: LoraAdapter, k: number): Promise<{ logprobs: Float32Array[]; top: { ids: number[]; logprobs: number[] }[][] }> {
    const logprobs: Float32Array[] = [];
    const top: { ids: number[]; logprobs: number[] }[][] = [];
    for (const chunk of this.chunks(seqs.map((s) => ({ ...s, scored: undefined })))) {
      const T = Math.max(...chunk.map((s) => s.tokens.length));
      const feeds = { ...this.sequenceFeeds(chunk), k: feed('int64', BigInt64Array.from([BigInt(k)]), [1]) };
      const result = await this.run('topk', feeds, ['logprobs', 'topk_values', 'topk_indices'], adapter);
      logprobs.push(...this.unpad(result.logprobs!, chunk));
      const values = result.topk_values!;
      const indices = result.topk_indices! as unknown as BigInt64Array;
      chunk.forEach((s, b) => top.push(Array.from({ length: s.tokens.length }, (_, t) => {
        const at = (b * T + t) * k;
        return { ids: Array.from(indices.subarray(at, at + k), Number), logprobs: Array.from(values.subarray(at, at + k)) };
      })));
    }
    return { logprobs, top };
  }

  /** Logprobs and the gradient of Σ_t cotangent_t·logprob_t for every LoRA tensor, summed over all sequences. */
  async backward(seqs: ScoredSequence[], adapter: LoraAdapter, cotangents: Float32Array[]): Promise<BackwardResult> {
    const grads = new Map<string, Float32Array>();
    const logprobs: Float32Array[] = [];
    const gradNames = this.sites.flatMap((s) => [`grad.${s.key}.A`, `grad.${s.key}.B`]);
    let start = 0;
    for (const chunk of this.chunks(seqs)) {
      if (chunk.every((s) => s.scored?.length === 0)) {
        // Nothing scored: logprobs 0 and no gradient from this chunk.
        logprobs.push(...chunk.map((s) => new Float32Array(s.tokens.length)));
        start += chunk.length;
        continue;
      }
      const S = Math.max(...chunk.map(scoredCount));
      const c = new Float32Array(chunk.length * S);
      chunk.forEach((seq, b) => positionsOf(seq).forEach((t, k) => { c[b * S + k] = cotangents[start + b]![t]!; }));
      start += chunk.length;
      const feeds = { ...this.sequenceFeeds(chunk), cotangent: feed('float32', c, [chunk.length, S]) };
      const result = await this.run('backward', feeds, ['logprobs', ...gradNames], adapter);
      logprobs.push(...this.unpad(result.logprobs!, chunk));
      for (const name of gradNames) {
        const key = name.slice('grad.'.length);
        const g = result[name]!;
        const acc = grads.get(key);
        if (!acc) grads.set(key, g);
        else for (let i = 0; i < acc.length; i++) acc[i]! += g[i]!;
      }
    }
    for (const site of this.sites) {
      const r = siteRank(adapter.tensors.get(site.key)!, site);
      if (!grads.has(`${site.key}.A`)) grads.set(`${site.key}.A`, new Float32Array(site.inDim * r));
      if (!grads.has(`${site.key}.B`)) grads.set(`${site.key}.B`, new Float32Array(r * site.outDim));
    }
    return { logprobs, grads };
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
    const feeds = this.promptFeeds(tokens, Array(B).fill(invTemperature), state);
    const result = await this.run('decode', feeds, ['logprobs', 'probs', ...this.presents], adapter);
    return { logprobs: result.logprobs!, probs: result.probs!, state: { past: this.presents.map((n) => result[n]!), batch: B, length: P + Tq } };
  }

  /**
   * Prefills one prompt and gives what its first tokens are chosen from:
   * with `draws`, the graph draws `draws.length` tokens itself, one per
   * uniform number (negative: the most likely token, for every draw), and
   * only they and their logprobs come back; without, the whole next-token
   * distribution. Prompts that arrive while the engine is busy are prefilled
   * together in one graph run (rows of different lengths, padded and masked).
   */
  startSequence(tokens: number[], adapter: LoraAdapter, invTemperature: number, draws: number[] | null): Promise<SequenceStart> {
    const kind = draws === null ? 'decode' : draws[0]! < 0 ? 'greedy' : 'draw';
    return new Promise((resolve, reject) => {
      this.pendingPrompts.push({ tokens, adapter, invTemperature, kind, draws, resolve, reject });
      // Each prompt queues one turn; the first turn to come takes every prompt waiting by then.
      const turn = this.queue.then(() => this.prefillWaiting());
      this.queue = turn.catch(() => undefined);
    });
  }

  private pendingPrompts: { tokens: number[]; adapter: LoraAdapter; invTemperature: number; kind: 'decode' | 'draw' | 'greedy'; draws: number[] | null; resolve: (r: SequenceStart) => void; reject: (e: Error) => void }[] = [];

  private async prefillWaiting(): Promise<void> {
    const head = this.pendingPrompts[0];
    if (!head) return;
    const key = batchKey(head.adapter, head.kind);
    const batch = this.pendingPrompts.filter((p) => batchKey(p.adapter, p.kind) === key).slice(0, MAX_BATCH_REQUESTS);
    this.pendingPrompts = this.pendingPrompts.filter((p) => !batch.includes(p));
    try {
      const B = batch.length;
      const feeds = this.promptFeeds(batch.map((p) => p.tokens), batch.map((p) => p.invTemperature), null);
      const N = Math.max(...batch.map((p) => p.draws?.length ?? 0));
      if (head.kind === 'draw') feeds.u = feed('float32', Float32Array.from({ length: B * N }, (_, i) => batch[Math.floor(i / N)]!.draws![i % N] ?? 0.5), [B, N]);
      const outputs = head.kind === 'decode' ? ['logprobs', 'probs'] : ['token', 'token_logprob'];
      const result = await this.runNow(head.kind, feeds, [...outputs, ...this.presents], head.adapter);
      const T = feeds.tokens!.dims[1]!;
      batch.forEach((p, b) => {
        const cache = { past: this.presents.map((n) => this.rowCache(result[n]!, b, T, p.tokens.length)), length: p.tokens.length };
        if (head.kind === 'decode') {
          const { vocab } = this.dims;
          p.resolve({ logprobs: result.logprobs!.subarray(b * vocab, (b + 1) * vocab), probs: result.probs!.subarray(b * vocab, (b + 1) * vocab), cache });
          return;
        }
        const ids = result.token as unknown as BigInt64Array;
        const width = head.kind === 'greedy' ? 1 : N;
        const drawn = p.draws!.map((_, i) => {
          const at = b * width + (head.kind === 'greedy' ? 0 : i);
          return { token: Number(ids[at]!), logprob: result.token_logprob![at]! };
        });
        p.resolve({ drawn, cache });
      });
    } catch (err) {
      for (const p of batch) p.reject(err as Error);
    }
  }

  /** Row b's first `length` positions of a [B, heads, T, headDim] cache tensor. */
  private rowCache(present: Float32Array, b: number, T: number, length: number): Float32Array {
    const { heads } = this.dims;
    const hd = this.headDim;
    const out = new Float32Array(heads * length * hd);
    for (let h = 0; h < heads; h++) out.set(present.subarray((b * heads + h) * T * hd, ((b * heads + h) * T + length) * hd), h * length * hd);
    return out;
  }


  /** Feeds of the decode graphs for prompts (right-padded to the longest) after the cached positions of `state`. */
  private promptFeeds(tokens: number[][], invTemperatures: number[], state: DecodeState | null): Record<string, Feed> {
    const B = tokens.length;
    const Tq = Math.max(...tokens.map((t) => t.length));
    const P = state?.length ?? 0;
    const { heads } = this.dims;
    const hd = this.headDim;
    const ids = new BigInt64Array(B * Tq);
    tokens.forEach((row, b) => row.forEach((t, i) => { ids[b * Tq + i] = BigInt(t); }));
    const feeds: Record<string, Feed> = {
      tokens: feed('int64', ids, [B, Tq]),
      attn_bias: feed('float32', causalBias(B, Tq, P, tokens.map((t) => P + t.length)), [B, 1, Tq, P + Tq]),
      inv_temperature: feed('float32', Float32Array.from(invTemperatures), [B, 1]),
      last_index: feed('int64', BigInt64Array.from(tokens, (t) => BigInt(t.length - 1)), [B, 1]),
      ...this.ropeFeeds(B, Tq, P),
    };
    for (let l = 0; l < this.dims.layers; l++) {
      feeds[`past_k.${l}`] = feed('float32', state?.past[2 * l] ?? new Float32Array(0), [B, heads, P, hd]);
      feeds[`past_v.${l}`] = feed('float32', state?.past[2 * l + 1] ?? new Float32Array(0), [B, heads, P, hd]);
    }
    return feeds;
  }

  /**
   * One decode step for independent rows, each with its own cache: rows from
   * concurrent requests on the same adapter are gathered into one graph run
   * (continuous batching), caches padded to the longest and masked.
   */
  decodeRows(rows: DecodeRow[], adapter: LoraAdapter, invTemperature: number): Promise<RowStep[]> {
    return new Promise((resolve, reject) => {
      this.pendingRows.push({ rows, adapter, invTemperature, resolve, reject });
      if (!this.flushing) {
        this.flushing = true;
        setImmediate(() => void this.flushRows());
      }
    });
  }

  /** Sampling streams in their decode loop: a flush waits (briefly) for each of them to send its next step. */
  private streams = 0;

  /** Marks a sampling stream as decoding until the returned function is called. */
  openStream(): () => void {
    this.streams++;
    let open = true;
    return () => {
      if (open) { open = false; this.streams--; }
    };
  }

  private async flushRows(): Promise<void> {
    while (this.pendingRows.length) {
      // Let the other streams, busy choosing their tokens, join this batch: at most a few milliseconds.
      for (let waited = 0; this.pendingRows.length < this.streams && waited < BATCH_WAIT_MS; waited++) await new Promise((r) => setTimeout(r, 1));
      // One graph run serves one adapter version, and rows drawn in the graph never share a run with rows
      // that want the whole distribution (different graphs).
      const head = this.pendingRows[0]!;
      const key = batchKey(head.adapter, stepKind(head.rows[0]!));
      const batch = this.pendingRows.filter((p) => batchKey(p.adapter, stepKind(p.rows[0]!)) === key).slice(0, MAX_BATCH_REQUESTS);
      this.pendingRows = this.pendingRows.filter((p) => !batch.includes(p));
      try {
        const steps = await this.stepRows(batch.flatMap((p) => p.rows), batch.flatMap((p) => p.rows.map(() => p.invTemperature)), head.adapter);
        let at = 0;
        for (const p of batch) {
          p.resolve(steps.slice(at, at + p.rows.length));
          at += p.rows.length;
        }
      } catch (err) {
        for (const p of batch) p.reject(err as Error);
      }
    }
    this.flushing = false;
  }

  private async stepRows(rows: DecodeRow[], invTemperatures: number[], adapter: LoraAdapter): Promise<RowStep[]> {
    const B = rows.length;
    const { heads, vocab } = this.dims;
    const hd = this.headDim;
    const P = Math.max(...rows.map((r) => r.cache.length));
    const bias = new Float32Array(B * (P + 1));
    rows.forEach((r, b) => { for (let j = r.cache.length; j < P; j++) bias[b * (P + 1) + j] = NEG_INF; });
    const feeds: Record<string, Feed> = {
      tokens: feed('int64', BigInt64Array.from(rows.map((r) => BigInt(r.token))), [B, 1]),
      attn_bias: feed('float32', bias, [B, 1, 1, P + 1]),
      inv_temperature: feed('float32', Float32Array.from(invTemperatures), [B, 1]),
      last_index: feed('int64', new BigInt64Array(B), [B, 1]),
      ...this.ropeFeeds(B, 1, (b) => rows[b]!.cache.length),
    };
    const rowSize = heads * P * hd;
    for (let i = 0; i < 2 * this.dims.layers; i++) {
      const past = new Float32Array(B * rowSize);
      rows.forEach((r, b) => {
        const own = r.cache.past[i]!;
        const len = r.cache.length;
        for (let h = 0; h < heads; h++) past.set(own.subarray(h * len * hd, (h + 1) * len * hd), b * rowSize + h * P * hd);
      });
      feeds[`${i % 2 === 0 ? 'past_k' : 'past_v'}.${Math.floor(i / 2)}`] = feed('float32', past, [B, heads, P, hd]);
    }
    const presents = this.presents;
    const kind = stepKind(rows[0]!);
    if (kind === 'draw') feeds.u = feed('float32', Float32Array.from(rows, (r) => r.draw!), [B, 1]);
    const drawn = kind !== 'decode';
    const result = await this.run(kind, feeds, drawn ? ['token', 'token_logprob', ...presents] : ['logprobs', 'probs', ...presents], adapter);
    return rows.map((r, b) => {
      const len = r.cache.length;
      // Each row's cache grows by one: its own positions, then the new one (the padding is dropped).
      const past = presents.map((name) => {
        const present = result[name]!;
        const out = new Float32Array(heads * (len + 1) * hd);
        for (let h = 0; h < heads; h++) {
          const src = (b * heads + h) * (P + 1) * hd;
          out.set(present.subarray(src, src + len * hd), h * (len + 1) * hd);
          out.set(present.subarray(src + P * hd, src + (P + 1) * hd), (h * (len + 1) + len) * hd);
        }
        return out;
      });
      const cache = { past, length: len + 1 };
      if (drawn) return { drawn: { token: Number((result.token as unknown as BigInt64Array)[b]!), logprob: result.token_logprob![b]! }, cache };
      return { logprobs: result.logprobs!.subarray(b * vocab, (b + 1) * vocab), probs: result.probs!.subarray(b * vocab, (b + 1) * vocab), cache };
    });
  }



  private run(kind: GraphKind, feeds: Record<string, Feed>, outputs: string[], adapter: LoraAdapter): Promise<Record<string, Float32Array>> {
    // (topk_indices and token come back as BigInt64Arrays; callers that read them say so.)
    // Many scored positions: merge LoRA into the unembedding weight first (see GraphOptions).
    const scored = feeds.targets?.dims.reduce((p, n) => p * n, 1) ?? 0;
    const merged = !DECODE_KINDS.includes(kind) && scored >= MERGE_FROM_POSITIONS;
    const job = this.queue.then(() => this.runNow(kind, feeds, outputs, adapter, merged));
    this.queue = job.catch(() => undefined);
    return job;
  }

  /** Runs a graph now: only from a turn already taken in the engine's queue. */
  private async runNow(kind: GraphKind, feeds: Record<string, Feed>, outputs: string[], adapter: LoraAdapter, merged = false): Promise<Record<string, Float32Array>> {
    const result = await this.runner.run({ kind, merged, feeds, outputs, adapter: { id: adapter.id, version: adapter.version, feeds: this.loraFeeds(adapter) } });
    return Object.fromEntries(outputs.map((n) => [n, result[n]!.data as Float32Array]));
  }

  /** Splits sequences into runs of at most maxPositions padded positions. */
  private *chunks(seqs: ScoredSequence[]): Generator<ScoredSequence[]> {
    let chunk: ScoredSequence[] = [];
    let longest = 0;
    for (const s of seqs) {
      const next = Math.max(longest, s.tokens.length);
      if (chunk.length && next * (chunk.length + 1) > this.maxPositions) {
        yield chunk;
        chunk = [];
        longest = 0;
      }
      chunk.push(s);
      longest = Math.max(longest, s.tokens.length);
    }
    if (chunk.length) yield chunk;
  }

  private sequenceFeeds(chunk: ScoredSequence[]): Record<string, Feed> {
    const B = chunk.length;
    const T = Math.max(...chunk.map((s) => s.tokens.length));
    const S = Math.max(...chunk.map(scoredCount));
    const d = this.dims.dModel;
    const tokens = new BigInt64Array(B * T);
    const targets = new BigInt64Array(B * S);
    // Unused score slots point at position 0 with target 0; their cotangent is 0.
    const scoreIndex = new BigInt64Array(B * S * d);
    chunk.forEach((s, b) => {
      for (let t = 0; t < s.tokens.length; t++) tokens[b * T + t] = BigInt(s.tokens[t]!);
      positionsOf(s).forEach((t, k) => {
        targets[b * S + k] = BigInt(s.targets[t]!);
        scoreIndex.fill(BigInt(t), (b * S + k) * d, (b * S + k + 1) * d);
      });
    });
    return {
      tokens: feed('int64', tokens, [B, T]),
      targets: feed('int64', targets, [B, S]),
      score_index: feed('int64', scoreIndex, [B, S, d]),
      attn_bias: feed('float32', causalBias(B, T, 0, chunk.map((s) => s.tokens.length)), [B, 1, T, T]),
      ...this.ropeFeeds(B, T, 0),
    };
  }

  /** cos and sin of each position's rotary angles, [B, T, headDim] (halves repeated). */
  /** cos and sin of each position's rotary angles, [B, T, headDim]; row b starts at position offset(b). */
  private ropeFeeds(B: number, T: number, offset: number | ((b: number) => number)): Record<string, Feed> {
    const hd = this.headDim;
    const half = hd / 2;
    const cos = new Float32Array(B * T * hd);
    const sin = new Float32Array(B * T * hd);
    const start = typeof offset === 'number' ? () => offset : offset;
    for (let b = 0; b < B; b++) {
      for (let t = 0; t < T; t++) {
        const at = (b * T + t) * hd;
        for (let j = 0; j < half; j++) {
          const angle = (start(b) + t) * Math.pow(ROPE_BASE, (-2 * j) / hd);
          cos[at + j] = cos[at + j + half] = Math.cos(angle);
          sin[at + j] = sin[at + j + half] = Math.sin(angle);
        }
      }
    }
    return { rope_cos: feed('float32', cos, [B, T, hd]), rope_sin: feed('float32', sin, [B, T, hd]) };
  }

  private loraFeeds(adapter: LoraAdapter): Record<string, Feed> {
    const feeds: Record<string, Feed> = { lora_scale: feed('float32', new Float32Array([adapter.scale]), []) };
    for (const site of this.sites) {
      const t = adapter.tensors.get(site.key)!;
      const r = siteRank(t, site);
      feeds[`lora.${site.key}.A`] = feed('float32', t.A, [site.inDim, r]);
      feeds[`lora.${site.key}.B`] = feed('float32', t.B, [r, site.outDim]);
    }
    return feeds;
  }

  /** Per sequence, a full-length array: each scored position's logprob, 0 elsewhere. */
  private unpad(flat: Float32Array, chunk: ScoredSequence[]): Float32Array[] {
    const S = Math.max(...chunk.map(scoredCount));
    return chunk.map((s, b) => {
      const out = new Float32Array(s.tokens.length);
      positionsOf(s).forEach((t, k) => { out[t] = flat[b * S + k]!; });
      return out;
    });
  }
}

function feed(type: Feed['type'], data: Float32Array | BigInt64Array, dims: number[]): Feed {
  return { type, data, dims };
}

interface Runner {
  run(req: RunRequest): Promise<Record<string, Feed>>;
  warm(kind: GraphKind): Promise<void>;
  close?(): Promise<void>;
}

/** Runs graphs on the calling thread (loads onnxruntime here on first use). */
class InlineRunner implements Runner {
  private runner: Promise<GraphRunner> | null = null;
  constructor(private readonly config: RunnerConfig) {}
  private get(): Promise<GraphRunner> {
    return (this.runner ??= import('./graph-runner.js').then((m) => new m.GraphRunner(this.config)));
  }
  async run(req: RunRequest): Promise<Record<string, Feed>> {
    return (await this.get()).run(req);
  }
  async warm(kind: GraphKind): Promise<void> {
    await (await this.get()).warm(kind);
  }
}

/** Runs graphs on a worker thread that owns the weights and sessions; requests and answers are messages. */
class WorkerRunner implements Runner {
  private worker: Worker | null = null;
  private readonly pending = new Map<number, { resolve: (v: Record<string, Feed>) => void; reject: (e: Error) => void }>();
  private nextId = 0;

  constructor(private readonly config: RunnerConfig) {}

  /** (adapter id → version) the worker holds, in the same order as its own cache. */
  private readonly sent = new Map<string, number>();

  async run(req: RunRequest): Promise<Record<string, Feed>> {
    const { id, version } = req.adapter;
    const known = this.sent.get(id) === version;
    try {
      return await this.call({ run: known ? { ...req, adapter: { id, version } } : req });
    } catch (err) {
      if ((err as Error).name !== 'AdapterNotCachedError') throw err;
      this.sent.delete(id);
      return this.call({ run: req });
    } finally {
      this.sent.delete(id);
      this.sent.set(id, version);
      while (this.sent.size > ADAPTER_CACHE_SIZE) this.sent.delete(this.sent.keys().next().value!);
    }
  }

  async warm(kind: GraphKind): Promise<void> {
    await this.call({ warm: kind });
  }

  private closing: Promise<void> | null = null;
  private drained: (() => void) | null = null;

  /**
   * Lets graphs already running finish, then stops the worker. Terminating
   * it while onnxruntime computes aborts the whole process, so a server
   * closed mid-step waits for the step instead.
   */
  close(): Promise<void> {
    return (this.closing ??= (async () => {
      if (this.pending.size) await new Promise<void>((resolve) => { this.drained = resolve; });
      const w = this.worker;
      this.worker = null;
      if (w) await w.terminate();
    })());
  }

  private call(msg: { run?: RunRequest; warm?: GraphKind }): Promise<Record<string, Feed>> {
    if (this.closing) return Promise.reject(new Error('The model engine is closed (the server is shutting down).'));
    const worker = this.start();
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      if (this.pending.size === 1) worker.ref();
      worker.postMessage({ id, ...msg });
    });
  }

  private start(): Worker {
    if (this.worker) return this.worker;
    // From source (tests, tsx) the worker is TypeScript and starts through tsx's loader; built, it is plain JavaScript.
    const fromSource = import.meta.url.endsWith('.ts');
    const file = fileURLToPath(new URL(fromSource ? './engine-worker-source.mjs' : './engine-worker.js', import.meta.url));
    const worker = new Worker(file, { workerData: this.config });
    worker.unref();
    worker.on('message', (msg: { id: number; outputs?: Record<string, Feed>; error?: { name: string; message: string } }) => {
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (this.pending.size === 0) {
        worker.unref();
        this.drained?.();
      }
      if (msg.error) {
        const err = new Error(msg.error.message);
        err.name = msg.error.name;
        p.reject(err);
      } else {
        p.resolve(msg.outputs!);
      }
    });
    worker.on('error', (err) => {
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
      this.worker = null;
      this.drained?.();
    });
    this.worker = worker;
    return worker;
  }
}

/** Requests that may share one graph run: the same adapter version and the same decode graph. */
function batchKey(adapter: LoraAdapter, kind: GraphKind): string {
  return `${adapter.id}:${adapter.version}:${kind}`;
}

/** Which decode graph serves a row: every row of one graph run shares it. */
function stepKind(row: DecodeRow): 'decode' | 'draw' | 'greedy' {
  return row.draw === undefined ? 'decode' : row.draw < 0 ? 'greedy' : 'draw';
}

function positionsOf(s: ScoredSequence): number[] {
  return s.scored ?? s.tokens.map((_, t) => t);
}

function scoredCount(s: ScoredSequence): number {
  // At least one slot per row, so every tensor keeps a non-empty shape.
  return Math.max(1, s.scored?.length ?? s.tokens.length);
}

/** Additive attention bias: query i sees keys 0..P+i that lie within its row's length. */
function causalBias(B: number, Tq: number, P: number, lengths: number[]): Float32Array {
  const K = P + Tq;
  const bias = new Float32Array(B * Tq * K);
  for (let b = 0; b < B; b++) {
    for (let i = 0; i < Tq; i++) {
      const row = (b * Tq + i) * K;
      for (let j = 0; j < K; j++) if (j > P + i || j >= lengths[b]!) bias[row + j] = NEG_INF;
      // A padded query past the row's end still sees its first key, so its softmax stays finite.
      if (P + i >= lengths[b]!) bias[row] = 0;
    }
  }
  return bias;
}
