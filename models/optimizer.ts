/** AdamW with decoupled weight decay and global-norm gradient clipping. */
export interface AdamParams {
  learning_rate: number;
  beta1: number;
  beta2: number;
  eps: number;
  weight_decay: number;
  /** 0 = no clipping. */
  grad_clip_norm: number;
}

/** Tinker's defaults, which Loops follows. */
export const ADAM_DEFAULTS: AdamParams = { learning_rate: 1e-4, beta1: 0.9, beta2: 0.95, eps: 1e-12, weight_decay: 0, grad_clip_norm: 0 };

export interface OptimizerState {
  step: number;
  /** First and second moments per parameter name. */
  m: Map<string, Float32Array>;
  v: Map<string, Float32Array>;
}

export function freshOptimizerState(): OptimizerState {
  return { step: 0, m: new Map(), v: new Map() };
}

/** Applies one step in place; returns the metrics of that step. */
export function adamwStep(params: Map<string, Float32Array>, grads: Map<string, Float32Array>, state: OptimizerState, hp: AdamParams): Record<string, number> {
  let sq = 0;
  for (const g of grads.values()) for (let i = 0; i < g.length; i++) sq += g[i]! * g[i]!;
  const gradNorm = Math.sqrt(sq);
  const clipScale = hp.grad_clip_norm > 0 && gradNorm > hp.grad_clip_norm ? hp.grad_clip_norm / gradNorm : 1;
  const t = state.step + 1;
  const c1 = 1 - hp.beta1 ** t;
  const c2 = 1 - hp.beta2 ** t;
  let updateSq = 0;
  let paramSq = 0;
  // Hyperparameters read once: this loop runs over every LoRA parameter (millions with the unembedding).
  const { beta1: b1, beta2: b2, eps, learning_rate: lr, weight_decay: wd } = hp;
  const rest1 = 1 - b1;
  const rest2 = 1 - b2;
  for (const [name, p] of params) {
    const g = grads.get(name) ?? new Float32Array(p.length);
    let m = state.m.get(name);
    let v = state.v.get(name);
    if (!m || !v) {
      m = new Float32Array(p.length);
      v = new Float32Array(p.length);
      state.m.set(name, m);
      state.v.set(name, v);
    }
    for (let i = 0; i < p.length; i++) {
      const gi = g[i]! * clipScale;
      // Rounded to float32 as stored, so the next line reads what the arrays hold.
      const mi = Math.fround(b1 * m[i]! + rest1 * gi);
      const vi = Math.fround(b2 * v[i]! + rest2 * gi * gi);
      m[i] = mi;
      v[i] = vi;
      const update = lr * (mi / c1 / (Math.sqrt(vi / c2) + eps) + wd * p[i]!);
      const pi = Math.fround(p[i]! - update);
      p[i] = pi;
      updateSq += update * update;
      paramSq += pi * pi;
    }
  }
  state.step = t;
  return {
    step: t,
    learning_rate: hp.learning_rate,
    lr: hp.learning_rate,
    grad_norm: gradNorm,
    update_norm: Math.sqrt(updateSq),
    param_norm: Math.sqrt(paramSq),
  };
}
