import { availableParallelism } from 'node:os';
import * as ort from 'onnxruntime-node';
import { DeviceUnavailableError } from './device-error.js';
import { collectorAfterReleases } from './collect-soon.js';
import { LruMap } from './lru.js';
import { BUNDLED_GRAPH_DIGESTS, graphSpecKey } from './graph-digests.js';
import { OptimizedModels } from './optimized-models.js';
import { shippedCacheDir } from './package-root.js';
import {
  ADAPTER_CACHE_SIZE,
  AdapterNotCachedError,
  type AdapterRef,
  type Feed,
  type PrebuildListener,
  type RunnerConfig,
  type RunRequest,
} from './runner-protocol.js';
import { versionKey } from './lora.js';
import { SideBySide, type Member } from './side-by-side.js';
import { baseWeights, DECODE_KINDS, layerSites, loraSites, MIXED_SLOTS, type GraphKind, type LoraSite } from './transformer.js';
import { buildGraph, buildMergeGraph } from './transformer-graphs.js';

/** Adapters laid side by side, and the feeds that depend on them alone (not on the rows) as onnxruntime's tensors. */
interface Layout {
  sides: SideBySide;
  tensors: Record<string, ort.Tensor>;
}

const scaleOf = (tensors: Record<string, ort.Tensor>) => (tensors.lora_scale!.data as Float32Array)[0]!;

/** Rows one adapter version decodes (rows × steps) before its unembedding is merged (see worthMerging). */
const MERGE_AFTER_DECODED_ROWS = 64;

/**
 * Rows one adapter version decodes in batches before it gets a session with its unembedding packed in (see
 * packedSession): about what the unpacked batches have cost extra by then (~0.13 ms a row) matches the half
 * second the packing costs once, so a short phase never pays for it and a long one pays at most twice.
 */
const PACK_AFTER_BATCHED_ROWS = 4096;
/** Packed sessions kept: each holds about twice the unembedding (78 MB at the Qwen vocabulary). */
const PACKED_CACHE_SIZE = 2;

/** Adapter lists kept side by side (GraphRunner.sideBySide): a training step's batches and a sampling phase's; 2.2 MB for 16 rank-16 adapters. */
const SIDE_BY_SIDE_CACHE_SIZE = 4;
/** How long adapter lists stay side by side after the last mixed run: only a burst reuses them. */
const SIDE_BY_SIDE_IDLE_MS = 1000;

/** Merged unembeddings kept for decoding (39 MB each at the Qwen vocabulary). */
const MERGED_CACHE_SIZE = 3;

/**
 * How long heavy sessions outlive their last run. onnxruntime's arena keeps
 * the most a session ever held, and onnxruntime-node cannot ask it to
 * shrink; without the arena every run faults its tensors in afresh (training
 * at about half speed). So heavy runs get sessions of their own, arena and
 * all, dropped this long after the last one: fast within a request, the
 * memory returned after it. A new session costs about 40 ms.
 */
const HEAVY_IDLE_MS = 250;

/** Feeds above this many bytes in one run (1 MB) make it a long sequence's (see collectSoon). */
const LONG_FEED_BYTES = 2 ** 20;

function feedBytes(feeds: Record<string, Feed>): number {
  let n = 0;
  for (const f of Object.values(feeds)) n += f.data.byteLength;
  return n;
}

export { DeviceUnavailableError } from './device-error.js';
export type { Feed, RunnerConfig, RunRequest } from './runner-protocol.js';

// onnxruntime's own log goes to stderr; every failure it reports also reaches us as an exception, which we
// turn into a clear message, so its log would only repeat it (e.g. three lines for a missing CUDA provider).
ort.env.logLevel = 'fatal';

/**
 * The options of the sessions a runner builds (the package's build keeps the warm-up's graphs optimized with
 * them: shipped-graphs.ts). `threads` (--threads) defaults to the cores this process may use.
 */
