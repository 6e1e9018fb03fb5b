import type { ModelEngine } from './engine.js';
import type { LoraAdapter } from './lora.js';
import { Prng } from './prng.js';

export interface SamplingParams {
  max_tokens: number;
  /** 0 = greedy. */
  temperature: number;
  /** In (0, 1]; 1 = off. */
  top_p: number;
  /** -1 = off. */
  top_k: number;
  /** Same seed, weights and prompt: same tokens. Null: a fresh random seed. */
  seed: number | null;
  /** Stop strings (matched on decoded text) or token ids. */
  stop: (string | number)[];
}

export const SAMPLING_DEFAULTS: SamplingParams = { max_tokens: 16, temperature: 1, top_p: 1, top_k: -1, seed: null, stop: [] };

export interface SampledSequence {
  tokens: number[];
  /** Logprob of each token under the temperature-scaled distribution (the unscaled one when greedy). */
  logprobs: number[];
  stop_reason: 'stop' | 'length';
}

export interface TextCodec {
  decode(ids: number[]): string;
  eosTokenIds: number[];
}

/**
 * Samples `n` continuations of one prompt as one batch: the prompt is
 * prefilled once, its KV cache repeated n times, then all n decode together.
 */
export async function sampleSequences(engine: ModelEngine, adapter: LoraAdapter, prompt: number[], n: number, params: SamplingParams, codec: TextCodec): Promise<SampledSequence[]> {
  const rng = new Prng(params.seed ?? `${Date.now()}-${Math.random()}`);
  const seqs: SampledSequence[] = Array.from({ length: n }, () => ({ tokens: [], logprobs: [], stop_reason: 'length' }));
  if (params.max_tokens <= 0 || n <= 0) return seqs;
  const stopIds = new Set<number>([...codec.eosTokenIds, ...params.stop.filter((s): s is number => typeof s === 'number')]);
  const stopStrings = params.stop.filter((s): s is string => typeof s === 'string');
  const done = new Array<boolean>(n).fill(false);
  const V = engine.dims.vocab;

  const first = await engine.decode([prompt], adapter, null);
  let state = engine.tileState(first.state, n);
  let logits = first.logits;
  let rowOf = (_i: number) => 0;
  const scratch = new Float64Array(V);
  for (let step = 0; step < params.max_tokens; step++) {
    for (let i = 0; i < n; i++) {
      if (done[i]) continue;
      const row = logits.subarray(rowOf(i) * V, (rowOf(i) + 1) * V);
      const [token, logprob] = chooseToken(row, params, rng, scratch);
      const seq = seqs[i]!;
      seq.tokens.push(token);
      seq.logprobs.push(logprob);
      if (stopIds.has(token) || (stopStrings.length && stopStrings.some((s) => codec.decode(seq.tokens).includes(s)))) {
        seq.stop_reason = 'stop';
        done[i] = true;
      }
    }
    if (done.every(Boolean) || step === params.max_tokens - 1) break;
    // Finished rows keep decoding their last token; their output is ignored.
    const next = await engine.decode(seqs.map((s) => [s.tokens[s.tokens.length - 1]!]), adapter, state);
    state = next.state;
    logits = next.logits;
    rowOf = (i) => i;
  }
  return seqs;
}

/** Picks the next token from one row of logits; returns it with its logprob. */
export function chooseToken(logits: Float32Array, params: SamplingParams, rng: Prng, scratch = new Float64Array(logits.length)): [number, number] {
  const greedy = params.temperature === 0;
  const invT = greedy ? 1 : 1 / params.temperature;
  // Log-softmax of logits/T, in float64.
  let max = -Infinity;
  for (let v = 0; v < logits.length; v++) if (logits[v]! > max) max = logits[v]!;
  let sum = 0;
  for (let v = 0; v < logits.length; v++) {
    scratch[v] = (logits[v]! - max) * invT;
    sum += Math.exp(scratch[v]!);
  }
  const lse = Math.log(sum);
  for (let v = 0; v < logits.length; v++) scratch[v] = scratch[v]! - lse;
  if (greedy) {
    let best = 0;
    for (let v = 1; v < logits.length; v++) if (scratch[v]! > scratch[best]!) best = v;
    return [best, scratch[best]!];
  }
  const candidates = truncate(scratch, params.top_k, params.top_p);
  let mass = 0;
  for (const v of candidates) mass += Math.exp(scratch[v]!);
  let u = rng.next() * mass;
  for (const v of candidates) {
    u -= Math.exp(scratch[v]!);
    if (u < 0) return [v, scratch[v]!];
  }
  const last = candidates[candidates.length - 1]!;
  return [last, scratch[last]!];
}

