import { Prng } from './prng.js';

/**
 * The tiny decoder-only transformer behind every base model: RMSNorm, rotary
 * positions, SwiGLU MLP, tied embedding and unembedding. Real vocabulary,
 * toy width: enough to really train and sample on a laptop.
 */
export interface ModelDims {
  vocab: number;
  dModel: number;
  layers: number;
  heads: number;
  ffn: number;
}

export const DEFAULT_DIMS: Omit<ModelDims, 'vocab'> = { dModel: 64, layers: 2, heads: 4, ffn: 128 };
export const NORM_EPS = 1e-6;
export const ROPE_BASE = 10000;

/** The linear maps that carry LoRA adapters, with their PEFT module names. */
export type LoraModule = 'q_proj' | 'k_proj' | 'v_proj' | 'o_proj' | 'gate_proj' | 'up_proj' | 'down_proj' | 'lm_head';
export const LAYER_MODULES: LoraModule[] = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'];
export const LORA_MODULES: LoraModule[] = [...LAYER_MODULES, 'lm_head'];

export interface LoraSite {
  /** Internal name, e.g. `layers.0.q_proj` or `lm_head`. */
  key: string;
  module: LoraModule;
  layer: number | null;
  inDim: number;
  outDim: number;
  /** A run's rank above this is capped here for this site (the unembedding: see DEFAULT_UNEMBEDDING_RANK). */
  maxRank?: number;
}

/**
 * LoRA rank on the unembedding when a run asks for more. Its B is rank × vocabulary floats (0.6 MB per rank at
 * Qwen's 151,669 tokens: 39 MB at Loops' default rank 64, as much as the whole base model), while the model is
 * only 64 wide, so a rank above 64 adds nothing, and the support-ticket task (invariant 3) learns its labels
 * with the unembedding at rank 1 already. At 4, 20 adapters hold 50 MB at rank 16 and 71 MB at the largest
 * rank, 128, and the task trains about as fast as at 16. The mock's choice (`--unembedding-rank`); the adapter
 * files say it as PEFT does (`rank_pattern`).
 */
export const DEFAULT_UNEMBEDDING_RANK = 4;

/** Every LoRA site of a model, in a fixed order (the order of graph inputs and of saved tensors). */
export function loraSites(dims: ModelDims, unembeddingRank = DEFAULT_UNEMBEDDING_RANK): LoraSite[] {
  const { dModel: d, ffn } = dims;
  const io: Record<LoraModule, [number, number]> = {
    q_proj: [d, d],
    k_proj: [d, d],
    v_proj: [d, d],
    o_proj: [d, d],
    gate_proj: [d, ffn],
    up_proj: [d, ffn],
    down_proj: [ffn, d],
    lm_head: [d, dims.vocab],
  };
  const sites: LoraSite[] = [];
  for (let l = 0; l < dims.layers; l++) {
    for (const m of LAYER_MODULES) sites.push({ key: `layers.${l}.${m}`, module: m, layer: l, inDim: io[m][0], outDim: io[m][1] });
  }
  sites.push({ key: 'lm_head', module: 'lm_head', layer: null, inDim: d, outDim: dims.vocab, maxRank: unembeddingRank });
  return sites;
}

/** The sites inside the layers: all but the unembedding, which a mixed-adapter run takes in slots instead. */
export function layerSites(sites: LoraSite[]): LoraSite[] {
  return sites.filter((s) => s.key !== 'lm_head');
}

export interface BaseWeight {
  name: string;
  shape: number[];
  data: Float32Array;
}

/**
 * Base weights from a PRNG keyed by the model name: the same name gives
 * bit-identical weights everywhere. Scales keep activations and initial
 * logits near unit variance (so the first loss is about ln(vocab)).
 */
export function baseWeights(modelName: string, dims: ModelDims): BaseWeight[] {
  const rng = new Prng(`loops-mock base weights ${modelName}`);
  const residual = 1 / Math.sqrt(2 * dims.layers);
  return baseWeightShapes(dims).map(({ name, shape }) => {
    const data = new Float32Array(shape.reduce((p, n) => p * n, 1));
    if (name.endsWith('norm')) return { name, shape, data: data.fill(1) };
    // Projections into the residual stream are scaled down so depth does not grow activations.
    const std = (1 / Math.sqrt(shape[0]!)) * (name.endsWith('o_proj') || name.endsWith('down_proj') ? residual : 1);
    return { name, shape, data: rng.fillUniform(data, std) };
  });
}

export type GraphKind = 'forward' | 'backward' | 'decode' | 'draw' | 'draw_top' | 'draw_nucleus' | 'draw_nucleus_wide' | 'greedy' | 'topk';

/** The decode graphs (a KV cache in and out): the whole next-token distribution out, or the next token drawn or chosen inside. */
export const DECODE_KINDS: readonly GraphKind[] = ['decode', 'draw', 'draw_top', 'draw_nucleus', 'draw_nucleus_wide', 'greedy'];

/** Adapters one mixed-adapter run may hold (GraphOptions.mixedAdapters). */
export const MIXED_SLOTS = 16;

/** Names and shapes of the base weights (graph inputs), embedding first: embed_t is [d, vocab], the unembedding read directly. */
export function baseWeightShapes(dims: ModelDims): { name: string; shape: number[] }[] {
  const { dModel: d, ffn, vocab } = dims;
  const out = [{ name: 'embed_t', shape: [d, vocab] }];
  for (let l = 0; l < dims.layers; l++) {
    out.push({ name: `layers.${l}.attn_norm`, shape: [d] });
    for (const m of ['q_proj', 'k_proj', 'v_proj', 'o_proj']) out.push({ name: `layers.${l}.${m}`, shape: [d, d] });
    out.push({ name: `layers.${l}.mlp_norm`, shape: [d] });
    out.push(
      { name: `layers.${l}.gate_proj`, shape: [d, ffn] },
      { name: `layers.${l}.up_proj`, shape: [d, ffn] },
      { name: `layers.${l}.down_proj`, shape: [ffn, d] },
    );
  }
  out.push({ name: 'final_norm', shape: [d] });
  return out;
}
