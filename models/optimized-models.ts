/**
 * onnxruntime's optimized graphs, kept between processes (cache-entries.ts) and within one. Building a session
 * optimizes its graph first (fusions, layouts): about two thirds of the build's time (7 sessions, ~160 ms -> ~50
 * ms on 2 cores). The optimized graph is saved once (onnxruntime's optimizedModelFilePath) and later sessions
 * load it with optimization off. onnxruntime warns that a graph optimized at its highest level suits the machine
 * it was made on only: the key holds the graph's bytes, onnxruntime's version, the session's options and the
 * CPU's model and instruction set, so another runtime, setting or machine makes an entry of its own.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { keep, lookUp, uniqueSuffix, type CacheOutcome, type EntryKind } from './cache-entries.js';

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

/** The entry's key for a graph built with `options`. */
export function optimizedModelKey(onnx: Uint8Array, options: ort.InferenceSession.SessionOptions, runtime = ort.env.versions.common): string {
  return createHash('sha256')
    .update(onnx)
    .update(JSON.stringify({ runtime, binding: ort.env.versions.node, options, machine: machine() }))
    .digest('hex');
}

/** Sessions built from optimized graphs where one is kept: in this process first, then in the cache folder. */
export class OptimizedModels {
  /** Optimized graphs by key: a heavy run's session, released after use and built again next round, reads it here. */
  private readonly held = new Map<string, Uint8Array>();
  /** What the builds found, counted (for tests and the curious), and why the last entry refused was. */
  readonly counts: Record<CacheOutcome | 'held', number> = { hit: 0, held: 0, miss: 0, rebuilt: 0, off: 0 };
  lastRefused: string | null = null;

  /** @param cacheDir the cache folder (--cache-dir); null: every session optimizes its graph, as onnxruntime does by default. */
  constructor(private readonly cacheDir: string | null) {}

  async create(onnx: Uint8Array, options: ort.InferenceSession.SessionOptions): Promise<ort.InferenceSession> {
    const dir = this.cacheDir;
    if (!dir) {
      this.counts.off++;
      return ort.InferenceSession.create(onnx, options);
    }
    const key = optimizedModelKey(onnx, options);
    const held = this.held.get(key);
    const found = held ? { value: held } : lookUp(OPTIMIZED_MODEL_ENTRIES, dir, key);
    let refused = 'refused' in found ? found.refused : undefined;
    if ('value' in found) {
      try {
        const session = await ort.InferenceSession.create(found.value, { ...options, graphOptimizationLevel: 'disabled' });
        this.held.set(key, found.value);
        this.counts[held ? 'held' : 'hit']++;
        return session;
      } catch (err) {
        // Sound bytes onnxruntime will not load (an entry from a runtime that shares the version string, say).
        this.held.delete(key);
        refused = `a graph onnxruntime refused (${(err as Error).message.split('\n')[0]})`;
      }
    }
    const folder = join(dir, OPTIMIZED_MODEL_ENTRIES.folder);
    const file = join(folder, `${key.slice(0, 24)}.${uniqueSuffix()}.onnx`);
    let session: ort.InferenceSession;
    try {
      mkdirSync(folder, { recursive: true });
      session = await ort.InferenceSession.create(onnx, { ...options, optimizedModelFilePath: file });
    } catch {
      // A folder onnxruntime cannot write the graph into: the session as it always was (a graph it cannot
      // build at all fails there, with onnxruntime's own message).
      rmSync(file, { force: true });
      this.counts.miss++;
      return ort.InferenceSession.create(onnx, options);
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
}