export function sessionOptions(device: 'cpu' | 'cuda', threads?: number): ort.InferenceSession.SessionOptions {
  return {
    executionProviders: [device],
    intraOpNumThreads: threads ?? availableParallelism(),
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
    // Each session has a pool of its own, and by default its threads spin a while after each run: with a
    // training step, an eval and a sample in turn (one session each), the spinning pools took the cores
    // from the one at work (campaign round ~200 -> ~150 ms on 2 cores; sampling unchanged).
    extra: { session: { intra_op: { allow_spinning: '0' } } },
    ...(device === 'cuda' ? { logSeverityLevel: 4 as const } : {}),
  };
}

/**
 * Owns one base model's weights and its onnxruntime sessions, and runs
 * graphs on plain-data feeds. It lives in a worker thread (engine-worker.ts):
 * onnxruntime-node computes on the thread that calls it.
 */
export class GraphRunner {
  private readonly baseFeeds: Record<string, ort.Tensor> = {};
  private readonly sessions = new Map<string, Promise<ort.InferenceSession>>();
  /** Adapter tensors by adapter id. */
  private readonly adapters = new LruMap<string, { version: number; tensors: Record<string, ort.Tensor> }>(ADAPTER_CACHE_SIZE);

  /** The layer sites' shapes (a site's rank comes with each adapter's tensors), for mixed-adapter runs. */
  private readonly layerSites: LoraSite[];

  /** Sessions from optimized graphs kept between processes (on CPU: a GPU's sessions optimize for the device). */
  private readonly optimized: OptimizedModels;

  /**
   * @param graphDigests the graphs' digests known ahead (graph-digests.ts: the bundle's), so that a session whose
   *   optimized graph is kept is made without building the graph.
   */
  constructor(
    private readonly config: RunnerConfig,
    private readonly graphDigests: Readonly<Record<string, string>> | null = BUNDLED_GRAPH_DIGESTS,
  ) {
    const cpu = config.device === 'cpu';
    this.optimized = new OptimizedModels(cpu ? (config.cacheDir ?? null) : null, cpu ? shippedCacheDir() : null);
    this.layerSites = layerSites(loraSites(config.dims));
    // Made afresh (~30 ms for Qwen's 39 MB): reading a kept copy back and checking it took longer (~50 ms).
    for (const w of baseWeights(config.modelName, config.dims)) this.baseFeeds[`base.${w.name}`] = new ort.Tensor('float32', w.data, w.shape);
  }

  /** Where this runner's sessions came from (optimized-models.ts), and how many graphs it built: for tests and the curious. */
  sessionSources(): Record<string, number> {
    return { ...this.optimized.counts, graphsBuilt: this.optimized.graphsBuilt };
  }

  async run(req: RunRequest): Promise<Record<string, Feed>> {
    const mixed = req.rowAdapters !== undefined;
    // Every adapter's tensors first: a missing one fails the run before anything is computed.
    const tensors = req.adapters.map((a) => this.adapterTensors(a));
    // Decoding reads the whole unembedding every step: with LoRA merged into it once per adapter
    // version, a step is one product instead of two and a sum over [rows × vocab].
    const decode = DECODE_KINDS.includes(req.kind);
    const rows = req.feeds.tokens!.dims[0]!;
    const single = req.adapters[0]!;
    const merge = !mixed && decode && this.worthMerging(single, rows);
    const adapter = mixed ? this.sideBySide(req, tensors) : tensors[0]!;
    const packed = merge ? await this.packedSession(req.kind, single, adapter, rows) : null;
    if (req.heavy) this.heavyRuns++;
    let result: ort.InferenceSession.OnnxValueMapType;
    try {
      const session = packed ?? (await this.session(req.kind, req.merged || merge, req.heavy ?? false, mixed));
      const feeds: Record<string, ort.Tensor> = { ...this.baseFeeds, ...adapter };
      if (merge && !packed) feeds.lm_head_merged = await this.mergedUnembedding(single, adapter);
      for (const [name, f] of Object.entries(req.feeds)) feeds[name] = new ort.Tensor(f.type, f.data, f.dims);
      result = await session.run(feeds, req.outputs);
    } finally {
      if (req.heavy && --this.heavyRuns === 0) this.releaseHeavySoon();
    }
    if (req.heavy || feedBytes(req.feeds) > LONG_FEED_BYTES) this.collectSoon();
    return Object.fromEntries(
      req.outputs.map((n) => {
        const t = result[n]!;
        return [n, { type: t.type as Feed['type'], data: t.data as Float32Array | BigInt64Array, dims: [...t.dims] }];
      }),
    );
  }

