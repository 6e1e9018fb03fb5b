import { MIXED_SLOTS, type GraphKind, type ModelDims } from './transformer.js';

/** The messages between a ModelEngine and the GraphRunner on its worker thread (no onnxruntime here). */
/** A tensor as plain data, so that it can cross to a worker thread. */
export interface Feed {
  type: 'float32' | 'int64';
  data: Float32Array | BigInt64Array;
  dims: number[];
}

export interface RunnerConfig {
  modelName: string;
  dims: ModelDims;
  device: 'cpu' | 'cuda';
  threads?: number;
  packAfterBatchedRows?: number;
  /** Where onnxruntime's optimized graphs are kept between processes (models/optimized-models.ts); null or absent: optimized each time. */
  cacheDir?: string | null;
}

export interface RunRequest {
  kind: GraphKind;
  merged: boolean;
  /**
   * A run with vocabulary-sized or attention-sized tensors far above the usual: it runs on a session of its
   * own, released once such runs stop (GraphRunner.heavy), so the memory it took goes back to the system.
   */
  heavy?: boolean;
  feeds: Record<string, Feed>;
  outputs: string[];
  /**
   * The LoRA adapter, or several for a mixed-adapter graph (rows of different adapters in one run: their
   * tensors side by side along the rank, in this order, and each row's scales in `lora_rows` feeds).
   */
  adapters: AdapterRef[];
  /** With several adapters: each row's, as an index into `adapters` (the runner lays them side by side and makes the row scales). */
  rowAdapters?: number[];
}

/** Hears a prebuild's sessions: each kind's build as it starts, and as it ends with its milliseconds. */
export type PrebuildListener = (kind: GraphKind, phase: 'start' | 'done', ms?: number) => void;

/** An adapter version's tensors; `feeds` may be left out when the runner already holds that (id, version). */
export interface AdapterRef {
  id: string;
  version: number;
  feeds?: Record<string, Feed>;
}

/** The runner no longer holds the adapter version a request left out; the sender resends it with its tensors. */
export class AdapterNotCachedError extends Error {
  constructor() {
    super('adapter not cached');
    this.name = 'AdapterNotCachedError';
  }
}

/**
 * Adapters kept per runner: each holds rank × vocabulary floats for the unembedding alone (2.4 MB at Qwen's
 * vocabulary and the capped rank 4). As many as one mixed-adapter run may hold (its unembedding slots), so
 * concurrent runs batched together are not resent every run.
 */
export const ADAPTER_CACHE_SIZE = MIXED_SLOTS;
