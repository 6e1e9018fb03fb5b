import { Prng } from './prng.js';
import type { LoraSite } from './transformer.js';

export interface LoraTensors {
  /** [inDim, rank], row-major. */
  A: Float32Array;
  /** [rank, outDim], row-major. */
  B: Float32Array;
}

/** The rank of one site's tensors: the adapter's, or less where the site caps it (LoraSite.maxRank). */
export function siteRank(t: LoraTensors, site: LoraSite): number {
  return t.A.length / site.inDim;
}

/** The rank a fresh adapter of rank `rank` has at a site. */
export function cappedRank(site: LoraSite, rank: number): number {
  return Math.min(rank, site.maxRank ?? rank);
}

/** A LoRA adapter: for each site, x·W becomes x·W + (alpha/rank)·(x·A)·B. */
export interface LoraAdapter {
  /** Identity and version of the tensors' contents: the engine's worker keeps a copy per (id, version). */
  id: string;
  /** Bumped by every in-place change (an optimizer step); code that edits tensors by hand must call touchAdapter. */
  version: number;
  /** The run's rank; a site may cap its own below it (siteRank). */
  rank: number;
  alpha: number;
  /** alpha / rank, at every site (a capped site keeps the run's scale, as PEFT's alpha_pattern says). */
  scale: number;
  tensors: Map<string, LoraTensors>;
}

export const DEFAULT_LORA_ALPHA = 32;

/** Builds an adapter record around tensors (loaded from files, say). */
export function adapterOf(rank: number, alpha: number, tensors: Map<string, LoraTensors>): LoraAdapter {
  return { id: newAdapterId(), version: 0, rank, alpha, scale: alpha / rank, tensors };
}

let adapters = 0;
const newAdapterId = () => `adapter-${process.pid}-${++adapters}`;

/** An adapter version's identity: what an engine's worker caches it under, and what a mixed-adapter run gives one slot. */
export function versionKey(a: { id: string; version: number }): string {
  return `${a.id}:${a.version}`;
}

/** Marks an adapter's tensors as changed in place. */
export function touchAdapter(a: LoraAdapter): void {
  a.version++;
}

/**
 * A fresh adapter: A drawn from the seed (uniform, bound 1/√in, as PEFT's
 * default), B zero, so it reproduces the base model exactly.
 */
export function freshAdapter(sites: LoraSite[], rank: number, alpha: number, seed: number | string): LoraAdapter {
  const rng = new Prng(`loops-mock lora ${seed}`);
  const tensors = new Map<string, LoraTensors>();
  for (const site of sites) {
    const r = cappedRank(site, rank);
    const A = rng.fillUniform(new Float32Array(site.inDim * r), 1 / Math.sqrt(3 * site.inDim));
    tensors.set(site.key, { A, B: new Float32Array(r * site.outDim) });
  }
  return { id: newAdapterId(), version: 0, rank, alpha, scale: alpha / rank, tensors };
}

/** The base model itself: a rank-1 adapter of zeros. */
export function zeroAdapter(sites: LoraSite[]): LoraAdapter {
  const tensors = new Map<string, LoraTensors>();
  for (const site of sites) tensors.set(site.key, { A: new Float32Array(site.inDim), B: new Float32Array(site.outDim) });
  return { id: newAdapterId(), version: 0, rank: 1, alpha: 1, scale: 1, tensors };
}

export function cloneAdapter(a: LoraAdapter): LoraAdapter {
  const tensors = new Map<string, LoraTensors>();
  for (const [k, t] of a.tensors) tensors.set(k, { A: t.A.slice(), B: t.B.slice() });
  return { ...a, id: newAdapterId(), version: 0, tensors };
}

/** Every trainable tensor, keyed `<site>.A` and `<site>.B`, in site order. */
export function parameters(a: LoraAdapter): Map<string, Float32Array> {
  const out = new Map<string, Float32Array>();
  for (const [k, t] of a.tensors) {
    out.set(`${k}.A`, t.A);
    out.set(`${k}.B`, t.B);
  }
  return out;
}