  /** Adapter lists laid side by side, by their keys in order. */
  private readonly layouts = new LruMap<string, Layout>(SIDE_BY_SIDE_CACHE_SIZE);

  /**
   * A mixed-adapter run's LoRA inputs (GraphOptions.mixedAdapters): the layer sites' tensors side by side,
   * each row's scales, and each adapter's unembedding LoRA in its own slot with the rows it applies to. The
   * rows of each adapter come together, in the order of `adapters` (the engine orders them so).
   */
  private sideBySide(req: RunRequest, tensors: Record<string, ort.Tensor>[]): Record<string, ort.Tensor> {
    this.releaseSideBySideSoon();
    const rows = req.rowAdapters!;
    if (tensors.length > MIXED_SLOTS) throw new Error(`a mixed-adapter run holds at most ${MIXED_SLOTS} adapters, not ${tensors.length}`);
    if (rows.some((j, b) => j < 0 || j >= tensors.length || (b > 0 && j < rows[b - 1]!)))
      throw new Error("a mixed-adapter run needs each adapter's rows together, in the order of its adapters");
    const key = req.adapters.map(versionKey).join(',');
    let layout = this.layouts.get(key);
    if (!layout) {
      layout = this.layoutOf(tensors);
      this.layouts.set(key, layout);
    }
    const slotRows = new BigInt64Array(MIXED_SLOTS + 1);
    for (const j of rows) slotRows[j + 1]!++;
    for (let j = 1; j <= MIXED_SLOTS; j++) slotRows[j]! += slotRows[j - 1]!;
    const lora = layout.sides.rowScales(rows);
    return { ...layout.tensors, slot_rows: new ort.Tensor('int64', slotRows, [MIXED_SLOTS + 1]), lora_rows: new ort.Tensor('float32', lora.data, lora.dims) };
  }

  /** The layer sites side by side, and each adapter's unembedding LoRA and scale in its slot (unused slots empty). */
  private layoutOf(tensors: Record<string, ort.Tensor>[]): Layout {
    const sides = new SideBySide(
      this.layerSites,
      tensors.map((t): Member => ({ scale: scaleOf(t), tensors: t as unknown as Record<string, Feed> })),
    );
    const feeds = Object.fromEntries(Object.entries(sides.tensors).map(([n, f]) => [n, new ort.Tensor('float32', f.data, f.dims)]));
    const scales = new Float32Array(MIXED_SLOTS);
    for (let j = 0; j < MIXED_SLOTS; j++) {
      const t = tensors[j];
      if (t) scales[j] = scaleOf(t);
      feeds[`lora.lm_head.A.${j}`] = t?.['lora.lm_head.A'] ?? this.emptySlot.A;
      feeds[`lora.lm_head.B.${j}`] = t?.['lora.lm_head.B'] ?? this.emptySlot.B;
    }
    feeds.slot_scale = new ort.Tensor('float32', scales, [MIXED_SLOTS]);
    return { sides, tensors: feeds };
  }

  /** An unused slot's unembedding LoRA: rank 0, so it costs nothing. */
  private get emptySlot(): { A: ort.Tensor; B: ort.Tensor } {
    this.empty ??= {
      A: new ort.Tensor('float32', new Float32Array(0), [this.config.dims.dModel, 0]),
      B: new ort.Tensor('float32', new Float32Array(0), [0, this.config.dims.vocab]),
    };
    return this.empty;
  }

  private empty: { A: ort.Tensor; B: ort.Tensor } | null = null;

