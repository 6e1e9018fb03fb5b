/** The engine's prefills: a prompt's keys and values and its first tokens, prompts that arrive together in one graph run. */
import { BatchQueue, flushSoon } from './batch-queue.js';
import { blocksOf } from './blocks.js';
import { cutFeeds, cutKind, drawBatchKey, isNucleus, uniformFeeds, type StepKind, type TopCut } from './draw-feeds.js';
import { byAdapter, inArrivalOrder, MAX_BATCH_REQUESTS } from './engine-batches.js';
import type { GraphTurns } from './engine-graphs.js';
import { BATCH_WAIT_MS, type SamplingStreams } from './engine-streams.js';
import { layerNames, promptFeeds, rowCache, type DecodeState, type RowCache } from './feeds.js';
import type { BlockLimits } from './long-sequences.js';
import type { LoraAdapter } from './lora.js';
import type { ModelDims } from './transformer.js';

/** A prompt after its prefill: the first tokens drawn in the graph (one per draw asked), or the distribution to choose from. */
export interface SequenceStart {
  drawn?: { token: number; logprob: number }[];
  logprobs?: Float32Array;
  probs?: Float32Array;
  cache: RowCache;
}

/** A prompt waiting for its prefill (see start). */
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

/**
 * Prompts' prefills: their keys and values, and their first tokens drawn in the graph (or the distribution).
 * Prompts that arrive together are prefilled in one graph run (rows of different lengths, padded and masked);
 * a prompt longer than one run may hold, in blocks.
 */
export class Prefill {
  /** The decode graphs' cache outputs, per layer k then v. */
  private readonly presents: string[];

  /**
   * Prompts gather until the next turn of the event loop, and wait a little for clients whose streams just
   * ended: otherwise the first prompt back is prefilled alone, the others after it, and the streams that
   * finished one step together decode out of step from then on (fewer rows a step, more steps).
   */
  private readonly prompts: BatchQueue<PromptRequest, SequenceStart> = new BatchQueue<PromptRequest, SequenceStart>({
    keyOf: (p) => drawBatchKey(p.adapter, p.kind, p.cut, this.batchRuns),
    maxBatch: MAX_BATCH_REQUESTS,
    run: (batch) => this.graphs.inTurn(() => this.prefill(batch)),
    schedule: flushSoon(
      () => this.prompts.size + this.streams.returning(),
      BATCH_WAIT_MS,
      () => this.streams.forgetReturning(),
    ),
  });

  constructor(
    private readonly graphs: GraphTurns,
    private readonly streams: SamplingStreams,
    private readonly dims: ModelDims,
    /** Positions one run may hold (a longer prompt is prefilled in blocks), and how long blocks' keys may grow. */
    private readonly limits: BlockLimits,
    private readonly batchRuns: boolean,
  ) {
    this.presents = layerNames(dims, 'present_k', 'present_v');
  }

  /** Queues one prompt's prefill (ModelEngine.startSequence says what comes back). */
  start(
    tokens: number[],
    adapter: LoraAdapter,
    invTemperature: number,
    draws: number[] | null,
    cut: TopCut | null,
    retries: number[] | null,
  ): Promise<SequenceStart> {
    const kind = draws === null ? 'decode' : draws[0]! < 0 ? 'greedy' : cut ? cutKind(cut, draws.length) : 'draw';
    if (isNucleus(kind) && retries?.length !== draws!.length) throw new Error('a top_p draw needs one retry number per draw');
    this.streams.promptArrived();
    return this.prompts.push({ tokens, adapter, invTemperature, kind, draws, retries, cut: kind === 'draw_top' || isNucleus(kind) ? cut : null });
  }

  /** Prefills prompts of one key, from a turn already taken: short ones in one graph run, long ones in blocks. */
  private async prefill(batch: PromptRequest[]): Promise<SequenceStart[]> {
    const long = (p: PromptRequest) => p.tokens.length > this.limits.positions;
    if (!batch.some(long)) return this.prefillRows(batch, null);
    const starts = new Map<PromptRequest, SequenceStart>();
    const short = batch.filter((p) => !long(p));
    if (short.length)
      (await this.prefillRows(short, null)).forEach((start, i) => {
        starts.set(short[i]!, start);
      });
    for (const p of batch.filter(long)) starts.set(p, await this.prefillBlocks(p));
    return batch.map((p) => starts.get(p)!);
  }

  /** A long prompt's keys and values block by block, then its first tokens from the last block. */
  private async prefillBlocks(p: PromptRequest): Promise<SequenceStart> {
    // No logits but the last position's: blocks as long as a run's positions allow.
    const blocks = blocksOf(p.tokens.length, this.dims.heads, this.limits);
    let state: DecodeState | null = null;
    for (const [start, end] of blocks.slice(0, -1)) {
      const feeds = promptFeeds(this.dims, [p.tokens.slice(start, end)], [p.invTemperature], state);
      // Only the last block's draws are kept: the others draw once, at any number.
      if (p.kind === 'draw' || p.cut) Object.assign(feeds, uniformFeeds(p.kind, [[{ u: 0.5, retry: 0.5 }]], 1));
      if (p.cut) Object.assign(feeds, cutFeeds(p.cut, [p.cut.topP]));
      const result = await this.graphs.runNow(p.kind, feeds, this.presents, [p.adapter]);
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
    const feeds = promptFeeds(
      this.dims,
      batch.map((p) => p.tokens),
      batch.map((p) => p.invTemperature),
      state,
    );
    const N = Math.max(...batch.map((p) => p.draws?.length ?? 0));
    const cut = batch[0]!.cut;
    if (kind === 'draw' || cut)
      Object.assign(
        feeds,
        uniformFeeds(
          kind,
          batch.map((p) => p.draws!.map((u, i) => ({ u, retry: p.retries?.[i] }))),
          N,
        ),
      );
    if (cut)
      Object.assign(
        feeds,
        cutFeeds(
          cut,
          batch.map((p) => p.cut!.topP),
        ),
      );
    const outputs = kind === 'decode' ? ['logprobs', 'probs'] : ['token', 'token_logprob'];
    const result = await this.graphs.runNow(kind, feeds, [...outputs, ...this.presents], adapters, rowAdapters);
    const T = feeds.tokens!.dims[1]!;
    const { vocab } = this.dims;
    return inArrivalOrder(
      arrived,
      batch,
      batch.map((p, b) => {
        const cache = { past: this.presents.map((n) => rowCache(this.dims, result[n]!, b, P + T, P + p.tokens.length)), length: P + p.tokens.length };
        if (kind === 'decode')
          return { logprobs: result.logprobs!.subarray(b * vocab, (b + 1) * vocab), probs: result.probs!.subarray(b * vocab, (b + 1) * vocab), cache };
        const ids = result.token as unknown as BigInt64Array;
        const width = kind === 'greedy' ? 1 : N;
        const drawn = p.draws!.map((_, i) => {
          const at = b * width + (kind === 'greedy' ? 0 : i);
          return { token: Number(ids[at]!), logprob: result.token_logprob![at]! };
        });
        return { drawn, cache };
      }),
    );
  }
}
