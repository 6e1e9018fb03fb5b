import type { ModelEngine, RowCache, RowStep } from './engine.js';
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

/** At most this many stop strings a request, each of at most STOP_MAX_CHARS characters (as OpenAI bounds them, more generously). */
export const STOP_MAX_STRINGS = 64;
export const STOP_MAX_CHARS = 512;

export interface TextCodec {
  decode(ids: number[]): string;
  eosTokenIds: number[];
}

export interface DrawnToken {
  /** Which of the n sequences. */
  index: number;
  token: number;
  logprob: number;
  /** Set on a sequence's last token: why it ends there. */
  finish_reason: 'stop' | 'length' | null;
}

/** What a caller streaming the tokens gives: told each token once it is drawn; an abort ends the sampling. */
export interface SamplingHooks {
  /** Called in draw order, before the next decode step starts; a returned promise holds that step until it settles. */
  onToken?: (drawn: DrawnToken) => void | Promise<void>;
  /** Aborted: no further decode step is started and sampleSequences rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Samples `n` continuations of one prompt as one batch: the prompt is
 * prefilled once, its KV cache repeated n times, then all n decode together.
 * With `hooks`, each token is told as soon as it is drawn (streaming), and an abort stops the work.
 */
export async function sampleSequences(
  engine: ModelEngine,
  adapter: LoraAdapter,
  prompt: number[],
  n: number,
  params: SamplingParams,
  codec: TextCodec,
  hooks: SamplingHooks = {},
): Promise<SampledSequence[]> {
  const rng = new Prng(params.seed ?? `${Date.now()}-${Math.random()}`);
  const seqs: SampledSequence[] = Array.from({ length: n }, () => ({ tokens: [], logprobs: [], stop_reason: 'length' }));
  if (params.max_tokens <= 0 || n <= 0) return seqs;
  const stopIds = new Set<number>([...codec.eosTokenIds, ...params.stop.filter((s): s is number => typeof s === 'number')]);
  const stopStrings = params.stop.filter((s): s is string => typeof s === 'string');
  // Each sequence's text is decoded once per token (not once per stop string), and a stop string is looked for
  // only where it could end in the text this token added: earlier text was searched at earlier tokens. A few
  // characters more are searched, since a character split across tokens decodes differently once complete.
  const searched = new Array<number>(n).fill(0);
  const stopMatched = (tokens: number[], i: number): boolean => {
    const text = codec.decode(tokens);
    const from = searched[i]!;
    searched[i] = text.length;
    return stopStrings.some((stop) => text.indexOf(stop, Math.max(0, from - stop.length - 4)) >= 0);
  };

  // The graph applies the temperature (greedy: none).
  const invT = params.temperature === 0 ? 1 : 1 / params.temperature;
  // The graph draws every token itself: greedy, by the inverse CDF (no cut), among the sorted top-k candidates
  // (draw_top), or from the top_p nucleus (draw_nucleus: the plain draw, then a retry, then a redraw inside the
  // nucleus). Only the tokens cross back, not two vocabulary-sized arrays per row. Their uniform numbers come
  // from the request's generator, as chooseToken (the same draws in JavaScript, by definition) takes them: one
  // per token, two for a top_p draw without top_k. A seed fixes the tokens.
  const topK = params.top_k > 0 && params.top_k < engine.dims.vocab;
  const cut = params.temperature !== 0 && (topK || params.top_p < 1) ? { topK: topK ? params.top_k : 0, topP: Math.min(params.top_p, 1) } : null;
  const nextDraw = () => (params.temperature === 0 ? -1 : rng.next());
  // A top_p draw alone takes a second number, right after its first: its retry (see drawNucleus).
  const nucleus = cut !== null && cut.topK === 0;
  const nextUniforms = () => {
    const u = nextDraw();
    return { u, retry: nucleus ? rng.next() : undefined };
  };
  const draws = seqs.map(nextUniforms);
  hooks.signal?.throwIfAborted();
  const first = await engine.startSequence(
    prompt,
    adapter,
    invT,
    draws.map((d) => d.u),
    cut,
    nucleus ? draws.map((d) => d.retry!) : null,
  );
  // Every sample starts from the prompt's cache; unfinished rows then step together, batched with other requests'.
  const close = engine.openStream();
  try {
    let rows: { i: number; step: RowStep }[] = seqs.map((_, i) => ({ i, step: { drawn: first.drawn![i], cache: first.cache } }));
    for (let step = 0; step < params.max_tokens && rows.length; step++) {
      const next: { i: number; token: number; cache: RowCache }[] = [];
      for (const { i, step: out } of rows) {
        const { token, logprob } = out.drawn!;
        const seq = seqs[i]!;
        seq.tokens.push(token);
        seq.logprobs.push(logprob);
        const stopped = stopIds.has(token) || (stopStrings.length > 0 && stopMatched(seq.tokens, i));
        if (stopped) {
          seq.stop_reason = 'stop';
        } else {
          next.push({ i, token, cache: out.cache });
        }
        if (hooks.onToken) {
          const told = hooks.onToken({ index: i, token, logprob, finish_reason: stopped ? 'stop' : step === params.max_tokens - 1 ? 'length' : null });
          if (told) await told;
        }
      }
      if (step === params.max_tokens - 1 || !next.length) break;
      hooks.signal?.throwIfAborted();
      const stepped = await engine.decodeRows(
        next.map((r) => {
          const { u, retry } = nextUniforms();
          return { token: r.token, cache: r.cache, draw: u, retry };
        }),
        adapter,
        invT,
        cut,
      );
      rows = next.map((r, k) => ({ i: r.i, step: stepped[k]! }));
    }
  } finally {
    close();
  }
  return seqs;
}

/**
 * One sequence's text as its tokens arrive, for streaming it: each token gives the text that can no longer
 * change. Held back: a tail that could still be the start of a stop string (it may yet become one, and a
 * stop string is never sent), and an incomplete UTF-8 character (decoded as U+FFFD until its last byte).
 * End-of-sequence tokens add no text. The text released in all equals the whole answer's: the decoded
 * tokens cut before the first stop string.
 */
export class StreamedText {
  private readonly tokens: number[] = [];
  private sent = '';
  private stopped = false;