  private sideBySideTimer: ReturnType<typeof setTimeout> | null = null;

  private releaseSideBySideSoon(): void {
    if (this.sideBySideTimer) clearTimeout(this.sideBySideTimer);
    this.sideBySideTimer = setTimeout(() => {
      this.sideBySideTimer = null;
      this.layouts.clear();
      this.collectSoon();
    }, SIDE_BY_SIDE_IDLE_MS);
    this.sideBySideTimer.unref?.();
  }

  /** W + scale·A·B of the unembedding per adapter version, for the few adapters decoding now (39 MB each). */
  private readonly merged = new LruMap<string, { version: number; tensor: Promise<ort.Tensor> }>(MERGED_CACHE_SIZE);
  private mergeSession: Promise<ort.InferenceSession> | null = null;

  private async mergedUnembedding(a: AdapterRef, tensors: Record<string, ort.Tensor>): Promise<ort.Tensor> {
    // Kept in the order merged: using one does not keep it longer.
    const cached = this.merged.peek(a.id);
    if (cached && cached.version === a.version) return cached.tensor;
    this.mergeSession ??= ort.InferenceSession.create(buildMergeGraph(this.config.dims), this.sessionOptions(false));
    const tensor = this.mergeSession.then(
      async (s) =>
        (
          await s.run({
            'base.embed_t': this.baseFeeds['base.embed_t']!,
            'lora.lm_head.A': tensors['lora.lm_head.A']!,
            'lora.lm_head.B': tensors['lora.lm_head.B']!,
            lora_scale: tensors.lora_scale!,
          })
        ).lm_head_merged!,
    );
    this.merged.set(a.id, { version: a.version, tensor });
    return tensor;
  }

  /**
   * Per adapter (its current version): rows decoded, until its unembedding is merged, and rows decoded merged
   * in runs of two or more, until it gets a packed session.
   */
  private readonly decodeUse = new LruMap<string, { version: number; rows: number; batched: number }>(ADAPTER_CACHE_SIZE);

  private useOf(a: AdapterRef): { version: number; rows: number; batched: number } {
    let use = this.decodeUse.peek(a.id);
    if (use?.version !== a.version) use = { version: a.version, rows: 0, batched: 0 };
    this.decodeUse.set(a.id, use);
    return use;
  }

  /**
   * Merging costs a few hundred milliseconds of copying (a vocabulary-sized weight) and saves a fraction of
   * one per row and step, so an adapter version is merged only once it has decoded a while: the short
   * samples of a train-then-sample loop never pay for it, a long or wide sampling phase does once.
   */
  private worthMerging(a: AdapterRef, batch: number): boolean {
    if (this.merged.peek(a.id)?.version === a.version) return true;
    const use = this.useOf(a);
    use.rows += batch;
    return use.rows > MERGE_AFTER_DECODED_ROWS;
  }

  /** Sessions with one adapter version's merged unembedding built in as a constant, by `id:version:kind`. */
  private readonly packed = new LruMap<string, Promise<ort.InferenceSession | null>>(PACKED_CACHE_SIZE);

  /**
   * onnxruntime re-packs the right operand of every matrix product of two
   * rows or more; in a decode step that operand is the whole merged
   * unembedding (39 MB at the Qwen vocabulary), about 2.5 ms of a 4 to 5 ms
   * 8-row step. As a constant of the graph it is packed once, when the
   * session is created: that takes about half a second (and this thread),
   * so only an adapter version that keeps decoding in batches gets one.
   */
  private async packedSession(kind: GraphKind, a: AdapterRef, tensors: Record<string, ort.Tensor>, rows: number): Promise<ort.InferenceSession | null> {
    const key = `${versionKey(a)}:${kind}`;
    const found = this.packed.get(key);
    if (found) return found;
    if (rows < 2 || this.config.device === 'cuda') return null;
    const use = this.useOf(a);
    use.batched += rows;
    if (use.batched < (this.config.packAfterBatchedRows ?? PACK_AFTER_BATCHED_ROWS)) return null;
    const weight = (await this.mergedUnembedding(a, tensors)).data as Float32Array;
    const { onnx } = buildGraph(kind, this.config.dims, { mergedUnembedding: true, packedUnembedding: weight });
    // A session that fails to build (memory) only costs the speed-up: the run goes on with the weight as an input.
    const session = ort.InferenceSession.create(onnx, this.sessionOptions(false)).catch(() => null);
    this.packed.set(key, session);
    return session;
  }

