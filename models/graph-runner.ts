import { availableParallelism } from 'node:os';
import * as ort from 'onnxruntime-node';
import { baseWeights, buildGraph, type GraphKind, type ModelDims } from './transformer.js';

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
}

export interface RunRequest {
  kind: GraphKind;
  merged: boolean;
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

/** `--device cuda` on a machine whose onnxruntime-node has no CUDA execution provider. */
export class DeviceUnavailableError extends Error {
  constructor(cause: unknown) {
    super(
      'The CUDA execution provider is not available to onnxruntime-node here: its CUDA binaries are not installed ' +
      '(this project\'s .npmrc skips their download, and they need CUDA 12 and cuDNN on the machine). On a machine that has them, run ' +
      '`ONNXRUNTIME_NODE_INSTALL=cuda12 node node_modules/onnxruntime-node/script/install.js`, or use --device cpu. ' +
      `(onnxruntime said: ${String((cause as Error)?.message ?? cause).split('\n')[0]})`,
    );
    this.name = 'DeviceUnavailableError';
  }
}

// onnxruntime's own log goes to stderr; every failure it reports also reaches us as an exception, which we
// turn into a clear message, so its log would only repeat it (e.g. three lines for a missing CUDA provider).
ort.env.logLevel = 'fatal';

/**
 * Owns one base model's weights and its onnxruntime sessions, and runs
 * graphs on plain-data feeds. It lives in a worker thread (engine-worker.ts):
 * onnxruntime-node computes on the thread that calls it.
 */
export class GraphRunner {
  private readonly baseFeeds: Record<string, ort.Tensor> = {};
  private readonly sessions = new Map<string, Promise<ort.InferenceSession>>();
  /** Adapter tensors by adapter id, most recently used last. */
  private readonly adapters = new Map<string, { version: number; tensors: Record<string, ort.Tensor> }>();

  constructor(private readonly config: RunnerConfig) {
    for (const w of baseWeights(config.modelName, config.dims)) this.baseFeeds[`base.${w.name}`] = new ort.Tensor('float32', w.data, w.shape);
  }

  async run(req: RunRequest): Promise<Record<string, Feed>> {
    const session = await this.session(req.kind, req.merged);
    const feeds: Record<string, ort.Tensor> = { ...this.baseFeeds, ...this.adapterTensors(req.adapter) };
    for (const [name, f] of Object.entries(req.feeds)) feeds[name] = new ort.Tensor(f.type, f.data, f.dims);
    const result = await session.run(feeds, req.outputs);
    return Object.fromEntries(req.outputs.map((n) => {
      const t = result[n]!;
      return [n, { type: t.type as Feed['type'], data: t.data as Float32Array | BigInt64Array, dims: [...t.dims] }];
    }));
  }

  private adapterTensors(a: RunRequest['adapter']): Record<string, ort.Tensor> {
    const cached = this.adapters.get(a.id);
    if (!a.feeds) {
      if (!cached || cached.version !== a.version) throw new AdapterNotCachedError();
      this.adapters.delete(a.id);
      this.adapters.set(a.id, cached);
      return cached.tensors;
    }
    const tensors = Object.fromEntries(Object.entries(a.feeds).map(([n, f]) => [n, new ort.Tensor(f.type, f.data, f.dims)]));
    this.adapters.delete(a.id);
    this.adapters.set(a.id, { version: a.version, tensors });
    while (this.adapters.size > ADAPTER_CACHE_SIZE) this.adapters.delete(this.adapters.keys().next().value!);
    return tensors;
  }

  async warm(kind: GraphKind): Promise<void> {
    await this.session(kind, false);
  }

  private session(kind: GraphKind, merged: boolean): Promise<ort.InferenceSession> {
    const key = `${kind}${merged ? ':merged' : ''}`;
    let s = this.sessions.get(key);
    if (!s) {
      const { onnx } = buildGraph(kind, this.config.dims, { mergedUnembedding: merged });
      const cuda = this.config.device === 'cuda';
      s = ort.InferenceSession.create(onnx, {
        executionProviders: [cuda ? 'cuda' : 'cpu'],
        intraOpNumThreads: this.config.threads ?? availableParallelism(),
        interOpNumThreads: 1,
        executionMode: 'sequential',
        graphOptimizationLevel: 'all',
        ...(cuda ? { logSeverityLevel: 4 as const } : {}),
      }).catch((err: unknown) => {
        this.sessions.delete(key);
        throw cuda ? new DeviceUnavailableError(err) : err;
      });
      this.sessions.set(key, s);
    }
    return s;
  }
}
