/** Which decode graph a sampling request runs (its draw and cut), the inputs of that draw, and which requests may share a run. */
import { NUCLEUS_TESTS_UP_TO } from './draw-graphs.js';
import { feed } from './feeds.js';
import { versionKey, type LoraAdapter } from './lora.js';
import type { Feed } from './runner-protocol.js';
import type { GraphKind } from './transformer.js';

/** The decode graphs: the whole next-token distribution back, a token drawn in the graph, or the most likely one. */
export type StepKind = 'decode' | 'draw' | 'draw_top' | 'draw_nucleus' | 'draw_nucleus_wide' | 'greedy';

/**
 * A draw among the `topK` most likely tokens (0: all), cut again to the `topP` nucleus of their mass (1:
 * none): drawn in the graph (draw_top with a top-k, draw_nucleus without; draw_nucleus_wide for a prompt's many draws).
 */
export interface TopCut {
  topK: number;
  topP: number;
}

export const cutKind = (cut: TopCut, draws = 1): StepKind => (cut.topK > 0 ? 'draw_top' : draws > NUCLEUS_TESTS_UP_TO ? 'draw_nucleus_wide' : 'draw_nucleus');
export const isNucleus = (kind: StepKind) => kind === 'draw_nucleus' || kind === 'draw_nucleus_wide';

/** Requests that may share one graph run: the same decode graph, whatever their adapters (see byAdapter) unless `batchRuns` is off. */
export function drawBatchKey(adapter: LoraAdapter, kind: GraphKind, cut: TopCut | null, batchRuns: boolean): string {
  // The k of a top-k draw is one number per graph run; each row brings its own top_p.
  const graph = `${kind}${kind === 'draw_top' ? `:${cut!.topK}` : ''}`;
  return batchRuns ? graph : `${versionKey(adapter)}:${graph}`;
}

/** One draw's uniform numbers: `retry` only for a top_p draw (see DecodeRow.retry). */
export interface Uniforms {
  u: number;
  retry?: number;
}

/**
 * The uniform numbers of a drawing graph run, `N` per row (rows with fewer padded at 0.5): `u`, and `u_retry`
 * for a top_p draw (startSequence and decodeRows see that each such draw brings one).
 */
export function uniformFeeds(kind: StepKind, rows: Uniforms[][], N: number): Record<string, Feed> {
  const of = (pick: (d: Uniforms) => number) =>
    feed(
      'float32',
      Float32Array.from({ length: rows.length * N }, (_, i) => {
        const d = rows[Math.floor(i / N)]![i % N];
        return d ? pick(d) : 0.5;
      }),
      [rows.length, N],
    );
  return isNucleus(kind) ? { u: of((d) => d.u), u_retry: of((d) => d.retry!) } : { u: of((d) => d.u) };
}

/** The inputs of a cut draw: each row's top_p, and k for a top-k one (one k per graph run). */
export function cutFeeds(cut: TopCut, topP: number[]): Record<string, Feed> {
  // A top_p below float32's smallest number would become 0 and keep nothing: the smallest keeps the most likely token.
  const rows = {
    top_p: feed(
      'float32',
      Float32Array.from(topP, (p) => Math.max(p, 2 ** -149)),
      [topP.length, 1],
    ),
  };
  return cut.topK > 0 ? { ...rows, k: feed('int64', BigInt64Array.from([BigInt(cut.topK)]), [1]) } : rows;
}
