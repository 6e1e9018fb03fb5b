/** Scoring a sequence too long for one graph run: forward, top-k and backward, block by block. */
import { blockSequence, blocksOf, SequenceCache, type Block } from './blocks.js';
import type { GraphTurns } from './engine-graphs.js';
import {
  cotangentFeed,
  feed,
  gradNames,
  layerNames,
  ownCotangentFeeds,
  positionsOf,
  sequenceFeeds,
  topkRows,
  unpad,
  type ScoredSequence,
  type TopTokens,
} from './feeds.js';
import type { LoraAdapter } from './lora.js';
import type { LoraSite, ModelDims } from './transformer.js';

/** How a long sequence is cut: as many positions as one run may score, fewer where keys grow long (blocksOf). */
export interface BlockLimits {
  positions: number;
  attentionFloats: number;
}

/**
 * One sequence too long for a single scoring run, scored block by block: each block attends to the keys and
 * values of those before it (models/blocks.ts holds the bounds and the cache), forward, with a top-k, or
 * backward from the last block to the first.
 */
export class LongSequences {
  /** The scoring graphs' outputs of a block's keys and values, per layer k then v. */
  private readonly blockKv: string[];
  /** What a block's losses owe to the cached keys and values before it, per layer k then v. */
  private readonly pastGrads: string[];
  private readonly gradNames: string[];

  constructor(
    private readonly graphs: GraphTurns,
    private readonly dims: ModelDims,
    sites: LoraSite[],
    private readonly limits: BlockLimits,
  ) {
    this.blockKv = layerNames(dims, 'block_k', 'block_v');
    this.pastGrads = layerNames(dims, 'grad.past_k', 'grad.past_v');
    this.gradNames = gradNames(sites);
  }

  /**
   * Scores one long sequence block by block. Blocks after the last scored position are not run (forward);
   * topk scores every position.
   */
  async score(
    seq: ScoredSequence,
    adapter: LoraAdapter,
    kind: 'forward' | 'topk',
    k = 0,
    keysForBackward = false,
  ): Promise<{ logprobs: Float32Array; top: TopTokens[]; cache: SequenceCache; blocks: Block[] }> {
    const lastScored = Math.max(-1, ...positionsOf(seq));
    const blocks = blocksOf(seq.tokens.length, this.dims.heads, this.limits).filter(([start]) => start <= lastScored);
    const cache = new SequenceCache(this.dims, seq.tokens.length);
    const logprobs = new Float32Array(seq.tokens.length);
    const top: TopTokens[] = kind === 'topk' ? Array.from({ length: seq.tokens.length }, () => ({ ids: [], logprobs: [] })) : [];
    // For a backward pass only the keys and values before the last block are needed: no block reads the last one's.
    for (const block of keysForBackward ? blocks.slice(0, -1) : blocks) {
      const part = blockSequence(seq, block);
      const feeds = sequenceFeeds(this.dims, [part], cache.past(block[0]));
      if (kind === 'topk') feeds.k = feed('int64', BigInt64Array.from([BigInt(k)]), [1]);
      // A backward pass takes every block's logprobs from its own backward run: here only the keys and values.
      const result = await this.graphs.run(
        kind,
        feeds,
        [...(keysForBackward ? [] : ['logprobs']), ...this.blockKv, ...(kind === 'topk' ? ['topk_values', 'topk_indices'] : [])],
        adapter,
      );
      if (!keysForBackward) logprobs.set(unpad(result.logprobs!, [part])[0]!, block[0]);
      if (kind === 'topk')
        topkRows(result.topk_values!, result.topk_indices! as unknown as BigInt64Array, [part], k)[0]!.forEach((row, i) => {
          if (row.ids.length) top[block[0] + i] = row;
        });
      this.blockKv.forEach((name, i) => {
        cache.write(i, block[0], result[name]!);
      });
    }
    return { logprobs, top, cache, blocks };
  }

  /**
   * The backward pass of one long sequence: a forward pass through its blocks but the last for their keys and
   * values, then the blocks in reverse, each given what later blocks' losses owe to its keys and values and
   * handing on what its own losses owe to earlier ones. Returns the logprobs; hands each block's run (its
   * LoRA gradients, `grad.<site>.A` / `.B`) to `addGrads`, last block first.
   */
  async backward(
    seq: ScoredSequence,
    adapter: LoraAdapter,
    cotangent: Float32Array,
    addGrads: (result: Record<string, Float32Array>) => void,
  ): Promise<Float32Array> {
    const { logprobs, cache, blocks } = await this.score(seq, adapter, 'forward', 0, true);
    const owed = new SequenceCache(this.dims, seq.tokens.length);
    for (const block of [...blocks].reverse()) {
      const [start, end] = block;
      const part = blockSequence(seq, block);
      const feeds = {
        ...sequenceFeeds(this.dims, [part], cache.past(start)),
        cotangent: cotangentFeed([part], [cotangent.subarray(start, end)]),
        ...ownCotangentFeeds(
          this.dims,
          1,
          end - start,
          owed.tensors.map((_, i) => owed.read(i, start, end)),
        ),
      };
      const result = await this.graphs.run('backward', feeds, ['logprobs', ...this.gradNames, ...this.pastGrads], adapter);
      // The logprobs of every block from its backward run (the last block had no forward run).
      logprobs.set(unpad(result.logprobs!, [part])[0]!, start);
      addGrads(result);
      if (start > 0)
        this.pastGrads.forEach((name, i) => {
          owed.write(i, 0, result[name]!, true);
        });
    }
    return logprobs;
  }
}
