/** What an engine's warm-up builds: the graph kinds the guides' flows use. */
import type { GraphKind } from './transformer.js';

/**
 * The graph kinds the guides' flows use, in the order a client first needs them: evals and steps, greedy
 * sampling, temperature sampling (one sample and several go through the same `draw`), top_p's and top_k's
 * draws, and the top-k logprobs. Their sessions are built ahead on the engine's worker (ModelEngine.warmUp),
 * and not run: a graph's first run costs little more than its later ones once its session exists (~20 ms more
 * for all seven together, where running each once cost ~70 ms of the worker while the server was starting).
 * Not the merged unembedding's forward and backward: a run scoring that many positions is heavy
 * (engine-graphs.ts) and gets sessions of its own, released a moment after, so a warm-up's would be gone by
 * the time a client's eval came.
 */
export const WARM_UP_KINDS: readonly GraphKind[] = ['forward', 'backward', 'greedy', 'draw', 'draw_nucleus', 'draw_top', 'topk'];
