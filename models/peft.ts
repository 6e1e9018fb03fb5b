import { adapterOf, siteRank, type LoraAdapter, type LoraTensors } from './lora.js';
import type { OptimizerState } from './optimizer.js';
import { transpose } from './matrix.js';
import { decodeSafetensors, encodeSafetensors, type NamedTensor } from './safetensors.js';
import type { LoraSite } from './transformer.js';

/**
 * Adapters in PEFT's on-disk format (adapter_model.safetensors +
 * adapter_config.json), and full trainer state beside them (optimizer
 * moments and step), so that save → load → train continues bit-identically.
 */
export interface CheckpointFile {
  relative_file_name: string;
  data: Uint8Array;
}

export const STATE_FORMAT = 'loops-mock-trainer-state-v1';

/** PEFT's tensor name prefix for a site, e.g. `base_model.model.model.layers.0.self_attn.q_proj`. */
export function peftModuleName(site: LoraSite): string {
  if (site.layer === null) return 'base_model.model.lm_head';
  const block = ['q_proj', 'k_proj', 'v_proj', 'o_proj'].includes(site.module) ? 'self_attn' : 'mlp';
  return `base_model.model.model.layers.${site.layer}.${block}.${site.module}`;
}

export function adapterConfig(adapter: LoraAdapter, sites: LoraSite[], baseModel: string): Record<string, unknown> {
  // A site whose rank is capped below the run's (the unembedding) is said as PEFT says it: its own rank, and
  // an alpha that keeps the run's scale alpha/r, so that PEFT loads the same weights with the same scaling.
  const rankPattern: Record<string, number> = {};
  const alphaPattern: Record<string, number> = {};
  for (const site of sites) {
    const r = siteRank(adapter.tensors.get(site.key)!, site);
    if (r === adapter.rank) continue;
    rankPattern[site.module] = r;
    alphaPattern[site.module] = adapter.scale * r;
  }
  return {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: baseModel,
    r: adapter.rank,
    lora_alpha: adapter.alpha,
    lora_dropout: 0,
    bias: 'none',
    fan_in_fan_out: false,
    inference_mode: true,
    target_modules: [...new Set(sites.map((s) => s.module))],
    rank_pattern: rankPattern,
    alpha_pattern: alphaPattern,
  };
}

/** PEFT stores lora_A as [r, in] and lora_B as [out, r]; the engine keeps A [in, r] and B [r, out]. */
export function adapterFiles(adapter: LoraAdapter, sites: LoraSite[], baseModel: string): CheckpointFile[] {
  const tensors = new Map<string, NamedTensor>();
  for (const site of sites) {
    const t = adapter.tensors.get(site.key)!;
    const name = peftModuleName(site);
    const r = siteRank(t, site);
    tensors.set(`${name}.lora_A.weight`, { shape: [r, site.inDim], data: transpose(t.A, site.inDim, r) });
    tensors.set(`${name}.lora_B.weight`, { shape: [site.outDim, r], data: transpose(t.B, r, site.outDim) });
  }
  return [
    { relative_file_name: 'adapter_config.json', data: Buffer.from(JSON.stringify(adapterConfig(adapter, sites, baseModel), null, 2)) },
    { relative_file_name: 'adapter_model.safetensors', data: encodeSafetensors(tensors, { format: 'pt' }) },
  ];
}

/** The optimizer moments and step: what a trainer checkpoint holds beside the adapter files. */
export function optimizerFiles(adapter: LoraAdapter, optimizer: OptimizerState, baseModel: string): CheckpointFile[] {
  const moments = new Map<string, NamedTensor>();
  for (const [name, m] of optimizer.m) moments.set(`${name}.exp_avg`, { shape: [m.length], data: m });
  for (const [name, v] of optimizer.v) moments.set(`${name}.exp_avg_sq`, { shape: [v.length], data: v });
  const state = { format: STATE_FORMAT, base_model: baseModel, lora_rank: adapter.rank, lora_alpha: adapter.alpha, step: optimizer.step };
  return [
    { relative_file_name: 'optimizer.safetensors', data: encodeSafetensors(moments) },
    { relative_file_name: 'trainer_state.json', data: Buffer.from(JSON.stringify(state, null, 2)) },
  ];
}

