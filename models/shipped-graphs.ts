/**
 * The warm-up's graphs optimized by the package's build and kept among its own entries (package-root.ts,
 * shippedCacheDir), so that a first process on an empty --cache-dir skips onnxruntime's optimization too (~0.1-0.2
 * s of the engine's worker on 2 cores). Optimized for the machine the build runs on, with the sessions' default
 * options (graph-runner.ts): they serve a checkout or an install built where it runs, the usual case; elsewhere,
 * or with --threads, their keys differ (optimized-models.ts) and each process optimizes as before.
 */
import { WARM_UP_KINDS } from './engine-warm-up.js';
import { graphDigest } from './graph-digests.js';
import { sessionOptions } from './graph-runner.js';
import { OptimizedModels } from './optimized-models.js';
import { FAMILY_VOCAB } from './registry.js';
import { DEFAULT_DIMS } from './transformer.js';
import { buildGraph } from './transformer-graphs.js';

/**
 * Run by the package's build: each built-in family's warm-up graphs, plain and with the unembedding merged (a
 * first round's evals and greedy samples use both), optimized and kept in `dir`. The number kept.
 */
export async function shipOptimizedGraphs(dir: string): Promise<number> {
  const models = new OptimizedModels(dir);
  const options = sessionOptions('cpu');
  for (const vocab of Object.values(FAMILY_VOCAB))
    for (const kind of WARM_UP_KINDS)
      for (const merged of [false, true]) {
        let onnx: Uint8Array;
        try {
          onnx = buildGraph(kind, { vocab, ...DEFAULT_DIMS }, { mergedUnembedding: merged }).onnx;
        } catch {
          continue; // a kind with no merged form
        }
        const session = await models.create({ digest: graphDigest(onnx), build: () => onnx }, options);
        await session.release();
      }
  return models.counts.miss + models.counts.rebuilt;
}
