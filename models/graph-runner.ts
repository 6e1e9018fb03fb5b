import { availableParallelism } from 'node:os';
import * as ort from 'onnxruntime-node';
import { DeviceUnavailableError } from './device-error.js';
import { ADAPTER_CACHE_SIZE, AdapterNotCachedError, type Feed, type RunnerConfig, type RunRequest } from './runner-protocol.js';
import { baseWeights, buildGraph, type GraphKind } from './transformer.js';

export { DeviceUnavailableError } from './device-error.js';
export type { Feed, RunnerConfig, RunRequest } from './runner-protocol.js';

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
