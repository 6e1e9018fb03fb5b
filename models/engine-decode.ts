/** The engine's decode steps: rows of every request in flight in one graph run (continuous batching), a token drawn per row. */
import { BatchQueue, flushSoon } from './batch-queue.js';
import { cutFeeds, cutKind, drawBatchKey, uniformFeeds, type StepKind, type TopCut } from './draw-feeds.js';
import { byAdapter, inArrivalOrder, MAX_BATCH_REQUESTS } from './engine-batches.js';
import type { GraphTurns } from './engine-graphs.js';
import { BATCH_WAIT_MS, type SamplingStreams } from './engine-streams.js';
import { grownCaches, layerNames, promptFeeds, stepFeeds, type DecodeRow, type DecodeState, type RowCache } from './feeds.js';
import type { LoraAdapter } from './lora.js';
import type { ModelDims } from './transformer.js';

/** One row after a decode step: the token drawn in the graph, or the distribution to choose from. */
export interface RowStep {
  drawn?: { token: number; logprob: number };
  logprobs?: Float32Array;
  probs?: Float32Array;
  cache: RowCache;
}

/** One sampling stream's rows waiting for their next decode step (see step). */
interface RowsRequest {
  rows: DecodeRow[];
  adapter: LoraAdapter;
  invTemperature: number;
  cut: TopCut | null;
}

/**
 * Decode steps after a prefill: rows of concurrent requests gathered into one graph run (continuous
 * batching), each with its own cache, padded to the longest and masked; and the plain decode graph on
 * tokens after a batch's shared cache.
 */
export class Decoding {
  /** The decode graphs' cache outputs, per layer k then v. */
  private readonly presents: string[];

  /** Decode steps gather until the next turn of the event loop, and wait a little for streams still choosing. */
  private readonly steps = new BatchQueue<RowsRequest, RowStep[]>({
    keyOf: (r) => drawBatchKey(r.adapter, stepKind(r), r.cut, this.batchRuns),
    maxBatch: MAX_BATCH_REQUESTS,
    run: (batch) => this.stepRows(batch),
    schedule: flushSoon(() => this.streams.decoding, BATCH_WAIT_MS),
  });

  constructor(
    private readonly graphs: GraphTurns,
    private readonly streams: SamplingStreams,
    private readonly dims: ModelDims,
    private readonly batchRuns: boolean,
  ) {
    this.presents = layerNames(dims, 'present_k', 'present_v');
  }

  /** The decode graph on `tokens` after the cached positions in `state` (ModelEngine.decode). */
  async decode(
    tokens: number[][],
    adapter: LoraAdapter,
    state: DecodeState | null,
    invTemperature: number,
  ): Promise<{ logprobs: Float32Array; probs: Float32Array; state: DecodeState }> {
    const B = tokens.length;
    const Tq = tokens[0]!.length;
    const P = state?.length ?? 0;
    const feeds = promptFeeds(this.dims, tokens, Array(B).fill(invTemperature), state);
    const result = await this.graphs.run('decode', feeds, ['logprobs', 'probs', ...this.presents], adapter);
    return { logprobs: result.logprobs!, probs: result.probs!, state: { past: this.presents.map((n) => result[n]!), batch: B, length: P + Tq } };
  }

  /** Queues one decode step for a stream's rows (ModelEngine.decodeRows). */
  step(rows: DecodeRow[], adapter: LoraAdapter, invTemperature: number, cut: TopCut | null): Promise<RowStep[]> {
    // Refused here, before the rows can share a graph run with other requests' and fail theirs too.
    if (cut && !cut.topK && rows.some((r) => r.draw !== undefined && r.draw >= 0 && r.retry === undefined))
      throw new Error('a top_p draw needs a retry number');
    return this.steps.push({ rows, adapter, invTemperature, cut: rows[0]?.draw !== undefined && rows[0].draw >= 0 ? cut : null });
  }

  /** One decode step for the rows of requests of one key, in one graph run; each request gets its rows' steps. */
  private async stepRows(arrived: RowsRequest[]): Promise<RowStep[][]> {
    const { batch, adapters, rowAdapters } = byAdapter(arrived, (r) => r.rows.length);
    const rows = batch.flatMap((r) => r.rows);
    const { vocab } = this.dims;
    const feeds = stepFeeds(
      this.dims,
      rows,
      batch.flatMap((r) => r.rows.map(() => r.invTemperature)),
    );
    const kind = stepKind(batch[0]!);
    const cut = batch[0]!.cut;
    if (kind === 'draw' || cut)
      Object.assign(
        feeds,
        uniformFeeds(
          kind,
          rows.map((r) => [{ u: r.draw!, retry: r.retry }]),
          1,
        ),
      );
    if (cut)
      Object.assign(
        feeds,
        cutFeeds(
          cut,
          batch.flatMap((r) => r.rows.map(() => r.cut!.topP)),
        ),
      );
    const drawn = kind !== 'decode';
    const outputs = [...(drawn ? ['token', 'token_logprob'] : ['logprobs', 'probs']), ...this.presents];
    // A turn of the engine's queue, as every graph run takes: one graph at a time, in order with training work.
    const result = await this.graphs.inTurn(() => this.graphs.runNow(kind, feeds, outputs, adapters, rowAdapters));
    const caches = grownCaches(
      this.dims,
      this.presents.map((n) => result[n]!),
      rows,
    );
    const steps = caches.map((cache, b): RowStep => {
      if (drawn) return { drawn: { token: Number((result.token as unknown as BigInt64Array)[b]!), logprob: result.token_logprob![b]! }, cache };
      return { logprobs: result.logprobs!.subarray(b * vocab, (b + 1) * vocab), probs: result.probs!.subarray(b * vocab, (b + 1) * vocab), cache };
    });
    let at = 0;
    return inArrivalOrder(
      arrived,
      batch,
      batch.map((r) => {
        const from = at;
        at += r.rows.length;
        return steps.slice(from, at);
      }),
    );
  }
}

/** Which decode graph serves a row: every row of one graph run shares it. */
function stepKind(r: RowsRequest): StepKind {
  const draw = r.rows[0]!.draw;
  return draw === undefined ? 'decode' : draw < 0 ? 'greedy' : r.cut ? cutKind(r.cut) : 'draw';
}
