/**
 * The graphs' digests, taken when the command is bundled (scripts/build-if-stale.mjs) and written into the
 * bundle itself: a session whose optimized graph is kept (optimized-models.ts) is then made without building its
 * graph first, only to hash it (~50 ms of the worker's thread for the warm-up's seven graphs, the backward's
 * autodiff ~20 of them). Written into the same build as the code that builds the graphs, they cannot disagree
 * with it; run from source or from dist/models (no bundle) there are none, and every graph is built and hashed.
 */
import { createHash } from 'node:crypto';
import { FAMILY_VOCAB } from './registry.js';
import { DEFAULT_DIMS, type GraphKind, type ModelDims } from './transformer.js';
import { buildGraph } from './transformer-graphs.js';

/** What a graph is built from (buildGraph's arguments, as the runner gives them). */
export interface GraphSpec {
  kind: GraphKind;
  dims: ModelDims;
  merged: boolean;
  mixed: boolean;
}

/** Every graph kind (the record makes the compiler name a kind added later). */
const EVERY_KIND = Object.keys({
  forward: 1,
  backward: 1,
  decode: 1,
  draw: 1,
  draw_top: 1,
  draw_nucleus: 1,
  draw_nucleus_wide: 1,
  greedy: 1,
  topk: 1,
} satisfies Record<GraphKind, 1>) as GraphKind[];

/** A spec's name in a digest table: every field of the dimensions, whatever fields they come to have. */
export function graphSpecKey(spec: GraphSpec): string {
  const dims = Object.entries(spec.dims).sort(([a], [b]) => a.localeCompare(b));
  return JSON.stringify([spec.kind, spec.merged, spec.mixed, dims]);
}

/** A graph's digest: what optimized-models.ts keys its entries by. */
export function graphDigest(onnx: Uint8Array): string {
  return createHash('sha256').update(onnx).digest('hex');
}

/** The graphs a server of the built-in families builds: every kind, plain, merged and mixed, at the default dimensions. */
export function builtInGraphSpecs(): GraphSpec[] {
  const specs: GraphSpec[] = [];
  for (const vocab of Object.values(FAMILY_VOCAB))
    for (const kind of EVERY_KIND)
      for (const [merged, mixed] of [
        [false, false],
        [true, false],
        [false, true],
      ] as const)
        specs.push({ kind, dims: { vocab, ...DEFAULT_DIMS }, merged, mixed });
  return specs;
}

/** The digests of `specs` by graphSpecKey; a spec buildGraph refuses (a merged mixed graph, say) is left out. */
export function graphDigests(specs: GraphSpec[]): Record<string, string> {
  const table: Record<string, string> = {};
  for (const spec of specs) {
    let onnx: Uint8Array;
    try {
      onnx = buildGraph(spec.kind, spec.dims, { mergedUnembedding: spec.merged, mixedAdapters: spec.mixed }).onnx;
    } catch {
      continue;
    }
    table[graphSpecKey(spec)] = graphDigest(onnx);
  }
  return table;
}

/** Replaced by the bundler with the table graphDigests(builtInGraphSpecs()) made in the same build, as JSON text. */
declare const LOOPS_MOCK_GRAPH_DIGESTS: string | undefined;

/** The bundle's digests; null outside the bundle. */
export const BUNDLED_GRAPH_DIGESTS: Readonly<Record<string, string>> | null =
  typeof LOOPS_MOCK_GRAPH_DIGESTS === 'undefined' ? null : (JSON.parse(LOOPS_MOCK_GRAPH_DIGESTS) as Record<string, string>);
