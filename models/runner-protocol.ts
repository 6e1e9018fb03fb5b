import type { GraphKind, ModelDims } from './transformer.js';

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
  /** The LoRA adapter's tensors; `feeds` may be left out when this runner already holds that (id, version). */
  adapter: { id: string; version: number; feeds?: Record<string, Feed> };
}

/** The runner no longer holds the adapter version a request left out; the sender resends it with its tensors. */
export class AdapterNotCachedError extends Error {
  constructor() {
    super('adapter not cached');
    this.name = 'AdapterNotCachedError';
  }
}

/** Adapters kept per runner: each holds rank × vocabulary floats for the unembedding alone. */
export const ADAPTER_CACHE_SIZE = 8;
