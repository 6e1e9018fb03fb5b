import { Worker } from 'node:worker_threads';
import { engineWorkerFile, takeEngineWorker } from './engine-prestart.js';
import type { GraphRunner } from './graph-runner.js';
import { LruMap } from './lru.js';
import { ADAPTER_CACHE_SIZE, type Feed, type PrebuildListener, type RunnerConfig, type RunRequest } from './runner-protocol.js';
import type { GraphKind } from './transformer.js';

/** Where a ModelEngine's graphs run: on its worker thread, or inline. */
export interface Runner {
  run(req: RunRequest): Promise<Record<string, Feed>>;
  /**
   * Builds the sessions of `kinds`, the runs asked for meanwhile going in between; `told` hears each build,
   * `signal` stops it before its next one.
   */
  prebuild(kinds: readonly GraphKind[], told?: PrebuildListener, signal?: AbortSignal): Promise<void>;
  close?(): Promise<void>;
}

/** Runs graphs on the calling thread (loads onnxruntime here on first use). */
export class InlineRunner implements Runner {
  private runner: Promise<GraphRunner> | null = null;
  constructor(private readonly config: RunnerConfig) {}
  private get(): Promise<GraphRunner> {
    this.runner ??= import('./graph-runner.js').then((m) => new m.GraphRunner(this.config));
    return this.runner;
  }
  async run(req: RunRequest): Promise<Record<string, Feed>> {
    return (await this.get()).run(req);
  }
  async prebuild(kinds: readonly GraphKind[], told?: PrebuildListener, signal?: AbortSignal): Promise<void> {
    await (await this.get()).prebuild(kinds, told, () => signal?.aborted ?? false);
  }
}

/** Runs graphs on a worker thread that owns the weights and sessions; requests and answers are messages. */
export class WorkerRunner implements Runner {
  private worker: Worker | null = null;
  private readonly pending = new Map<number, { resolve: (v: Record<string, Feed>) => void; reject: (e: Error) => void; told?: PrebuildListener }>();
  /** Prebuilds under way, by call: close() stops them before their next build rather than waiting for all. */
  private readonly prebuilds = new Set<number>();
  private nextId = 0;

  constructor(private readonly config: RunnerConfig) {}

  /** (adapter id → version) the worker holds, in the same order as its own cache. */
  private readonly sent = new LruMap<string, number>(ADAPTER_CACHE_SIZE);

  async run(req: RunRequest): Promise<Record<string, Feed>> {
    // Tensors only for the versions the worker holds not. The worker caches a request's adapters one after
    // another, so the mirror follows them in the same order: an adapter set early may evict one later in the
    // same list, whose tensors then go too.
    const adapters = req.adapters.map(({ id, version, feeds }) => {
      const held = this.sent.peek(id) === version;
      this.sent.set(id, version);
      return held ? { id, version } : { id, version, feeds };
    });
    try {
      return await this.call({ run: { ...req, adapters } });
    } catch (err) {
      // The mirror drifted (a call that failed on its way, say): every tensor again.
      if ((err as Error).name !== 'AdapterNotCachedError') throw err;
      return this.call({ run: req });
    }
  }

  async prebuild(kinds: readonly GraphKind[], told?: PrebuildListener, signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return;
    const id = this.nextId++;
    const building = this.call({ prebuild: [...kinds] }, told, id);
    this.prebuilds.add(id);
    const stop = () => this.stopPrebuild(id);
    signal?.addEventListener('abort', stop, { once: true });
    try {
      await building;
    } finally {
      this.prebuilds.delete(id);
      signal?.removeEventListener('abort', stop);
    }
  }

  private stopPrebuild(id: number): void {
    this.worker?.postMessage({ stopPrebuild: id });
  }

  private closing: Promise<void> | null = null;
  private drained: (() => void) | null = null;

  /**
   * Lets graphs already running finish, then stops the worker. Terminating
   * it while onnxruntime computes aborts the whole process, so a server
   * closed mid-step waits for the step instead.
   */
  close(): Promise<void> {
    this.closing ??= (async () => {
      for (const id of this.prebuilds) this.stopPrebuild(id);
      if (this.pending.size)
        await new Promise<void>((resolve) => {
          this.drained = resolve;
        });
      const w = this.worker;
      this.worker = null;
      if (w) await w.terminate();
    })();
    return this.closing;
  }

  /** Sends one call; `id` given by a caller that must know it first (a prebuild it may stop). */
  private call(msg: { run?: RunRequest; prebuild?: GraphKind[] }, told?: PrebuildListener, id = this.nextId++): Promise<Record<string, Feed>> {
    if (this.closing) return Promise.reject(new Error('The model engine is closed (the server is shutting down).'));
    const worker = this.start();
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, told });
      if (this.pending.size === 1) worker.ref();
      try {
        worker.postMessage({ id, ...msg });
      } catch (err) {
        // Not handed over (a message too large to clone, say): this call fails alone, and nothing is left
        // pending for close() to wait on.
        this.settle(id);
        reject(new Error(`The model engine could not take this work: ${(err as Error).message}`));
      }
    });
  }

  /** Forgets a call; the last one lets the worker go idle and a waiting close() proceed. */
  private settle(id: number): void {
    this.pending.delete(id);
    if (this.pending.size === 0) {
      this.worker?.unref();
      this.drained?.();
    }
  }

  private start(): Worker {
    if (this.worker) return this.worker;
    // The command line's worker, started as the process started, when one is waiting (engine-prestart.ts).
    const file = engineWorkerFile();
    const worker = takeEngineWorker(file, this.config) ?? new Worker(file, { workerData: this.config });
    worker.unref();
    worker.on('message', (msg: WorkerReply) => {
      const p = this.pending.get(msg.id);
      if (!p) return;
      if (msg.building) {
        p.told?.(msg.building.kind, msg.building.phase, msg.building.ms);
        return;
      }
      this.settle(msg.id);
      if (msg.error) {
        const err = new Error(msg.error.message);
        err.name = msg.error.name;
        p.reject(err);
      } else {
        p.resolve(msg.outputs!);
      }
    });
    worker.on('error', (err) => {
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
      this.worker = null;
      this.drained?.();
    });
    this.worker = worker;
    return worker;
  }
}

/** What the worker sends back (engine-worker.ts): a call's outputs or error, or word of a prebuild's build. */
interface WorkerReply {
  id: number;
  outputs?: Record<string, Feed>;
  error?: { name: string; message: string };
  building?: { kind: GraphKind; phase: 'start' | 'done'; ms?: number };
}
