import { afterAll, describe, expect, it } from 'vitest';
import { blocksOf } from '../blocks.js';
import { ModelEngine } from '../engine.js';
import { freshAdapter, parameters } from '../lora.js';
import { scoringUnits, type ScoredSequence } from '../feeds.js';

// Long sequences are scored in blocks that attend to the blocks before them: the numbers must be those of
// one run over the whole sequence, so the same model, with limits small enough to force blocks, is compared
// against an engine that scores everything in one run.
const dims = { dModel: 16, heads: 2, ffn: 32, layers: 2 };
const whole = new ModelEngine('blocks-check-model', 97, { dims, maxPositionsPerRun: 4096, maxScoredPerRun: 4096 });
const blocked = new ModelEngine('blocks-check-model', 97, { dims, maxPositionsPerRun: 24, maxScoredPerRun: 8, attentionFloatsPerRun: 2 * 16 * 40 });
afterAll(async () => {
  await whole.close();
  await blocked.close();
});

const adapter = freshAdapter(whole.sites, 4, 8, 'blocks-adapter');
// Non-zero B everywhere, so every LoRA tensor's gradient is exercised.
for (const p of parameters(adapter).values()) for (let i = 0; i < p.length; i++) if (p[i] === 0) p[i] = Math.sin(i * 0.71 + p.length) * 0.05;

const seq = (n: number, salt: number): ScoredSequence => {
  const tokens = Array.from({ length: n }, (_, i) => (i * 31 + salt * 7) % 97);
  return { tokens, targets: tokens.slice(1).concat(0) };
};
const seqs: ScoredSequence[] = [
  seq(61, 1),
  { ...seq(45, 2), scored: [3, 10, 11, 30, 44] },
  seq(6, 3),
  { ...seq(70, 4), scored: Array.from({ length: 20 }, (_, i) => 40 + i) },
  { ...seq(30, 5), scored: [] },
];

const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};

describe('blocked scoring of long sequences', () => {
  it('splits a sequence into blocks that stay within the attention budget as keys grow', () => {
    expect(blocksOf(10, 2, { positions: 4, attentionFloats: 1000 })).toEqual([
      [0, 4],
      [4, 8],
      [8, 10],
    ]);
    const blocks = blocksOf(4096, 4, { positions: 128, attentionFloats: 2 ** 20 });
    expect(blocks.at(-1)![1]).toBe(4096);
    for (const [s, e] of blocks) expect(4 * (e - s) * e).toBeLessThanOrEqual(2 ** 20);
    expect([...scoringUnits(seqs, { positions: 24, scored: 8 })].map((u) => [u.seqs.length, u.long])).toEqual([
      [1, true],
      [1, true],
      [1, false],
      [1, true],
      [1, true],
    ]);
  });

  it('gives the logprobs of one run over the whole sequence', async () => {
    const a = await whole.forward(seqs, adapter);
    const b = await blocked.forward(seqs, adapter);
    seqs.forEach((_, k) => {
      expect(maxDiff(a[k]!, b[k]!), `sequence ${k}`).toBeLessThan(1e-5);
    });
    expect(a[1]![10]).not.toBe(0);
    expect(b[4]!.every((x) => x === 0)).toBe(true);
  });

  it('gives the gradients of one run over the whole sequence, for every LoRA tensor', async () => {
    const cot = seqs.map((s, k) => Float32Array.from(s.tokens, (_, t) => Math.cos(t * 0.3 + k)));
    const a = await whole.backward(seqs, adapter, cot);
    const b = await blocked.backward(seqs, adapter, cot);
    for (const [name, g] of a.grads) {
      const scale = Math.max(1e-3, ...Array.from(g, Math.abs));
      expect(maxDiff(g, b.grads.get(name)!) / scale, name).toBeLessThan(1e-4);
    }
    seqs.forEach((_, k) => {
      expect(maxDiff(a.logprobs[k]!, b.logprobs[k]!)).toBeLessThan(1e-5);
    });
  });

  it('gives the top-k of one run at every position', async () => {
    const a = await whole.topk([seqs[0]!], adapter, 3);
    const b = await blocked.topk([seqs[0]!], adapter, 3);
    expect(b.top[0]!.map((t) => t.ids)).toEqual(a.top[0]!.map((t) => t.ids));
    expect(maxDiff(a.logprobs[0]!, b.logprobs[0]!)).toBeLessThan(1e-5);
  });

  it("gives the top-k at the scored positions only, blocked or not (a training pass's top_k_logprobs)", async () => {
    const s = seqs[3]!;
    const a = await whole.topk([s], adapter, 4);
    const b = await blocked.topk([s], adapter, 4);
    const all = await whole.topk([{ tokens: s.tokens, targets: s.targets }], adapter, 4);
    for (const { top, logprobs } of [a, b]) {
      expect(top[0]).toHaveLength(s.tokens.length);
      top[0]!.forEach((row, t) => {
        if (!s.scored!.includes(t)) {
          expect(row.ids).toEqual([]);
          return;
        }
        expect(row.ids).toEqual(all.top[0]![t]!.ids);
        expect(maxDiff(row.logprobs, all.top[0]![t]!.logprobs)).toBeLessThan(1e-5);
        expect(Math.abs(logprobs[0]![t]! - all.logprobs[0]![t]!)).toBeLessThan(1e-5);
      });
    }
  });

  it('prefills a long prompt in blocks: the same next-token distribution and cache', async () => {
    const prompt = seq(61, 9).tokens;
    const a = await whole.startSequence(prompt, adapter, 1, null);
    const b = await blocked.startSequence(prompt, adapter, 1, null);
    expect(maxDiff(a.logprobs!, b.logprobs!)).toBeLessThan(1e-5);
    expect(b.cache.length).toBe(61);
    a.cache.past.forEach((p, i) => {
      expect(maxDiff(p, b.cache.past[i]!)).toBeLessThan(1e-5);
    });
    const greedyA = await whole.startSequence(prompt, adapter, 1, [-1]);
    const greedyB = await blocked.startSequence(prompt, adapter, 1, [-1]);
    expect(greedyB.drawn).toEqual(greedyA.drawn!.map((d) => ({ token: d.token, logprob: expect.closeTo(d.logprob, 5) })));
  });
});
