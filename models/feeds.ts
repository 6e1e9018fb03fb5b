/** How the graphs' inputs and outputs are laid out: batches padded to their longest row, caches per row. */
import { siteRank, type LoraAdapter } from './lora.js';
import type { Feed } from './runner-protocol.js';
import { ROPE_BASE, type LoraSite, type ModelDims } from './transformer.js';

/** One sequence to score: `targets[i]` is the token position i predicts. */
export interface ScoredSequence {
  tokens: number[];
  targets: number[];
  /** Positions whose logprob is wanted (default: all). Others come back 0 and cost no unembedding. */
  scored?: number[];
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
  /** A top_p draw's second uniform number: where the token is drawn again when the first falls outside the nucleus. */
  retry?: number;
}

export interface DecodeState {
  /** Cache per layer: k then v, each [B, heads, P, headDim]. */
  past: Float32Array[];
  batch: number;
  length: number;
}

const NEG_INF = -1e9;

export function feed(type: Feed['type'], data: Float32Array | BigInt64Array, dims: number[]): Feed {
  return { type, data, dims };
}

export function positionsOf(s: ScoredSequence): number[] {
  return s.scored ?? s.tokens.map((_, t) => t);
}

export function scoredCount(s: ScoredSequence): number {
  // At least one slot per row, so every tensor keeps a non-empty shape.
  return Math.max(1, s.scored?.length ?? s.tokens.length);
}

/** How much one scoring run may hold: padded positions (attention, activations) and score slots (logits: slots × vocabulary floats). */
export interface ScoringLimits {
  positions: number;
  scored: number;
}

/** Whether sequences fit one scoring run together: padded to the longest, within both limits. */
export function fitsOneRun(seqs: ScoredSequence[], limits: ScoringLimits): boolean {
  return fitsShape(Math.max(...seqs.map((s) => s.tokens.length)), Math.max(...seqs.map(scoredCount)), seqs.length, limits);
}

/** Whether `n` sequences padded to `T` positions and `S` score slots fit one run. */
function fitsShape(T: number, S: number, n: number, limits: ScoringLimits): boolean {
  return T * n <= limits.positions && S * n <= limits.scored;
}

/**
 * Splits sequences, in order, into runs within `limits`. A sequence over
 * either limit on its own comes alone, as `long`: it is scored block by
 * block (models/blocks.ts), so no run holds more than the limits allow.
 */
export function* scoringUnits(seqs: ScoredSequence[], limits: ScoringLimits): Generator<{ seqs: ScoredSequence[]; long: boolean }> {
  let chunk: ScoredSequence[] = [];
  // The chunk's longest sequence and most score slots, kept as it grows.
  let T = 0;
  let S = 0;
  const flush = function* () {
    if (chunk.length) yield { seqs: chunk, long: false };
    chunk = [];
    T = S = 0;
  };
  for (const s of seqs) {
    const scored = scoredCount(s);
    if (s.tokens.length > limits.positions || scored > limits.scored) {
      yield* flush();
      yield { seqs: [s], long: true };
      continue;
    }
    if (chunk.length && !fitsShape(Math.max(T, s.tokens.length), Math.max(S, scored), chunk.length + 1, limits)) yield* flush();
    chunk.push(s);
    T = Math.max(T, s.tokens.length);
    S = Math.max(S, scored);
  }
  yield* flush();
}

/** Keys and values of the positions before a block, per layer k then v, each [1, heads, length, headDim]. */
export interface Past {
  length: number;
  kv: Float32Array[];
}

/** Additive attention bias: query i sees keys 0..P+i that lie within its row's length. */
export function causalBias(B: number, Tq: number, P: number, lengths: number[]): Float32Array {
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

/** cos and sin of each position's rotary angles, [B, T, headDim] (halves repeated); row b starts at position offset(b). */
export function ropeFeeds(headDim: number, B: number, T: number, offset: number | ((b: number) => number)): Record<string, Feed> {
  const hd = headDim;
  const half = hd / 2;
  const cos = new Float32Array(B * T * hd);
  const sin = new Float32Array(B * T * hd);
  const start = typeof offset === 'number' ? () => offset : offset;
  for (let b = 0; b < B; b++) {
    for (let t = 0; t < T; t++) {
      const at = (b * T + t) * hd;
      for (let j = 0; j < half; j++) {
        const angle = (start(b) + t) * ROPE_BASE ** ((-2 * j) / hd);
        cos[at + j] = cos[at + j + half] = Math.cos(angle);
        sin[at + j] = sin[at + j + half] = Math.sin(angle);
      }
    }
  }
  return { rope_cos: feed('float32', cos, [B, T, hd]), rope_sin: feed('float32', sin, [B, T, hd]) };
}

/**
 * Feeds of the scoring graphs (forward, backward, topk) for sequences
 * right-padded to the longest; with `past`, one sequence's block after the
 * cached positions of the blocks before it.
 */
export function sequenceFeeds(dims: ModelDims, chunk: ScoredSequence[], past?: Past): Record<string, Feed> {
  const B = chunk.length;
  if (past && B !== 1) throw new Error('a block with cached positions is one sequence');
  const P = past?.length ?? 0;
  const T = Math.max(...chunk.map((s) => s.tokens.length));
  const S = Math.max(...chunk.map(scoredCount));
  const d = dims.dModel;
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
    attn_bias: feed(
      'float32',
      causalBias(
        B,
        T,
        P,
        chunk.map((s) => P + s.tokens.length),
      ),
      [B, 1, T, P + T],
    ),
    ...ropeFeeds(d / dims.heads, B, T, P),
    ...pastFeeds(dims, B, past),
  };
}

