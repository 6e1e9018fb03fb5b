/** The engine's graph runs, one at a time, in the turns every part of the engine takes. */
import type { Runner } from './engine-runner.js';
import { loraFeeds } from './feeds.js';
import type { LoraAdapter } from './lora.js';
import type { Feed } from './runner-protocol.js';
import { DECODE_KINDS, type GraphKind, type LoraSite, type ModelDims } from './transformer.js';

/**
 * A graph kind's session built on an engine: at its first run, which then takes a moment on a cold engine, or
 * ahead of it by the warm-up (`ahead`).
 */
export interface GraphBuildEvent {
  model: string;
  kind: GraphKind;
  /** The kind's mixed-adapter graph (rows of several adapters in one run). */
  mixed: boolean;
  phase: 'start' | 'done';
  /** With `done`: building and the first run together, or with `ahead` the build alone (on the runner's thread). */
  ms?: number;
  /** Built by the warm-up before any run of the kind (buildAhead). */
  ahead?: boolean;
}

/**
 * A run holding a tensor of more floats than this (scored rows × vocabulary, or attention scores) is heavy:
 * 4M floats is 16 MB, about 28 scored rows at Qwen's vocabulary. The guide's campaign runs stay below it.
 */
const HEAVY_FLOATS = 4 * 2 ** 20;
/** Keys and values a run reads above this many floats (1 MB, ~1,000 positions): a long sequence's (see heavy). */
const LONG_CACHE_FLOATS = 256 * 1024;
/** From this many scored positions in one run on, the merged unembedding is cheaper (about the model width). */
export const MERGE_FROM_POSITIONS = 64;

/**
 * An engine's graph runs, one at a time: onnxruntime sessions already use every core. Every part of the
 * engine takes a turn here (`inTurn`) and runs its graphs from it (`runNow`); this part picks how each run
 * goes (merged unembedding, sessions released after heavy runs), counts runs and tells of first builds.
 */
export class GraphTurns {
  private queue: Promise<unknown> = Promise.resolve();
  /** Graph kinds run or built ahead so far, `<kind>` or `<kind>:mixed`: each is told of once. */
  private readonly ranKinds = new Set<string>();
  /** Graph runs so far, and how many of them held rows of several adapters (concurrent runs or samplers batched together). */
  readonly graphRuns = { total: 0, mixed: 0 };
  /** Told when a graph kind is first built and run (ModelEngine.onGraphBuild). */
  onGraphBuild?: (event: GraphBuildEvent) => void;
  /** Told after each heavy run (ModelEngine.onLongSequence). */
  onLongSequence?: () => void;

  constructor(
    private readonly runner: Runner,
    private readonly modelName: string,
    private readonly dims: ModelDims,
    private readonly sites: LoraSite[],
  ) {}

  /** Runs `fn` after everything queued before it, whether that failed or not. */
  inTurn<T>(fn: () => Promise<T>): Promise<T> {
    const turn = this.queue.then(fn);
    this.queue = turn.catch(() => undefined);
    return turn;
  }

  /**
   * Builds the sessions of `kinds` on the runner's thread, one after another, each run asked for meanwhile going
   * in between, and tells of each build not preceded by a run of its kind. `signal` stops it before its next build.
   */
  async buildAhead(kinds: readonly GraphKind[], signal?: AbortSignal): Promise<void> {
    const mine = new Set<GraphKind>();
    await this.runner.prebuild(
      kinds,
      (kind, phase, ms) => {
        if (phase === 'start') {
          // A client's run got there first: its own events tell of the build.
          if (this.ranKinds.has(kind)) return;
          this.ranKinds.add(kind);
          mine.add(kind);
        } else if (!mine.delete(kind)) return;
        this.onGraphBuild?.({ model: this.modelName, kind, mixed: false, phase, ...(phase === 'done' ? { ms } : {}), ahead: true });
      },
      signal,
    );
  }

  /** One adapter's graph run in a turn of its own. */
  run(kind: GraphKind, feeds: Record<string, Feed>, outputs: string[], adapter: LoraAdapter): Promise<Record<string, Float32Array>> {
    // (topk_indices and token come back as BigInt64Arrays; callers that read them say so.)
    return this.inTurn(() => this.runNow(kind, feeds, outputs, [adapter]));
  }

  /** Runs a graph now: only from a turn already taken. With `rowAdapters` (each row's index into `adapters`), the mixed-adapter graph. */
  async runNow(
    kind: GraphKind,
    feeds: Record<string, Feed>,
    outputs: string[],
    adapters: LoraAdapter[],
    rowAdapters?: number[],
  ): Promise<Record<string, Float32Array>> {
    // Many scored positions of one adapter: LoRA merged into the unembedding weight first (see GraphOptions).
    const scored = feeds.targets?.dims.reduce((p, n) => p * n, 1) ?? 0;
    const merged = !rowAdapters && !DECODE_KINDS.includes(kind) && scored >= MERGE_FROM_POSITIONS;
    // A graph kind's first run builds its session (seconds, on a cold engine): said, for a person waiting on it.
    const mixed = rowAdapters !== undefined;
    const graph = `${kind}${mixed ? ':mixed' : ''}`;
    const first = !this.ranKinds.has(graph);
    const started = first ? performance.now() : 0;
    if (first) {
      this.ranKinds.add(graph);
      this.onGraphBuild?.({ model: this.modelName, kind, mixed, phase: 'start' });
    }
    const heavy = this.heavy(feeds);
    this.graphRuns.total++;
    if (mixed) this.graphRuns.mixed++;
    const refs = adapters.map((a) => ({ id: a.id, version: a.version, feeds: loraFeeds(this.sites, a) }));
    // Mixed runs come only while several runs or samplers work at once: on sessions released once that is over,
    // so that the batches' larger buffers do not stay resident after a burst of concurrent work.
    const result = await this.runner.run({ kind, merged, heavy: heavy || mixed, feeds, outputs, adapters: refs, rowAdapters });
    if (first) this.onGraphBuild?.({ model: this.modelName, kind, mixed, phase: 'done', ms: performance.now() - started });
    if (heavy) this.onLongSequence?.();
    return Object.fromEntries(outputs.map((n) => [n, result[n]!.data as Float32Array]));
  }

  /**
   * Whether a run's largest tensors are far above a usual one's (see HEAVY_FLOATS), or it decodes after long
   * caches (its arena would keep their size for good): it runs on a session released after use.
   */
  private heavy(feeds: Record<string, Feed>): boolean {
    const [B = 1, S = 0] = feeds.targets?.dims ?? [];
    const bias = feeds.attn_bias?.dims ?? [];
    const attention = this.dims.heads * (bias[0] ?? 0) * (bias[2] ?? 0) * (bias[3] ?? 0);
    const cached = (feeds['past_k.0']?.data.length ?? 0) * 2 * this.dims.layers;
    return B * S * this.dims.vocab > HEAVY_FLOATS || attention > HEAVY_FLOATS || cached > LONG_CACHE_FLOATS;
  }
}
