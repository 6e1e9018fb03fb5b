/**
 * The draws built into the decode graphs: the next tokens drawn from the distribution by inverse CDF
 * (drawTokens), among the k most likely cut to a top_p (drawTopTokens), from a top_p nucleus
 * (drawNucleusTokens), or the most likely (mostLikely). Only the tokens and their logprobs leave a graph.
 */
import type { GraphBuilder, Sym } from './graph/builder.js';

/**
 * Draws N tokens per row of `logits` ([B, vocab], temperature applied) by
 * inverse CDF at `u` ([B, N], each in [0, 1)). Nothing vocabulary-sized
 * leaves the graph: only the tokens and their logprobs. The running sum is
 * taken in two levels, as one over the whole vocabulary is slow in
 * onnxruntime: over block masses to find the block where u·total falls,
 * then within that block.
 */
export function drawTokens(g: GraphBuilder, logits: Sym, u: Sym, vocab: number): { token: Sym; logprob: Sym } {
  const probs = g.softmax(logits);
  const { token } = inverseCdf(g, probs, u, vocab);
  return { token, logprob: g.log(g.gatherElements(probs, token, 1)) };
}

/** The token ([B, N]) at each u·mass of `probs` ([B, vocab], unnormalised), the running sum taken in two levels; and that mass ([B, 1]). */
function inverseCdf(g: GraphBuilder, probs: Sym, u: Sym, vocab: number): { token: Sym; total: Sym } {
  return drawInBlocks(g, inBlocks(g, probs, vocab), u);
}

/** inverseCdf over probabilities already cut into blocks (inBlocks). */
function drawInBlocks(g: GraphBuilder, { blocks, blockMass, size: S, count: G }: Blocked, u: Sym): { token: Sym; total: Sym } {
  const blockCum = g.cumsum(blockMass, 1);
  const total = g.gather(blockCum, g.constI([G - 1]), 1);
  const target = g.mul(u, total);
  // The first index whose running sum passes t ([B, N, 1]): the count of those at or below it. Indices at the
  // running sum's final value are never counted, so rounding at u ≈ 1 cannot pick a zero-probability block or token.
  const firstPast = (cum: Sym, t: Sym, n: number) => {
    const last = g.gather(cum, g.constI([n - 1]), -1);
    return g.reduceSum(g.cast(g.and(g.lessOrEqual(cum, t), g.less(cum, last)), 'int64'), [-1], false);
  };
  const block = firstPast(g.unsqueeze(blockCum, [1]), g.unsqueeze(target, [2]), G);
  const before = g.sub(g.gatherElements(blockCum, block, 1), g.gatherElements(blockMass, block, 1));
  const inBlock = g.cumsum(g.gatherRows(blocks, g.unsqueeze(block, [2])), 2);
  const offset = firstPast(inBlock, g.unsqueeze(g.sub(target, before), [2]), S);
  return { token: g.add(g.mul(block, g.constI([S])), offset), total };
}

interface Blocked {
  blocks: Sym;
  blockMass: Sym;
  size: number;
  count: number;
}

/** The blocks of some of the rows (`take`: a gather along axis 0). */
function rowsOf(blocked: Blocked, take: (x: Sym) => Sym): Blocked {
  return { ...blocked, blocks: take(blocked.blocks), blockMass: take(blocked.blockMass) };
}

/** `x` ([B, vocab]) cut into the draw's blocks ([B, G, S], the last padded where need be), and each block's sum. */
function inBlocks(g: GraphBuilder, x: Sym, vocab: number): Blocked {
  const { size, count } = drawBlocks(vocab);
  const rows = x.shape[0]!;
  const flat = count * size > vocab ? g.padEnd(x, [0, count * size - vocab], [rows, count * size]) : x;
  const blocks = g.reshape(flat, [0, count, size], [rows, count, size]);
  return { blocks, blockMass: g.reduceSum(blocks, [2], false), size, count };
}

/** Σ x[j] over the ids j before each of `at` ([B, N]), `x` cut into the draw's blocks (inBlocks): the blocks before, then within its block. */
function sumBefore(g: GraphBuilder, { blocks, blockMass, size: S }: Blocked, at: Sym): Sym {
  const block = g.div(at, g.constI([S]));
  const offset = g.sub(at, g.mul(block, g.constI([S])));
  const within = g.gatherElements(g.cumsumBefore(g.gatherRows(blocks, g.unsqueeze(block, [2])), 2), g.unsqueeze(offset, [2]), 2);
  return g.add(g.gatherElements(g.cumsumBefore(blockMass, 1), block, 1), g.reshape(within, [0, -1], at.shape));
}

