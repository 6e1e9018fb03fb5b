import type { LoopsCore } from '../core/core.js';
import type { Store } from '../core/store.js';

/** Each kept answer's JSON bytes, for the serializer: an answer is serialised once however often it is sent. */
const keptBytes = new WeakMap<object, Buffer>();

/**
 * The reply serializer: a kept answer's bytes, anything else by JSON.stringify. Not fast-json-stringify:
 * the views already build exactly the schema's fields, and it resolves every `T | null` with a runtime
 * validation, which made list routes several times slower. The response schemas still document every route.
 */
export const serializerCompiler =
  () =>
  (data: unknown): string =>
    // Fastify sends a serializer's Buffer as it is (its type says string only): bytes spare the UTF-8 encoding per send.
    ((typeof data === 'object' && data !== null && keptBytes.get(data)) || JSON.stringify(data)) as string;

/** What the kept answers may hold in all (their bytes, keys and entries) before they are dropped and built again. */
const BUDGET_BYTES = 8 * 2 ** 20;
/** A rough cost of one entry beyond its bytes and key: the answer object, the map slot, the bytes' Buffer. */
const ENTRY_OVERHEAD_BYTES = 512;
/** At most this many answers, whatever their size. */
export const MAX_ANSWERS = 4096;

/**
 * Answers of read-only routes (the lists), kept while the core's store has not changed: a list of twenty
 * runs is built and serialised once, not on every request. Serialising and sending it as text took half
 * of `GET /v1/loops/runs`'s time at 32 connections. A reset (a new store) or any write drops them all.
 */
export class AnswerCache {
  private store?: Store;
  private version = -1;
  private readonly answers = new Map<string, object>();
  private bytes = 0;

  constructor(private readonly core: LoopsCore) {}

  /** How many answers are kept, and what they cost in all (bytes, keys, entries). */
  get size(): { answers: number; bytes: number } {
    return { answers: this.answers.size, bytes: this.bytes };
  }

  /**
   * The answer for `key` (everything it depends on besides the records: the caller, the path and query),
   * built by `build` when none is kept for the store as it is now. What `build` throws is never kept.
   */
  get<T extends object>(key: string, build: () => T): T {
    const store = this.core.store;
    if (store !== this.store || store.version !== this.version) {
      this.drop();
      this.store = store;
      this.version = store.version;
    }
    const kept = this.answers.get(key);
    if (kept) return kept as T;
    const answer = build();
    // Building reads, it never writes; should it ever, the answer is not kept.
    if (store.version !== this.version) return answer;
    const bytes = Buffer.from(JSON.stringify(answer));
    // The key and the entry itself count too: many small answers under distinct keys are bounded as well.
    const cost = bytes.length + key.length * 2 + ENTRY_OVERHEAD_BYTES;
    if (this.bytes + cost > BUDGET_BYTES || this.answers.size >= MAX_ANSWERS) this.drop();
    keptBytes.set(answer, bytes);
    this.answers.set(key, answer);
    this.bytes += cost;
    return answer;
  }

  private drop(): void {
    // The journal may keep an answer object for longer (--journal-detail full): its bytes go now. One still on
    // its way out is then serialised by JSON.stringify, to the same text.
    for (const answer of this.answers.values()) keptBytes.delete(answer);
    this.answers.clear();
    this.bytes = 0;
  }
}
