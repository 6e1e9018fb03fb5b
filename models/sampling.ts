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

/**
 * Picks the next token from one row of logits; returns it with its logprob.
 * One pass computes e_v = exp((l_v - max)/T) and their sum; the logprob of v
 * is log(e_v / sum). Truncation and the draw reuse e_v.
 */
export function chooseToken(logits: Float32Array, params: SamplingParams, rng: Prng, scratch = new Float64Array(logits.length)): [number, number] {
  const V = logits.length;
  const greedy = params.temperature === 0;
  const invT = greedy ? 1 : 1 / params.temperature;
  let max = -Infinity;
  let argmax = 0;
  for (let v = 0; v < V; v++) if (logits[v]! > max) { max = logits[v]!; argmax = v; }
  let sum = 0;
  for (let v = 0; v < V; v++) sum += scratch[v] = Math.exp((logits[v]! - max) * invT);
  const logprob = (v: number) => Math.log(scratch[v]! / sum);
  if (greedy) return [argmax, logprob(argmax)];
  if (params.top_k > 0 && params.top_k < V) {
    const kept = topKIndices(logits, params.top_k).sort((a, b) => scratch[b]! - scratch[a]! || a - b);
    return draw(kept, scratch, params.top_p, rng, logprob);
  }
  if (params.top_p >= 1) {
    let u = rng.next() * sum;
    for (let v = 0; v < V; v++) if ((u -= scratch[v]!) < 0) return [v, logprob(v)];
    return [argmax, logprob(argmax)];
  }
  const v = drawNucleus(logits, max, invT, scratch, sum, params.top_p, rng);
  return [v, logprob(v)];
}

/** Draws from candidates (most likely first when `topP` < 1 is applied here) in proportion to their weights. */
function draw(candidates: number[], weight: Float64Array, topP: number, rng: Prng, logprob: (v: number) => number): [number, number] {
  let kept = candidates;
  if (topP < 1) {
    const total = candidates.reduce((s, v) => s + weight[v]!, 0);
    let acc = 0;
    const cut = candidates.findIndex((v) => (acc += weight[v]!) >= topP * total);
    kept = candidates.slice(0, cut + 1);
  }
  let mass = 0;
  for (const v of kept) mass += weight[v]!;
  let u = rng.next() * mass;
  for (const v of kept) if ((u -= weight[v]!) < 0) return [v, logprob(v)];
  const last = kept[kept.length - 1]!;
  return [last, logprob(last)];
}

/**
 * Draws from the smallest set of most likely tokens whose mass reaches
 * `topP`, without sorting the vocabulary: tokens are bucketed by how far
 * their scaled logit lies below the maximum (1/64 nat per bucket), whole
 * buckets are taken from the top, and only the bucket where the mass
 * crosses `topP` is sorted. The draw scans tokens in index order.
 */
function drawNucleus(logits: Float32Array, max: number, invT: number, weight: Float64Array, sum: number, topP: number, rng: Prng): number {
  const PER_NAT = 64;
  const BUCKETS = PER_NAT * 40;
  const V = logits.length;
  const bucket = new Uint16Array(V);
  const mass = new Float64Array(BUCKETS);
  for (let v = 0; v < V; v++) {
    const b = Math.min(BUCKETS - 1, Math.floor((max - logits[v]!) * invT * PER_NAT));
    bucket[v] = b;
    mass[b]! += weight[v]!;
  }
  const target = topP * sum;
  let kept = 0;
  let crossing = 0;
  for (; crossing < BUCKETS - 1 && kept + mass[crossing]! < target; crossing++) kept += mass[crossing]!;
  const edge: number[] = [];
  for (let v = 0; v < V; v++) if (bucket[v] === crossing) edge.push(v);
  edge.sort((a, b) => weight[b]! - weight[a]! || a - b);
  const inEdge = new Set<number>();
  for (const v of edge) {
    inEdge.add(v);
    if ((kept += weight[v]!) >= target) break;
  }
  let u = rng.next() * kept;
  let last = edge[0] ?? 0;
  for (let v = 0; v < V; v++) {
    if (bucket[v]! < crossing || (bucket[v] === crossing && inEdge.has(v))) {
      last = v;
      if ((u -= weight[v]!) < 0) return v;
    }
  }
  return last;
}

function topKIndices(logp: Float32Array, k: number): number[] {
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
