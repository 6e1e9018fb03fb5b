/**
 * onnxruntime's optimized graphs, kept between processes (cache-entries.ts) and within one. Building a session
 * optimizes its graph first (fusions, layouts): about two thirds of the build's time (7 sessions, ~160 ms -> ~50
 * ms on 2 cores). The optimized graph is saved once (onnxruntime's optimizedModelFilePath) and later sessions
 * load it with optimization off. onnxruntime warns that a graph optimized at its highest level suits the machine
 * it was made on only: the key holds the graph's digest, onnxruntime's version, the session's options and the
 * CPU's model and instruction set, so another runtime, setting or machine makes an entry of its own. The package's
 * build keeps the warm-up's graphs too (shipped-graphs.ts), read where --cache-dir has none: they serve a
 * checkout or install built on the machine it runs on, and are passed over anywhere else.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { keep, lookUp, uniqueSuffix, type CacheOutcome, type EntryKind } from './cache-entries.js';
import { graphDigest } from './graph-digests.js';

/** The entries: an optimized graph's bytes. */
export const OPTIMIZED_MODEL_ENTRIES: EntryKind<Uint8Array> = {
  folder: 'onnxruntime-models',
  magic: 'loops-mock optimized onnx model 1\n',
  encode: (bytes) => ({ parts: [bytes], about: null }),
  decode: (bytes) => (bytes.byteLength > 0 ? bytes : 'no graph'),
};

/** The instruction set the optimized graph's kernels were picked for: Linux's CPU flags, else the CPU's name (read once). */
let thisMachine: string | null = null;
function machine(): string {
  if (thisMachine !== null) return thisMachine;
  let flags = '';
  try {
    // x86 names them `flags`, Arm `Features`.
    flags = /^(?:flags|Features)\s*:(.*)$/m.exec(readFileSync('/proc/cpuinfo', 'latin1'))?.[1] ?? '';
  } catch {
    // Not Linux: the model name alone.
  }
  thisMachine = `${process.arch} ${cpus()[0]?.model ?? ''} ${flags.trim()}`;
  return thisMachine;
}

/** The entry's key for the graph of `digest` (graphDigest) built with `options`. */
export function optimizedModelKey(digest: string, options: ort.InferenceSession.SessionOptions, runtime = ort.env.versions.common): string {
  return createHash('sha256')
    .update(digest)
    .update(JSON.stringify({ runtime, binding: ort.env.versions.node, options, machine: machine() }))
    .digest('hex');
}

/**
 * A graph to build a session of: its digest where known ahead (graph-digests.ts), so that a kept entry serves
 * without the graph being built; `build` makes its bytes, called only when they are needed.
 */
export interface GraphSource {
  digest?: string;
  build(): Uint8Array;
}

/** Sessions built from optimized graphs where one is kept: in this process first, then the package's, then the cache folder. */
export class OptimizedModels {
  /** Optimized graphs by key: a heavy run's session, released after use and built again next round, reads it here. */
  private readonly held = new Map<string, Uint8Array>();
  /** What the builds found, counted (for tests and the curious), and why the last entry refused was. */
  readonly counts: Record<CacheOutcome | 'held' | 'shipped', number> = { hit: 0, held: 0, shipped: 0, miss: 0, rebuilt: 0, off: 0 };
  lastRefused: string | null = null;
  /** Graphs built (their bytes made): none for a session whose digest came ahead and whose entry was found. */
  graphsBuilt = 0;

  /**
   * @param cacheDir the cache folder (--cache-dir); null: sessions the package's build did not keep optimize
   *   their graphs, as onnxruntime does by default, and nothing is written.
   * @param shippedDir the package's own entries (shippedGraphsDir), read only; an entry missing, damaged or
   *   made for another machine there is passed over.
   */
  constructor(
    private readonly cacheDir: string | null,
    private readonly shippedDir: string | null = null,
  ) {}

  async create(graph: GraphSource, options: ort.InferenceSession.SessionOptions): Promise<ort.InferenceSession> {
    let bytes: Uint8Array | undefined;
    const onnx = () => {
      if (!bytes) {
        this.graphsBuilt++;
        bytes = graph.build();
      }
      return bytes;
    };
    const dir = this.cacheDir;
    if (!dir && !this.shippedDir) {
      this.counts.off++;
      return ort.InferenceSession.create(onnx(), options);
    }
    const key = optimizedModelKey(graph.digest ?? graphDigest(onnx()), options);
    const held = this.held.get(key);
    if (held) {
      this.counts.held++;
      return this.fromOptimized(held, options);
    }
    // Why the cache folder's entry could not serve (what a rebuilt one replaces); the package's is only passed over.
    let refused: string | undefined;
    for (const [outcome, folder] of [
      ['shipped', this.shippedDir],
      ['hit', dir],
    ] as const) {
      if (!folder) continue;
      const found = lookUp(OPTIMIZED_MODEL_ENTRIES, folder, key);
      if ('refused' in found) {
        if (outcome === 'hit') refused = found.refused;
        continue;
      }
      try {
        const session = await this.fromOptimized(found.value, options);
        this.held.set(key, found.value);
        this.counts[outcome]++;
        return session;
      } catch (err) {
        // Sound bytes onnxruntime will not load (an entry from a runtime that shares the version string, say).
        if (outcome === 'hit') refused = `a graph onnxruntime refused (${(err as Error).message.split('\n')[0]})`;
      }
    }
    if (!dir) {
      // --cache-dir none, and the package kept no graph this session can use: optimized here, as by default.
      this.counts.off++;
      return ort.InferenceSession.create(onnx(), options);
    }
    const folder = join(dir, OPTIMIZED_MODEL_ENTRIES.folder);
    const file = join(folder, `${key.slice(0, 24)}.${uniqueSuffix()}.onnx`);
    let session: ort.InferenceSession;
    try {
      mkdirSync(folder, { recursive: true });
      session = await ort.InferenceSession.create(onnx(), { ...options, optimizedModelFilePath: file });
    } catch {
      // A folder onnxruntime cannot write the graph into: the session as it always was (a graph it cannot
      // build at all fails there, with onnxruntime's own message).
      rmSync(file, { force: true });
      this.counts.miss++;
      return ort.InferenceSession.create(onnx(), options);
    }
    try {
      const optimized = new Uint8Array(readFileSync(file));
      this.held.set(key, optimized);
      keep(OPTIMIZED_MODEL_ENTRIES, dir, key, optimized);
    } catch {
      // Its file unreadable: this session is sound all the same, and the next build tries again.
    } finally {
      rmSync(file, { force: true });
    }
    if (refused === 'missing') this.counts.miss++;
    else {
      this.counts.rebuilt++;
      this.lastRefused = refused ?? null;
    }
    return session;
  }

  /** A session of an optimized graph: optimizing it again would only repeat the work. */
  private fromOptimized(optimized: Uint8Array, options: ort.InferenceSession.SessionOptions): Promise<ort.InferenceSession> {
    return ort.InferenceSession.create(optimized, { ...options, graphOptimizationLevel: 'disabled' });
  }
}
