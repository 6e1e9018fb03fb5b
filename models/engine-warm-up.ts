/** An engine's warm-up: each graph the guides' flows use built and run once, a client's work always first. */
import type { Decoding } from './engine-decode.js';
import type { GraphTurns } from './engine-graphs.js';
import type { Prefill } from './engine-prefill.js';
import type { Scoring } from './engine-scoring.js';
import { freshAdapter } from './lora.js';
import type { GraphKind, LoraSite } from './transformer.js';

/** The graph kinds the warm-up's steps build, in the order they first run them (a test holds the two together). */
export const WARM_UP_KINDS: readonly GraphKind[] = ['forward', 'backward', 'greedy', 'draw', 'draw_nucleus', 'draw_top', 'topk'];

/** The parts of an engine its warm-up runs through: the same paths a client's calls take. */
export interface WarmUpParts {
  graphs: GraphTurns;
  scoring: Scoring;
  prefill: Prefill;
  decoding: Decoding;
}

/**
 * Builds the graphs the guides' flows use, in the order a client first needs them, and runs each once on a few
 * tokens (a first run sizes onnxruntime's buffers), so that a client's first step costs what its later ones do:
 * evals and steps, greedy sampling, temperature sampling of one and of several samples, top_p and top_k draws, and
 * the top-k logprobs. Not the merged unembedding's forward and backward: a run scoring that many positions is heavy
 * (engine-graphs.ts) and gets sessions of its own, released a moment after, so a warm-up's would be gone by the
 * time a client's eval came (every round builds them afresh, warm or not). Each step waits until the engine has no
 * client work queued: a client sent the moment the server listens waits behind one warm-up run at most, and a graph
 * it needs that warm-up has not reached yet it builds itself.
 */
export async function warmUp(sites: LoraSite[], parts: WarmUpParts, stopped: () => boolean = () => false): Promise<void> {
  const { graphs, scoring, prefill, decoding } = parts;
  const adapter = freshAdapter(sites, 4, 8, 'warm-up');
  const seq = { tokens: [1, 2, 3], targets: [2, 3, 4] };
  const ones = (s: { tokens: number[] }) => [new Float32Array(s.tokens.length).fill(1)];
  /** A prompt's prefill and one decode step after it, for the draw the arguments give. */
  const sample = async (draws: number[], cut: { topK: number; topP: number } | null = null, retries: number[] | null = null) => {
    const start = await prefill.start(seq.tokens, adapter, 1, draws, cut, retries);
    await decoding.step([{ token: 4, cache: start.cache, draw: draws[0]!, ...(retries ? { retry: retries[0]! } : {}) }], adapter, 1, cut);
  };
  const steps: (() => Promise<unknown>)[] = [
    () => scoring.forward([seq], adapter),
    () => scoring.backward([seq], adapter, ones(seq)),
    () => sample([-1]),
    () => sample([0.5]),
    () => sample([0.2, 0.4, 0.6, 0.8]),
    () => sample([0.5], { topK: 0, topP: 0.9 }, [0.5]),
    () => sample([0.5], { topK: 8, topP: 1 }),
    () => scoring.topk([seq], adapter, 4),
  ];
  for (const step of steps) {
    await graphs.whenIdle();
    if (stopped()) return;
    await step();
  }
}