  private adapterTensors(a: AdapterRef): Record<string, ort.Tensor> {
    if (!a.feeds) {
      // Another version held under this id stays where it is: the sender resends its tensors next.
      if (this.adapters.peek(a.id)?.version !== a.version) throw new AdapterNotCachedError();
      return this.adapters.get(a.id)!.tensors;
    }
    const tensors = Object.fromEntries(Object.entries(a.feeds).map(([n, f]) => [n, new ort.Tensor(f.type, f.data, f.dims)]));
    this.adapters.set(a.id, { version: a.version, tensors });
    return tensors;
  }

  private sessionOptions(cuda: boolean): ort.InferenceSession.SessionOptions {
    return sessionOptions(cuda ? 'cuda' : 'cpu', this.config.threads);
  }

  /**
   * Builds the sessions of `kinds` one after another, letting the runs asked for meanwhile in between (a
   * session's build holds this thread for tens of milliseconds): started as the engine starts, the builds
   * fill this thread's time while the server's thread is still loading. `told` hears each build's start and
   * end (with its milliseconds); `stopped` ends it before its next build.
   */
  async prebuild(kinds: readonly GraphKind[], told?: PrebuildListener, stopped: () => boolean = () => false): Promise<void> {
    for (const kind of kinds) {
      await new Promise((resolve) => setImmediate(resolve));
      if (stopped()) return;
      told?.(kind, 'start');
      const started = performance.now();
      await this.session(kind, false, false);
      told?.(kind, 'done', performance.now() - started);
    }
  }

  /**
   * A long sequence's feeds and results (a block of one, or a decode step's copy of long caches: megabytes a
   * step) are garbage soon after: this thread collects shortly after them (after the heavy sessions go),
   * rather than at some later collection an idle engine may not run for minutes.
   */
  private readonly collectSoon = collectorAfterReleases(HEAVY_IDLE_MS + 50);

  /** Heavy runs in progress; heavy sessions are released only once none is. */
  private heavyRuns = 0;
  private heavyTimer: ReturnType<typeof setTimeout> | null = null;

  private releaseHeavySoon(): void {
    if (this.heavyTimer) clearTimeout(this.heavyTimer);
    this.heavyTimer = setTimeout(() => {
      this.heavyTimer = null;
      if (this.heavyRuns > 0) return;
      for (const [key, session] of this.sessions) {
        if (!key.endsWith(':heavy')) continue;
        this.sessions.delete(key);
        void session.then(
          (s) => s.release(),
          () => undefined,
        );
      }
    }, HEAVY_IDLE_MS);
    // Never what keeps a process (or a worker) alive.
    this.heavyTimer.unref?.();
  }

  private session(kind: GraphKind, merged: boolean, heavy: boolean, mixed = false): Promise<ort.InferenceSession> {
    const key = `${kind}${merged ? ':merged' : ''}${mixed ? ':mixed' : ''}${heavy ? ':heavy' : ''}`;
    let s = this.sessions.get(key);
    if (!s) {
      const { dims } = this.config;
      const graph = {
        digest: this.graphDigests?.[graphSpecKey({ kind, dims, merged, mixed })],
        build: () => buildGraph(kind, dims, { mergedUnembedding: merged, mixedAdapters: mixed }).onnx,
      };
      const cuda = this.config.device === 'cuda';
      s = this.optimized.create(graph, this.sessionOptions(cuda)).catch((err: unknown) => {
        this.sessions.delete(key);
        throw cuda ? new DeviceUnavailableError(err) : err;
      });
      this.sessions.set(key, s);
    }
    return s;
  }
}
