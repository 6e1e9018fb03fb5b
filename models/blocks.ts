import { positionsOf, type Past, type ScoredSequence } from './feeds.js';
import type { ModelDims } from './transformer.js';

/**
 * A long sequence scored block by block. Work per graph run is what bounds
 * memory: a run over T positions holds [T × vocabulary] logits and
 * [heads × T × keys] attention scores per layer, so a 4,096-token sequence
 * in one run needs gigabytes. In blocks, each run attends to the keys and
 * values of the blocks before it (a few MB for the whole sequence, the model
 * being narrow), and the backward pass goes through the blocks in reverse,
 * handing each block what later blocks' losses owe to its keys and values.
 */

/** A block's positions, [start, end). */
export type Block = readonly [start: number, end: number];

/**
 * Blocks of at most `positions` positions, shorter where the keys grow long:
 * a block's attention scores ([heads × block × keys] floats per layer) stay
 * within `attentionFloats`, whatever the sequence's length.
 */
export function blocksOf(length: number, heads: number, limits: { positions: number; attentionFloats: number }): Block[] {
  const blocks: Block[] = [];
  for (let start = 0; start < length; ) {
    let size = Math.min(limits.positions, length - start);
    while (size > 16 && heads * size * (start + size) > limits.attentionFloats) size = Math.ceil(size / 2);
    blocks.push([start, start + size]);
    start += size;
  }
  return blocks;
}

/** Positions [start, end) of a sequence as a sequence of their own: its scored positions renumbered from the block's start. */
export function blockSequence(seq: ScoredSequence, [start, end]: Block): ScoredSequence {
  return {
    tokens: seq.tokens.slice(start, end),
    targets: seq.targets.slice(start, end),
    scored: positionsOf(seq)
      .filter((t) => t >= start && t < end)
      .map((t) => t - start),
  };
}

/**
 * One sequence's keys and values (or their gradients) by position: per
 * layer k then v, each [heads, length, headDim]. Graphs take and give them
 * as [1, heads, positions, headDim] for a stretch of positions.
 */
export class SequenceCache {
  readonly tensors: Float32Array[];
  private readonly heads: number;
  private readonly hd: number;

  constructor(
    dims: ModelDims,
    readonly length: number,
  ) {
    this.heads = dims.heads;
    this.hd = dims.dModel / dims.heads;
    this.tensors = Array.from({ length: 2 * dims.layers }, () => new Float32Array(this.heads * length * this.hd));
  }

  /** Positions [0, p): the past a block starting at p attends to. */
  past(p: number): Past {
    return { length: p, kv: this.tensors.map((_, i) => this.read(i, 0, p)) };
  }

  /** Positions [start, end) of tensor i, as [1, heads, end - start, headDim]. */
  read(i: number, start: number, end: number): Float32Array {
    const { heads, hd, length } = this;
    const n = end - start;
    const out = new Float32Array(heads * n * hd);
    for (let h = 0; h < heads; h++) out.set(this.tensors[i]!.subarray((h * length + start) * hd, (h * length + end) * hd), h * n * hd);
    return out;
  }

  /** Writes (or, with `add`, adds) [1, heads, n, headDim] values at positions [start, start + n) of tensor i. */
  write(i: number, start: number, values: Float32Array, add = false): void {
    const { heads, hd, length } = this;
    const n = values.length / (heads * hd);
    const target = this.tensors[i]!;
    for (let h = 0; h < heads; h++) {
      const from = h * n * hd;
      const to = (h * length + start) * hd;
      if (!add) target.set(values.subarray(from, from + n * hd), to);
      else for (let j = 0; j < n * hd; j++) target[to + j]! += values[from + j]!;
    }
  }
}
