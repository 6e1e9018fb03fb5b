import { describe, expect, it } from 'vitest';
import { adamwStep, freshOptimizerState, type AdamParams } from '../optimizer.js';

/** AdamW as one loop over every element, tensor after tensor: what adamwStep computes, written plainly. */
function referenceStep(
  params: Map<string, Float32Array>,
  grads: Map<string, Float32Array>,
  m: Map<string, Float32Array>,
  v: Map<string, Float32Array>,
  t: number,
  hp: AdamParams,
) {
  let sq = 0;
  for (const g of grads.values()) for (let i = 0; i < g.length; i++) sq += g[i]! * g[i]!;
  const gradNorm = Math.sqrt(sq);
  const clip = hp.grad_clip_norm > 0 && gradNorm > hp.grad_clip_norm ? hp.grad_clip_norm / gradNorm : 1;
  const [c1, c2] = [1 - hp.beta1 ** t, 1 - hp.beta2 ** t];
  let [updateSq, paramSq] = [0, 0];
  for (const [name, p] of params) {
    const g = grads.get(name) ?? new Float32Array(p.length);
    if (!m.has(name)) m.set(name, new Float32Array(p.length));
    if (!v.has(name)) v.set(name, new Float32Array(p.length));
    const [mm, vv] = [m.get(name)!, v.get(name)!];
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! * clip;
      mm[i] = hp.beta1 * mm[i]! + (1 - hp.beta1) * gi;
      vv[i] = hp.beta2 * vv[i]! + (1 - hp.beta2) * gi * gi;
      const update = hp.learning_rate * (mm[i]! / c1 / (Math.sqrt(vv[i]! / c2) + hp.eps) + hp.weight_decay * p[i]!);
      p[i] = p[i]! - update;
      updateSq += update * update;
      paramSq += p[i]! * p[i]!;
    }
  }
  return { grad_norm: gradNorm, update_norm: Math.sqrt(updateSq), param_norm: Math.sqrt(paramSq) };
}

describe('adamwStep', () => {
  it('gives the same bits as one plain loop, metrics included, over tensors of many sizes and several steps', () => {
    const sizes = [3, 512, 1024, 2048, 17, 60_000];
    const make = () => new Map(sizes.map((n, k) => [`t${k}`, Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37 + k) * 0.1)]));
    const [params, reference] = [make(), make()];
    const state = freshOptimizerState();
    const [m, v] = [new Map<string, Float32Array>(), new Map<string, Float32Array>()];
    const hp: AdamParams = { learning_rate: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.01, grad_clip_norm: 0.5 };
    for (let step = 1; step <= 4; step++) {
      // One tensor without a gradient: a zero one, as a step with nothing accumulated for it.
      const grads = new Map(
        [...params].filter(([name]) => name !== 't4').map(([name, p]) => [name, Float32Array.from(p, (x, i) => Math.cos(x * 7 + i + step) * 0.3)]),
      );
      const metrics = adamwStep(params, grads, state, hp);
      const expected = referenceStep(reference, grads, m, v, step, hp);
      expect(metrics).toMatchObject({ step, ...expected });
      for (const [name, p] of params) expect(Buffer.from(p.buffer).equals(Buffer.from(reference.get(name)!.buffer)), `${name} at step ${step}`).toBe(true);
      for (const [name, mm] of state.m) expect(Buffer.from(mm.buffer).equals(Buffer.from(m.get(name)!.buffer)), `m of ${name}`).toBe(true);
    }
  });
});
