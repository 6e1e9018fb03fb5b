import { transpose } from './matrix.js';
import type { CheckpointFile } from './peft.js';
import { encodeSafetensors, type NamedTensor } from './safetensors.js';
import { baseWeights, NORM_EPS, ROPE_BASE, type ModelDims } from './transformer.js';

/**
 * The engine's base model as a Hugging Face `LlamaForCausalLM`: the same
 * seeded weights under Hugging Face's names and layouts, and the config that
 * makes transformers compute what the engine computes (RMSNorm inside the
 * square root with eps 1e-6, rotary positions in the rotate-half layout with
 * base 10000, SwiGLU, no biases, one key/value head per query head). The
 * engine keeps x·W layouts ([in, out]); Hugging Face's Linear weights are
 * [out, in]. The embedding and the unembedding are one tensor in the engine
 * (`embed_t`, the unembedding read directly); the files keep them apart
 * (`tie_word_embeddings: false`) so that merging a LoRA on lm_head into its
 * weight (PEFT's merge_and_unload) cannot change the input embedding.
 */
export interface HfModelInfo {
  modelName: string;
  dims: ModelDims;
  /** Longest sequence the model takes (the registry's context length). */
  maxPositions: number;
  /** Tokens that end a sequence, as the engine's sampler stops on them. */
  eosTokenIds: number[];
  padTokenId?: number;
  version: string;
}

/** Hugging Face's name and the engine's for every base tensor, with whether the matrix is transposed. */
export function hfTensorNames(dims: ModelDims): { hf: string; engine: string; transpose: boolean }[] {
  const names = [{ hf: 'model.embed_tokens.weight', engine: 'embed_t', transpose: true }];
  for (let l = 0; l < dims.layers; l++) {
    const p = `model.layers.${l}`;
    names.push({ hf: `${p}.input_layernorm.weight`, engine: `layers.${l}.attn_norm`, transpose: false });
    for (const m of ['q_proj', 'k_proj', 'v_proj', 'o_proj']) names.push({ hf: `${p}.self_attn.${m}.weight`, engine: `layers.${l}.${m}`, transpose: true });
    names.push({ hf: `${p}.post_attention_layernorm.weight`, engine: `layers.${l}.mlp_norm`, transpose: false });
    for (const m of ['gate_proj', 'up_proj', 'down_proj']) names.push({ hf: `${p}.mlp.${m}.weight`, engine: `layers.${l}.${m}`, transpose: true });
  }
  names.push({ hf: 'model.norm.weight', engine: 'final_norm', transpose: false });
  // The unembedding is the embedding's table read as [d, vocab]: as Linear's [out, in] that is the embedding itself.
  names.push({ hf: 'lm_head.weight', engine: 'embed_t', transpose: true });
  return names;
}

export function hfConfig(info: HfModelInfo): Record<string, unknown> {
  const { dims } = info;
  return {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    vocab_size: dims.vocab,
    hidden_size: dims.dModel,
    intermediate_size: dims.ffn,
    num_hidden_layers: dims.layers,
    num_attention_heads: dims.heads,
    num_key_value_heads: dims.heads,
    head_dim: dims.dModel / dims.heads,
    hidden_act: 'silu',
    max_position_embeddings: info.maxPositions,
    rms_norm_eps: NORM_EPS,
    rope_theta: ROPE_BASE,
    rope_scaling: null,
    attention_bias: false,
    attention_dropout: 0,
    mlp_bias: false,
    tie_word_embeddings: false,
    initializer_range: 0.02,
    use_cache: true,
    bos_token_id: null,
    eos_token_id: info.eosTokenIds,
    ...(info.padTokenId !== undefined ? { pad_token_id: info.padTokenId } : {}),
    torch_dtype: 'float32',
    loops_mock: {
      base_model: info.modelName,
      version: info.version,
      note: "loops-mock's tiny stand-in for this model: real vocabulary, toy width, seeded weights",
    },
  };
}

/** config.json, generation_config.json and model.safetensors of a base model. */
export function hfModelFiles(info: HfModelInfo): CheckpointFile[] {
  const weights = new Map(baseWeights(info.modelName, info.dims).map((w) => [w.name, w]));
  const tensors = new Map<string, NamedTensor>();
  for (const { hf, engine, transpose: flip } of hfTensorNames(info.dims)) {
    const w = weights.get(engine)!;
    const [rows, cols] = w.shape as [number, number];
    tensors.set(hf, flip ? { shape: [cols, rows], data: transpose(w.data, rows, cols) } : { shape: w.shape, data: w.data });
  }
  const generation = { eos_token_id: info.eosTokenIds, ...(info.padTokenId !== undefined ? { pad_token_id: info.padTokenId } : {}), do_sample: false };
  const json = (value: unknown) => Buffer.from(`${JSON.stringify(value, null, 2)}\n`);
  return [
    { relative_file_name: 'config.json', data: json(hfConfig(info)) },
    { relative_file_name: 'generation_config.json', data: json(generation) },
    { relative_file_name: 'model.safetensors', data: encodeSafetensors(tensors, { format: 'pt' }) },
  ];
}