/**
 * Buckets of the nucleus's cut: 1/128 of an octave each, down to 2^-128 (float32's smallest normal), so the
 * one bucket sorted holds a few hundred tokens even for an untrained model's near-uniform distribution.
 */
const NUCLEUS_BUCKETS = 16384;

/**
 * Draws N tokens per row from its nucleus: the fewest most likely tokens (the lower id first on ties) whose
 * mass reaches `topP` ([B, 1]) of the whole; the logprob is under the whole distribution.
 *
 * By rejection, with the rule of the sampler's own draw (drawNucleus in sampling.ts): the token at u of the
 * whole distribution (inverse CDF, as without a cut) if it is in the nucleus; else the token at `retry` if
 * that one is; else the nucleus is drawn from, in id order, at the retry's place in the running sum among the
 * tokens outside it, as a fraction of their mass (uniform again, given where it fell). Each token of the
 * nucleus is then drawn with exactly its share of the nucleus's mass.
 *
 * Most draws are settled by one pass over the vocabulary more than the plain draw: a token is in the nucleus,
 * whatever the order of ties, when those at least as likely, itself aside, hold less than top_p of the mass.
 * Only the rows of the others (about 1 − top_p of them; an If on whether any row has one) try the retry the
 * same way, and only rows still unsettled (about (1 − top_p)², or a tie at the edge) find their nucleus.
 * `wide` (a prompt's many draws): each row's nucleus is found instead. Exported for its test against the
 * rule in JavaScript.
 */
export function drawNucleusTokens(g: GraphBuilder, logits: Sym, u: Sym, retry: Sym, topP: Sym, vocab: number, wide = false): { token: Sym; logprob: Sym } {
  const probs = g.softmax(logits);
  const blocked = inBlocks(g, probs, vocab);
  const { token: first, total } = drawInBlocks(g, blocked, u);
  const target = g.mul(topP, total);
  const token = wide
    ? byTheNucleus(g, probs, blocked, first, drawInBlocks(g, blocked, retry).token, retry, total, nucleusOf(g, probs, target), vocab)
    : settledByTests(g, probs, blocked, first, retry, target, total, vocab);
  return { token, logprob: g.log(g.gatherElements(probs, token, 1)) };
}

/**
 * Draws per row up to which each is tested on its own (draw_nucleus); past it, the tests' tensors ([rows,
 * draws, vocab]) cost more than finding each row's nucleus once (draw_nucleus_wide).
 */
export const NUCLEUS_TESTS_UP_TO = 4;

/**
 * The draws settled by passes over the vocabulary, one per draw: most are, at the first token; the rows of the
 * others try the retry (an If over those rows alone), and only rows still open find their nucleus.
 */
function settledByTests(g: GraphBuilder, probs: Sym, blocked: Blocked, first: Sym, retry: Sym, target: Sym, total: Sym, vocab: number): Sym {
  const firstP = g.gatherElements(probs, first, 1);
  const firstIn = g.less(g.sub(massAtLeast(g, probs, firstP), firstP), target);
  const [token] = settleRowsWhere(g, firstIn, first, 'F', (b, rows) => {
    const take = (x: Sym) => b.gather(x, rows, 0);
    const [P, R, F, In, T, firstPs] = [probs, retry, first, firstIn, target, firstP].map(take) as [Sym, Sym, Sym, Sym, Sym, Sym];
    const second = drawInBlocks(b, rowsOf(blocked, take), R).token;
    const secondP = b.gatherElements(P, second, 1);
    // One pass for both: the mass at least as likely as the retry, and the mass at least as likely as a float
    // above the first token's probability (never more than that strictly above it: where it reaches the target,
    // the first token is surely outside the nucleus).
    const above = b.max(b.mul(firstPs, b.scalar(1 + 2 ** -23)), b.add(firstPs, b.scalar(2 ** -149)));
    const thresholds = b.reshape(b.concat([b.unsqueeze(above, [1]), b.unsqueeze(secondP, [1])], 1, ['F', 2, 'N']), [0, -1], ['F', 'M']);
    const both = b.reshape(massAtLeast(b, P, thresholds), [0, 2, -1], ['F', 2, 'N']);
    const [overFirst, atLeastSecond] = [0, 1].map((i) => b.gather(both, b.constI([i], []), 1)) as [Sym, Sym];
    const secondIn = b.and(b.greaterOrEqual(overFirst, T), b.less(b.sub(atLeastSecond, secondP), T));
    const settled = b.or(In, secondIn);
    const surely = b.where(In, F, second);
    // Still open: a first token that may be inside (a tie at the edge), or a retry that may be outside.
    const [tokens] = settleRowsWhere(b, settled, surely, 'L', (c, left) => {
      const at = c.gather(rows, left, 0);
      const takeOuter = (x: Sym) => c.gather(x, at, 0);
      const [P2, total2, target2] = [probs, total, target].map(takeOuter) as [Sym, Sym, Sym];
      const [R2, F2, S2, done, sure] = [R, F, second, settled, surely].map((x) => c.gather(x, left, 0)) as [Sym, Sym, Sym, Sym, Sym];
      const exact = byTheNucleus(c, P2, rowsOf(blocked, takeOuter), F2, S2, R2, total2, nucleusOf(c, P2, target2), vocab);
      return [c.scatterRows(surely, left, c.where(done, sure, exact))];
    });
    return [b.scatterRows(first, rows, tokens!)];
  });
  return token!;
}