/** A problem with a checkpoint being loaded, in words for the client. */
export class CheckpointLoadError extends Error {}

export function readAdapter(files: Map<string, Uint8Array>, sites: LoraSite[], baseModel: string): LoraAdapter {
  const configBytes = files.get('adapter_config.json');
  const modelBytes = files.get('adapter_model.safetensors');
  if (!configBytes || !modelBytes) throw new CheckpointLoadError('the checkpoint has no adapter_config.json and adapter_model.safetensors');
  const config = JSON.parse(Buffer.from(configBytes).toString('utf8')) as {
    r: number;
    lora_alpha: number;
    base_model_name_or_path?: string;
    rank_pattern?: Record<string, number>;
    alpha_pattern?: Record<string, number>;
  };
  if (config.base_model_name_or_path && config.base_model_name_or_path !== baseModel) {
    throw new CheckpointLoadError(`the checkpoint is an adapter of ${config.base_model_name_or_path}, not ${baseModel}`);
  }
  const { tensors } = decodeSafetensors(modelBytes);
  const rank = config.r;
  const out = new Map<string, LoraTensors>();
  for (const site of sites) {
    const name = peftModuleName(site);
    const A = tensors.get(`${name}.lora_A.weight`);
    const B = tensors.get(`${name}.lora_B.weight`);
    if (!A || !B) throw new CheckpointLoadError(`the checkpoint has no LoRA tensors for ${name}`);
    // A module's own rank (rank_pattern) is taken as the file says, whatever this server's cap: one scale for
    // every module is what the engine computes with, so its alpha must keep alpha/r.
    const r = config.rank_pattern?.[site.module] ?? rank;
    const alpha = config.alpha_pattern?.[site.module] ?? config.lora_alpha;
    if (Math.abs(alpha / r - config.lora_alpha / rank) > 1e-6 * (config.lora_alpha / rank)) {
      throw new CheckpointLoadError(
        `${name}: its scale alpha/r = ${alpha}/${r} differs from the adapter's ${config.lora_alpha}/${rank}; this server scales every module alike`,
      );
    }
    if (A.shape.join() !== [r, site.inDim].join() || B.shape.join() !== [site.outDim, r].join()) {
      throw new CheckpointLoadError(`${name}: shapes [${A.shape}] and [${B.shape}] do not fit rank ${r} on this model`);
    }
    out.set(site.key, { A: transpose(A.data, r, site.inDim), B: transpose(B.data, site.outDim, r) });
  }
  return adapterOf(rank, config.lora_alpha, out);
}

export function readOptimizer(files: Map<string, Uint8Array>): OptimizerState {
  const stateBytes = files.get('trainer_state.json');
  const moments = files.get('optimizer.safetensors');
  if (!stateBytes || !moments) throw new CheckpointLoadError('the checkpoint has no optimizer state: it is a sampler checkpoint, or was saved without one');
  const state = JSON.parse(Buffer.from(stateBytes).toString('utf8')) as { format: string; step: number };
  if (state.format !== STATE_FORMAT) throw new CheckpointLoadError(`unknown trainer state format '${state.format}'`);
  const { tensors } = decodeSafetensors(moments);
  const m = new Map<string, Float32Array>();
  const v = new Map<string, Float32Array>();
  for (const [name, t] of tensors) {
    if (name.endsWith('.exp_avg')) m.set(name.slice(0, -'.exp_avg'.length), t.data);
    else if (name.endsWith('.exp_avg_sq')) v.set(name.slice(0, -'.exp_avg_sq'.length), t.data);
  }
  return { step: state.step, m, v };
}