/**
 * The tokens left after top-k and top-p. Top-p needs the
 * smallest set whose mass reaches p; rather than sort the whole vocabulary,
 * tokens are bucketed by logprob and only the bucket where the mass crosses
 * p is sorted.
 */
function truncate(logp: Float64Array, topK: number, topP: number): number[] {
  const V = logp.length;
  const byProb = (a: number, b: number) => logp[b]! - logp[a]! || a - b;
  if (topK > 0 && topK < V) {
    const kept = topKIndices(logp, topK).sort(byProb);
    if (topP >= 1) return kept;
    const mass = kept.reduce((s, v) => s + Math.exp(logp[v]!), 0);
    const out: number[] = [];
    let acc = 0;
    for (const v of kept) {
      out.push(v);
      acc += Math.exp(logp[v]!);
      if (acc >= topP * mass) break;
    }
    return out;
  }
  if (topP >= 1) return Array.from({ length: V }, (_, v) => v);
  const PER_NAT = 64;
  const BUCKETS = 64 * 40;
  let top = -Infinity;
  for (let v = 0; v < V; v++) if (logp[v]! > top) top = logp[v]!;
  const bucketOf = (v: number) => Math.min(BUCKETS - 1, Math.floor((top - logp[v]!) * PER_NAT));
  const mass = new Float64Array(BUCKETS);
  for (let v = 0; v < V; v++) mass[bucketOf(v)]! += Math.exp(logp[v]!);
  let acc = 0;
  let crossing = 0;
  for (; crossing < BUCKETS - 1; crossing++) {
    if (acc + mass[crossing]! >= topP) break;
    acc += mass[crossing]!;
  }
  const inside: number[] = [];
  const edge: number[] = [];
  for (let v = 0; v < V; v++) {
    const b = bucketOf(v);
    if (b < crossing) inside.push(v);
    else if (b === crossing) edge.push(v);
  }
  edge.sort(byProb);
  for (const v of edge) {
    inside.push(v);
    acc += Math.exp(logp[v]!);
    if (acc >= topP) break;
  }
  // Index order, not probability order: sampling needs a fixed order, and sorting 10⁵ tokens per step is slow.
  return inside;
}

function topKIndices(logp: Float64Array, k: number): number[] {
  // A min-heap of size k over the vocabulary.
  const heap: number[] = [];
  const less = (a: number, b: number) => logp[a]! < logp[b]! || (logp[a] === logp[b] && a > b);
  const siftDown = (i: number) => {
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < heap.length && less(heap[l]!, heap[m]!)) m = l;
      if (r < heap.length && less(heap[r]!, heap[m]!)) m = r;
      if (m === i) return;
      [heap[i], heap[m]] = [heap[m]!, heap[i]!];
      i = m;
    }
  };
  for (let v = 0; v < logp.length; v++) {
    if (heap.length < k) {
      heap.push(v);
      for (let i = heap.length - 1; i > 0;) {
        const p = (i - 1) >> 1;
        if (!less(heap[i]!, heap[p]!)) break;
        [heap[i], heap[p]] = [heap[p]!, heap[i]!];
        i = p;
      }
    } else if (less(heap[0]!, v)) {
      heap[0] = v;
      siftDown(0);
    }
  }
  return heap;
}