/** past_k.l / past_v.l: the cached keys and values, or none ([B, heads, 0, headDim]). */
export function pastFeeds(dims: ModelDims, B: number, past?: Past): Record<string, Feed> {
  const { heads } = dims;
  const hd = dims.dModel / heads;
  const P = past?.length ?? 0;
  const feeds: Record<string, Feed> = {};
  for (let l = 0; l < dims.layers; l++) {
    feeds[`past_k.${l}`] = feed('float32', past?.kv[2 * l] ?? new Float32Array(0), [B, heads, P, hd]);
    feeds[`past_v.${l}`] = feed('float32', past?.kv[2 * l + 1] ?? new Float32Array(0), [B, heads, P, hd]);
  }
  return feeds;
}

/** The backward graph's cot_k.l / cot_v.l: what later blocks owe to this block's keys and values ([B, heads, T, headDim]), zeros when none. */
export function ownCotangentFeeds(dims: ModelDims, B: number, T: number, owed?: Float32Array[]): Record<string, Feed> {
  const { heads } = dims;
  const hd = dims.dModel / heads;
  const feeds: Record<string, Feed> = {};
  for (let l = 0; l < dims.layers; l++) {
    feeds[`cot_k.${l}`] = feed('float32', owed?.[2 * l] ?? new Float32Array(B * heads * T * hd), [B, heads, T, hd]);
    feeds[`cot_v.${l}`] = feed('float32', owed?.[2 * l + 1] ?? new Float32Array(B * heads * T * hd), [B, heads, T, hd]);
  }
  return feeds;
}

/** The backward graph's cotangent per score slot, [B, S]: `cotangents[b]` holds one per position of chunk[b]. */
export function cotangentFeed(chunk: ScoredSequence[], cotangents: Float32Array[]): Feed {
  const S = Math.max(...chunk.map(scoredCount));
  const c = new Float32Array(chunk.length * S);
  chunk.forEach((seq, b) => {
    positionsOf(seq).forEach((t, k) => {
      c[b * S + k] = cotangents[b]![t]!;
    });
  });
  return feed('float32', c, [chunk.length, S]);
}

/** Per sequence, a full-length array: each scored position's logprob, 0 elsewhere. */
export function unpad(flat: Float32Array, chunk: ScoredSequence[]): Float32Array[] {
  const S = Math.max(...chunk.map(scoredCount));
  return chunk.map((s, b) => {
    const out = new Float32Array(s.tokens.length);
    positionsOf(s).forEach((t, k) => {
      out[t] = flat[b * S + k]!;
    });
    return out;
  });
}

/** The k most likely tokens at one position, most likely first, and their logprobs. */
export interface TopTokens {
  ids: number[];
  logprobs: number[];
}

/** Per sequence and position, the k most likely tokens from the topk graph's [B, S, k] outputs (one row per score slot); an empty row where a position was not scored. */
export function topkRows(values: Float32Array, indices: BigInt64Array, chunk: ScoredSequence[], k: number): TopTokens[][] {
  const S = Math.max(...chunk.map(scoredCount));
  return chunk.map((s, b) => {
    const rows: TopTokens[] = Array.from({ length: s.tokens.length }, () => ({ ids: [], logprobs: [] }));
    positionsOf(s).forEach((t, j) => {
      const at = (b * S + j) * k;
      rows[t] = { ids: Array.from(indices.subarray(at, at + k), Number), logprobs: Array.from(values.subarray(at, at + k)) };
    });
    return rows;
  });
}

/** Feeds of the decode graphs for prompts (right-padded to the longest) after the cached positions of `state`. */
export function promptFeeds(dims: ModelDims, tokens: number[][], invTemperatures: number[], state: DecodeState | null): Record<string, Feed> {
  const B = tokens.length;
  const Tq = Math.max(...tokens.map((t) => t.length));
  const P = state?.length ?? 0;
  const { heads } = dims;
  const hd = dims.dModel / heads;
  const ids = new BigInt64Array(B * Tq);
  tokens.forEach((row, b) => {
    row.forEach((t, i) => {
      ids[b * Tq + i] = BigInt(t);
    });
  });
  const feeds: Record<string, Feed> = {
    tokens: feed('int64', ids, [B, Tq]),
    attn_bias: feed(
      'float32',
      causalBias(
        B,
        Tq,
        P,
        tokens.map((t) => P + t.length),
      ),
      [B, 1, Tq, P + Tq],
    ),
    inv_temperature: feed('float32', Float32Array.from(invTemperatures), [B, 1]),
    last_index: feed(
      'int64',
      BigInt64Array.from(tokens, (t) => BigInt(t.length - 1)),
      [B, 1],
    ),
    ...ropeFeeds(hd, B, Tq, P),
    ...pastFeeds(dims, B, state ? { length: P, kv: state.past } : undefined),
  };
  return feeds;
}