/**
 * The draw's rule with each row's nucleus in hand (`kept`: its probabilities inside, 0 outside): the first
 * token if inside, else the retry's if inside, else the nucleus drawn from, in id order, at the retry's place
 * among the outside tokens' running sum (those before its token, then where in its token's slice the retry
 * fell), as a fraction of their mass. Computed from the outside tokens' own mass, so rounding cannot give a
 * place below 0 or past the end, nor a token outside.
 */
function byTheNucleus(g: GraphBuilder, probs: Sym, blocked: Blocked, first: Sym, second: Sym, retry: Sym, total: Sym, kept: Sym, vocab: number): Sym {
  const inside = (t: Sym) => g.greater(g.gatherElements(kept, t, 1), g.scalar(0));
  const outside = inBlocks(g, g.sub(probs, kept), vocab);
  const into = g.min(g.max(g.sub(g.mul(retry, total), sumBefore(g, blocked, second)), g.scalar(0)), g.gatherElements(probs, second, 1));
  const place = g.div(g.add(sumBefore(g, outside, second), into), g.reduceSum(outside.blockMass, [1], true));
  const again = inverseCdf(g, kept, g.min(place, g.scalar(1)), vocab).token;
  return g.where(inside(first), first, g.where(inside(second), second, again));
}

/** Σ p over the tokens at least as likely as each threshold ([B, M]): [B, M]. */
function massAtLeast(g: GraphBuilder, probs: Sym, thresholds: Sym): Sym {
  const all = g.unsqueeze(probs, [1]);
  return g.reduceSum(g.mul(g.cast(g.greaterOrEqual(all, g.unsqueeze(thresholds, [2])), 'float32'), all), [2], false);
}

/**
 * `tokens` ([B, N]) where every draw of a row is `settled`; the other rows go through `settle` (given their
 * indices along axis 0, a dimension named `rowsDim`; it returns those rows' tokens in a one-element list),
 * in an If so that a run whose draws are all settled does none of it.
 */
function settleRowsWhere(g: GraphBuilder, settled: Sym, tokens: Sym, rowsDim: string, settle: (b: GraphBuilder, rows: Sym) => Sym[]): Sym[] {
  const rowSettled = g.reduceMin(g.cast(settled, 'float32'), [1]);
  return g.ifElse(
    g.less(g.reduceMin(rowSettled, [0]), g.scalar(1)),
    (b) => settle(b, b.indicesOf(b.less(rowSettled, b.scalar(1)), rowsDim)),
    () => [tokens],
  );
}

/**
 * Each row's nucleus ([B, vocab]: its probabilities inside, 0 outside): the fewest most likely tokens whose
 * mass reaches `target` ([B, 1], top_p of the row's total, the same the draw's tests use). No sort of the
 * vocabulary: the probabilities are bucketed by their logarithm (order-preserving), whole buckets are taken
 * from the top while their mass stays short, and only the bucket where it crosses the target is sorted
 * (TopK, ties in id order) to find how many of its tokens are in. An untrained model's nucleus at 0.95 holds
 * most of the vocabulary, so a top-k first cannot do.
 */
