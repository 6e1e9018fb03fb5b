/** An engine's warm-up: each graph of a train-and-sample loop built and run once. */
import type { Decoding } from './engine-decode.js';
import { MERGE_FROM_POSITIONS } from './engine-graphs.js';
import type { Prefill } from './engine-prefill.js';
import type { Scoring } from './engine-scoring.js';
import { freshAdapter } from './lora.js';
import type { LoraSite } from './transformer.js';

/**
 * Builds the graphs a train-and-sample loop uses and runs each once on a few tokens (a first run sizes
 * onnxruntime's buffers), so that a client's first step costs what its later ones do.
 */
export async function warmUp(sites: LoraSite[], scoring: Scoring, prefill: Prefill, decoding: Decoding): Promise<void> {
  const adapter = freshAdapter(sites, 4, 8, 'warm-up');
  const seq = { tokens: [1, 2, 3], targets: [2, 3, 4] };
  // Short batches score through the unembedding and LoRA apart, long ones through their merged weight.
  const long = {
    tokens: Array.from({ length: MERGE_FROM_POSITIONS }, (_, i) => i + 1),
    targets: Array.from({ length: MERGE_FROM_POSITIONS }, (_, i) => i + 2),
  };
  for (const s of [seq, long]) {
    await scoring.forward([s], adapter);
    await scoring.backward([s], adapter, [new Float32Array(s.tokens.length).fill(1)]);
  }
  for (const draw of [0.5, -1]) {
    const start = await prefill.start(seq.tokens, adapter, 1, [draw], null, null);
    await decoding.step([{ token: 4, cache: start.cache, draw }], adapter, 1, null);
  }
}