/** Row b's first `length` positions of a [B, heads, T, headDim] cache tensor. */
export function rowCache(dims: ModelDims, present: Float32Array, b: number, T: number, length: number): Float32Array {
  const { heads } = dims;
  const hd = dims.dModel / heads;
  const out = new Float32Array(heads * length * hd);
  for (let h = 0; h < heads; h++) out.set(present.subarray((b * heads + h) * T * hd, ((b * heads + h) * T + length) * hd), h * length * hd);
  return out;
}

/**
 * Feeds of one decode step for rows with caches of their own: each row's
 * next token after its cache, caches padded to the longest and masked.
 */
export function stepFeeds(dims: ModelDims, rows: DecodeRow[], invTemperatures: number[]): Record<string, Feed> {
  const B = rows.length;
  const { heads } = dims;
  const hd = dims.dModel / heads;
  const P = Math.max(...rows.map((r) => r.cache.length));
  const bias = new Float32Array(B * (P + 1));
  rows.forEach((r, b) => {
    for (let j = r.cache.length; j < P; j++) bias[b * (P + 1) + j] = NEG_INF;
  });
  const feeds: Record<string, Feed> = {
    tokens: feed('int64', BigInt64Array.from(rows.map((r) => BigInt(r.token))), [B, 1]),
    attn_bias: feed('float32', bias, [B, 1, 1, P + 1]),
    inv_temperature: feed('float32', Float32Array.from(invTemperatures), [B, 1]),
    last_index: feed('int64', new BigInt64Array(B), [B, 1]),
    ...ropeFeeds(hd, B, 1, (b) => rows[b]!.cache.length),
  };
  const rowSize = heads * P * hd;
  for (let i = 0; i < 2 * dims.layers; i++) {
    const past = new Float32Array(B * rowSize);
    rows.forEach((r, b) => {
      const own = r.cache.past[i]!;
      const len = r.cache.length;
      for (let h = 0; h < heads; h++) past.set(own.subarray(h * len * hd, (h + 1) * len * hd), b * rowSize + h * P * hd);
    });
    feeds[`${i % 2 === 0 ? 'past_k' : 'past_v'}.${Math.floor(i / 2)}`] = feed('float32', past, [B, heads, P, hd]);
  }
  return feeds;
}

/** Each row's cache after a step (`presents`: [B, heads, P + 1, headDim] per layer k then v): its own positions, then the new one, padding dropped. */
export function grownCaches(dims: ModelDims, presents: Float32Array[], rows: DecodeRow[]): RowCache[] {
  const { heads } = dims;
  const hd = dims.dModel / heads;
  const P = Math.max(...rows.map((r) => r.cache.length));
  return rows.map((r, b) => {
    const len = r.cache.length;
    const past = presents.map((present) => {
      const out = new Float32Array(heads * (len + 1) * hd);
      for (let h = 0; h < heads; h++) {
        const src = (b * heads + h) * (P + 1) * hd;
        out.set(present.subarray(src, src + len * hd), h * (len + 1) * hd);
        out.set(present.subarray(src + P * hd, src + (P + 1) * hd), (h * (len + 1) + len) * hd);
      }
      return out;
    });
    return { past, length: len + 1 };
  });
}

/** A per-layer output pair's names, layer by layer: `<k>.0`, `<v>.0`, `<k>.1`... (a cache's keys then values). */
export function layerNames(dims: ModelDims, k: string, v: string): string[] {
  return Array.from({ length: dims.layers }, (_, l) => [`${k}.${l}`, `${v}.${l}`]).flat();
}

/** The LoRA gradients' output names, `grad.<site>.A` / `.B` in site order. */
export function gradNames(sites: LoraSite[]): string[] {
  return sites.flatMap((s) => [`grad.${s.key}.A`, `grad.${s.key}.B`]);
}

/** An adapter's LoRA tensors and scale as graph inputs. */
export function loraFeeds(sites: LoraSite[], adapter: LoraAdapter): Record<string, Feed> {
  const feeds: Record<string, Feed> = { lora_scale: feed('float32', new Float32Array([adapter.scale]), []) };
  for (const site of sites) {
    const t = adapter.tensors.get(site.key)!;
    const r = siteRank(t, site);
    feeds[`lora.${site.key}.A`] = feed('float32', t.A, [site.inDim, r]);
    feeds[`lora.${site.key}.B`] = feed('float32', t.B, [r, site.outDim]);
  }
  return feeds;
}