function nucleusOf(g: GraphBuilder, probs: Sym, target: Sym): Sym {
  const NB = NUCLEUS_BUCKETS;
  const bucket = g.cast(g.max(g.floor(g.add(g.mul(g.log(probs), g.scalar(NB / 128 / Math.LN2)), g.scalar(NB - 1))), g.scalar(0)), 'int64');
  const zeros = g.mul(g.gather(probs, g.constI([0]), 1), g.constF(new Float32Array(NB), [1, NB]));
  const mass = g.scatterElements(zeros, bucket, probs, 1, 'add');
  // The crossing bucket: the highest whose mass with all above it reaches the target.
  const fromTop = g.cumsum(mass, 1, true);
  const reaching = g.reduceSum(g.cast(g.lessOrEqual(target, fromTop), 'int64'), [1], true);
  const crossing = g.max(g.sub(reaching, g.constI([1], [])), g.constI([0], []));
  const above = g.sub(g.gatherElements(fromTop, crossing, 1), g.gatherElements(mass, crossing, 1));
  const inEdge = g.equal(bucket, crossing);
  // The crossing bucket's tokens, most likely first (others below any probability), as many as the fullest row holds.
  const count = g.reduceSum(g.cast(inEdge, 'float32'), [1], true);
  const k = g.reshape(g.cast(g.reduceMax(count, [0, 1]), 'int64'), [1], [1]);
  const [values, ids] = g.topk(g.where(inEdge, probs, g.scalar(-1)), k);
  const real = g.lessOrEqual(g.scalar(0), values);
  const edgeProbs = g.where(real, values, g.scalar(0));
  const before = g.sub(g.add(above, g.cumsum(edgeProbs, 1)), edgeProbs);
  const taken = g.cast(g.and(real, g.less(before, target)), 'float32');
  const edgeKept = g.scatterElements(g.mul(probs, g.scalar(0)), ids, taken, 1);
  return g.where(g.greater(bucket, crossing), probs, g.mul(probs, edgeKept));
}

/**
 * Draws N tokens per row among its k most likely (TopK: by logit, the lower id first on ties, as the
 * sampler's own cut), and of those the fewest, most likely first, whose mass reaches `topP` ([B, 1]; 1 =
 * all k) of theirs: the candidates are sorted, so the cut is one running sum over k, not the vocabulary.
 * The logprob is under the whole distribution at the temperature, as chooseToken gives it.
 */
export function drawTopTokens(g: GraphBuilder, logits: Sym, u: Sym, k: Sym, topP: Sym): { token: Sym; logprob: Sym } {
  const [values, ids] = g.topk(g.logSoftmax(logits), k);
  const probs = g.exp(values);
  const cum = g.cumsum(probs, 1);
  const total = g.reduceSum(probs, [1], true);
  // A candidate is kept while the mass before it is short of top_p of the total: the first to reach it is the last kept.
  const kept = g.where(g.less(g.sub(cum, probs), g.mul(topP, total)), probs, g.constF([0], []));
  const keptCum = g.cumsum(kept, 1);
  const last = g.reduceSum(kept, [1], true);
  const target = g.unsqueeze(g.mul(u, last), [2]);
  // The first candidate whose running sum passes u·mass: the count of those at or below it, never one whose
  // running sum is already the final value (a cut candidate, or rounding at u ≈ 1).
  const at = g.unsqueeze(keptCum, [1]);
  const index = g.reduceSum(g.cast(g.and(g.lessOrEqual(at, target), g.less(at, g.unsqueeze(last, [2]))), 'int64'), [-1], false);
  return { token: g.gatherElements(ids, index, 1), logprob: g.gatherElements(values, index, 1) };
}

/** The most likely token of each row ([B, 1]; the first on ties) and its logprob. */
export function mostLikely(g: GraphBuilder, logits: Sym): { token: Sym; logprob: Sym } {
  const token = g.argmax(logits, 1);
  return { token, logprob: g.log(g.gatherElements(g.softmax(logits), token, 1)) };
}

/** Blocks of the two-level draw: a divisor of the vocabulary near its square root, or padding where there is none. */
export function drawBlocks(vocab: number): { size: number; count: number } {
  const root = Math.round(Math.sqrt(vocab));
  for (let k = 0; k < root / 2; k++) {
    for (const size of [root - k, root + k]) if (size > 1 && vocab % size === 0) return { size, count: vocab / size };
  }
  return { size: root, count: Math.ceil(vocab / root) };
}