  constructor(
    private readonly decode: (ids: number[]) => string,
    private readonly stopStrings: string[],
    private readonly eos: ReadonlySet<number>,
  ) {}

  /** Adds a drawn token; returns the text it releases (often '', while held back). `last`: the sequence ends here, release the rest. */
  push(token: number, last: boolean): string {
    if (this.stopped) return '';
    if (!this.eos.has(token)) this.tokens.push(token);
    const text = this.decode(this.tokens);
    const cut = cutAtStop(text, this.stopStrings);
    if (cut !== null || last) {
      this.stopped = true;
      return this.release(cut ?? text);
    }
    return this.release(text.slice(0, text.length - this.heldBack(text)));
  }

  /** Everything released so far. */
  get text(): string {
    return this.sent;
  }

  private release(upTo: string): string {
    // A decoder that rewrites earlier text (rare) cannot take back what was sent: wait until it agrees again.
    if (!upTo.startsWith(this.sent)) return '';
    const delta = upTo.slice(this.sent.length);
    this.sent = upTo;
    return delta;
  }

  /** How many characters at the end of `text` may still change or start a stop string. */
  private heldBack(text: string): number {
    let held = 0;
    while (held < text.length && text[text.length - 1 - held] === '\uFFFD') held++;
    for (const s of this.stopStrings) {
      for (let k = Math.min(s.length - 1, text.length); k > held; k--) {
        if (text.endsWith(s.slice(0, k))) {
          held = k;
          break;
        }
      }
    }
    return held;
  }
}

/** `text` before the first stop string in it, or null when none is in it. */
export function cutAtStop(text: string, stopStrings: string[]): string | null {
  let at = -1;
  for (const s of stopStrings) {
    const i = text.indexOf(s);
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  return at < 0 ? null : text.slice(0, at);
}

/**
 * Picks the next token from one row: `logprobs` is the log-softmax at the
 * request's temperature (unscaled when greedy) and `probs` its exp, both
 * computed by the decode graph. Returns the token and its logprob.
 */
export function chooseToken(logprobs: Float32Array, probs: Float32Array, params: SamplingParams, rng: Prng): [number, number] {
  const V = logprobs.length;
  if (params.temperature === 0) {
    let best = 0;
    for (let v = 1; v < V; v++) if (logprobs[v]! > logprobs[best]!) best = v;
    return [best, logprobs[best]!];
  }
  let candidates: number[] | null = null;
  if (params.top_k > 0 && params.top_k < V) candidates = topKIndices(probs, params.top_k).sort((a, b) => probs[b]! - probs[a]! || a - b);
  if (params.top_p < 1) {
    if (!candidates) {
      const v = drawNucleus(probs, params.top_p, rng);
      return [v, logprobs[v]!];
    }
    candidates = topPOf(candidates, probs, params.top_p);
  }
  let mass = 0;
  if (candidates) for (const v of candidates) mass += probs[v]!;
  else for (let v = 0; v < V; v++) mass += probs[v]!;
  let u = rng.next() * mass;
  if (candidates) {
    for (const v of candidates) {
      u -= probs[v]!;
      if (u < 0) return [v, logprobs[v]!];
    }
    const last = candidates[candidates.length - 1]!;
    return [last, logprobs[last]!];
  }
  for (let v = 0; v < V; v++) {
    u -= probs[v]!;
    if (u < 0) return [v, logprobs[v]!];
  }
  return [V - 1, logprobs[V - 1]!];
}

/** The most likely candidates (sorted, most likely first) whose mass reaches `topP` of theirs. */
function topPOf(candidates: number[], probs: Float32Array, topP: number): number[] {
  const total = candidates.reduce((s, v) => s + probs[v]!, 0);
  let acc = 0;
  const cut = candidates.findIndex((v) => {
    acc += probs[v]!;
    return acc >= topP * total;
  });
  return candidates.slice(0, cut + 1);
}

/** Scratch buffers of nucleusOf, grown to the vocabulary once: sampling runs on one thread, one call at a time. */
let edgeScratch = new Int32Array(0);
let markScratch = new Uint8Array(0);
const BUCKETS = 1 << 13;
const coarseScratch = new Float64Array(BUCKETS);
const fineScratch = new Float64Array(BUCKETS);

/**
 * Draws from the smallest set of most likely tokens whose mass reaches `topP` (the lower id first on ties),
 * by rejection, as the decode graph does (drawNucleusTokens): the token at u of the whole distribution if it
 * is in the nucleus, else the token at a second number (the retry) if it is; else the nucleus is drawn from,
 * in id order, at the retry's place in the running sum among the tokens outside it, as a fraction of their
 * mass (uniform again, given where the retry fell). Each token of the nucleus gets exactly its share.
 */
function drawNucleus(probs: Float32Array, topP: number, rng: Prng): number {
  const { inside, total, kept } = nucleusOf(probs, topP);
  const V = probs.length;
  // The token at t of the whole running sum, and the nucleus's mass before it.
  const at = (t: number) => {
    let run = 0;
    let keptBefore = 0;
    for (let v = 0; v < V; v++) {
      run += probs[v]!;
      if (run > t) return { token: v, keptBefore };
      if (inside(v)) keptBefore += probs[v]!;
    }
    return { token: V - 1, keptBefore };
  };
  const first = at(rng.next() * total).token;
  const t = rng.next() * total; // taken whether needed or not: a seed's numbers go one way whatever the draw
  if (inside(first)) return first;
  const second = at(t);
  if (inside(second.token)) return second.token;
  let u = ((t - second.keptBefore) / (total - kept)) * kept;
  let last = second.token;
  for (let v = 0; v < V; v++) {
    if (!inside(v)) continue;
    last = v;
    u -= probs[v]!;
    if (u < 0) return v;
  }
  return last;
}

/**
 * The nucleus of `probs` at `topP`, without sorting the vocabulary: probabilities are bucketed by the top
 * bits of their float32 pattern (order-preserving for positive floats, 1/16 of an octave per bucket), whole
 * buckets are taken from the top; the bucket where the mass crosses `topP` is split again on the next 13
 * bits, and that finer bucket on the last 5, whose crossing bucket holds equal probabilities only.
 */
function nucleusOf(probs: Float32Array, topP: number): { inside: (v: number) => boolean; total: number; kept: number } {
  const V = probs.length;
  const bits = new Int32Array(probs.buffer, probs.byteOffset, V);
  if (edgeScratch.length < V) {
    edgeScratch = new Int32Array(V);
    markScratch = new Uint8Array(V);
  }
  const mass = coarseScratch.fill(0);
  let total = 0;
  for (let v = 0; v < V; v++) {
    mass[bits[v]! >>> 18]! += probs[v]!;
    total += probs[v]!;
  }
  const target = topP * total;
  let kept = 0;
  let crossing = BUCKETS - 1;
  for (; crossing > 0 && kept + mass[crossing]! < target; crossing--) kept += mass[crossing]!;
  // Within the crossing bucket, a second histogram on the next 13 bits. A near-uniform distribution
  // (an untrained model) puts tens of thousands of tokens in it: typed arrays, no Sets, no sort.
  const edge = edgeScratch;
  let edgeLength = 0;
  const fine = fineScratch.fill(0);
  for (let v = 0; v < V; v++) {
    if (bits[v]! >>> 18 === crossing) {
      edge[edgeLength++] = v;
      fine[(bits[v]! >>> 5) & (BUCKETS - 1)]! += probs[v]!;
    }
  }
  let fineCrossing = BUCKETS - 1;
  for (; fineCrossing > 0 && kept + fine[fineCrossing]! < target; fineCrossing--) kept += fine[fineCrossing]!;
  // A third histogram on the last 5 bits of the fine crossing bucket: its crossing bucket holds equal
  // probabilities only, already in token order, so taking them in order until the target needs no sort.
  const inEdge = markScratch;
  const low = new Float64Array(32);
  for (let k = 0; k < edgeLength; k++) {
    const v = edge[k]!;
    const f = (bits[v]! >>> 5) & (BUCKETS - 1);
    inEdge[v] = f > fineCrossing ? 1 : 0;
    if (f === fineCrossing) low[bits[v]! & 31]! += probs[v]!;
  }
  let lowCrossing = 31;
  for (; lowCrossing > 0 && kept + low[lowCrossing]! < target; lowCrossing--) kept += low[lowCrossing]!;
  for (let k = 0; k < edgeLength; k++) {
    const v = edge[k]!;
    if (((bits[v]! >>> 5) & (BUCKETS - 1)) !== fineCrossing) continue;
    const l = bits[v]! & 31;
    if (l > lowCrossing) inEdge[v] = 1;
    else if (l === lowCrossing && kept < target) {
      inEdge[v] = 1;
      kept += probs[v]!;
    }
  }
  const inside = (v: number) => {
    const b = bits[v]! >>> 18;
    return b > crossing || (b === crossing && inEdge[v] === 1);
  };
  return { inside, total, kept };
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
      for (let i = heap.length - 1; i > 0; ) {
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
