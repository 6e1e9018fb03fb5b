import { closeSync, fstatSync, ftruncateSync, openSync, writeSync } from 'node:fs';
import { BackgroundWriteFailures } from './storage-errors.js';

/**
 * Where a request went: a Loops plane, the admin API, the Hugging Face
 * mirror, the forward proxy itself (CONNECTs, refused hosts), or the
 * server's own service routes (/healthz, /openapi.json).
 */
export type Surface = 'control' | 'trainer' | 'sampler' | 'admin' | 'hub' | 'proxy' | 'service';
export const SURFACES: readonly Surface[] = ['control', 'trainer', 'sampler', 'admin', 'hub', 'proxy', 'service'];

/** What proxy mode did with a CONNECT or a plain-HTTP proxy request. */
export type ProxyAction = 'intercept' | 'passthrough' | 'refuse';

/** One request as the journal keeps it. Never holds an API key. */
export interface JournalEntry {
  /** Arrival order, from 1; `since` filters on it. */
  seq: number;
  /** Arrival time on the server's clock (virtual under --clock virtual). */
  time: string;
  surface: Surface;
  method: string;
  /** The path without its query string. */
  path: string;
  /** The route template it matched, e.g. /trainer/{run_id}/forward_backward; null when none did. */
  route: string | null;
  /** The status sent; 0 when the connection closed with no answer (a dropped connection). */
  status: number;
  /** Wall-clock milliseconds from arrival to the last byte (or the drop). */
  latency_ms: number;
  run_id?: string;
  sampler_id?: string;
  operation_id?: string;
  /** The trainer operation submitted or polled, or the sampler route's name. */
  op?: string;
  headers: {
    auth: 'bearer' | 'api-key' | 'none';
    idempotency_key?: string;
    min_policy_version?: string;
    affinity_key?: string;
  };
  /** The request body, shortened: long arrays and strings are cut, with the count left out said. */
  body?: unknown;
  /** What the answer said that clients act on: error type, operation status and class, policy version. */
  response?: {
    error_type?: string;
    /** The error's message, cut to 300 characters: what the server log prints beside a refused request. */
    error_message?: string;
    operation_status?: string;
    error_class?: string;
    policy_version?: number;
    retry_after?: string;
  };
  /** The host the client addressed, when it was not this server (proxy mode: api.baseten.co, model-....api.baseten.co, huggingface.co, or a refused one). */
  host?: string;
  /** Proxy surface only: what the proxy did, the port asked for, and why it failed when it did (e.g. a client that does not trust the CA). */
  proxy?: { action: ProxyAction; port: number; error?: string };
  /** The fault rule that acted on this request, and how. */
  fault?: { id: string; action: string };
  /** With journal detail `full` only: the whole JSON answer. */
  response_body?: unknown;
}

/** `summary`: bodies cut to a few items (the default); `full`: whole request and response bodies (the conformance suite reads them). */
export type JournalDetail = 'summary' | 'full';

export interface JournalQuery {
  surface?: Surface;
  run_id?: string;
  sampler_id?: string;
  since?: number;
  limit?: number;
}

/**
 * Every request the server answered, in arrival order: a ring buffer of the
 * newest `capacity` entries, optionally also appended to a file as NDJSON.
 */
/** With detail `full`: an entry whose JSON passes this keeps its bodies summarised, as in `summary`. */
export const FULL_ENTRY_LIMIT_CHARS = 2 ** 20;
/** With detail `full`: what all kept entries may hold together; the oldest go first beyond it. */
export const FULL_JOURNAL_BUDGET_CHARS = 64 * 2 ** 20;

export class Journal {
  private entries: JournalEntry[] = [];
  /** With detail `full`: each kept entry's JSON length, and their total. */
  private readonly sizes = new WeakMap<JournalEntry, number>();
  private chars = 0;
  private nextSeq = 1;
  /** Entries the ring buffer let go of, oldest first. */
  private dropped = 0;
  private readonly listeners: ((entry: JournalEntry) => void)[] = [];
  /** Lines the journal file refused (a full disk, a removed folder): counted, told once (core.onStorageNotice). */
  readonly fileFailures: BackgroundWriteFailures;

  constructor(
    private readonly capacity: number,
    private readonly file?: string,
    readonly detail: JournalDetail = 'summary',
  ) {
    this.fileFailures = new BackgroundWriteFailures(`The journal file ${file ?? ''}`);
  }

  /** A body as this journal keeps it. */
  keep(body: unknown): unknown {
    return this.detail === 'full' ? body : summarize(body);
  }

  /** Reserves the next sequence number at a request's arrival. */
  arrive(): number {
    return this.nextSeq++;
  }

  /** Called with every entry as it is recorded (the server log prints one line per request from it). */
  onRecord(listener: (entry: JournalEntry) => void): void {
    this.listeners.push(listener);
  }

  /** Records a finished request; its place is its arrival order. */
  record(entry: JournalEntry): void {
    for (const listener of this.listeners) listener(entry);
    let text: string | undefined;
    if (this.detail === 'full') {
      // Whole bodies are kept, within bounds: one huge body is summarised, and the total is held to a budget.
      text = JSON.stringify(entry);
      if (text.length > FULL_ENTRY_LIMIT_CHARS) {
        if (entry.body !== undefined) entry.body = summarize(entry.body);
        if (entry.response_body !== undefined) entry.response_body = summarize(entry.response_body);
        text = JSON.stringify(entry);
      }
      this.sizes.set(entry, text.length);
      this.chars += text.length;
    }
    // Finishing order differs from arrival order only for requests that overlapped: insert from the back.
    let at = this.entries.length;
    while (at > 0 && this.entries[at - 1]!.seq > entry.seq) at--;
    this.entries.splice(at, 0, entry);
    let over = Math.max(0, this.entries.length - this.capacity);
    if (this.detail === 'full') {
      let chars = this.chars;
      for (let i = 0; i < over; i++) chars -= this.sizes.get(this.entries[i]!) ?? 0;
      while (chars > FULL_JOURNAL_BUDGET_CHARS && over < this.entries.length - 1) chars -= this.sizes.get(this.entries[over++]!) ?? 0;
      this.chars = chars;
    }
    if (over > 0) {
      this.entries.splice(0, over);
      this.dropped += over;
    }
    if (this.file) {
      try {
        appendWholeLine(this.file, `${text ?? JSON.stringify(entry)}\n`);
        this.fileFailures.succeeded();
      } catch (err) {
        // A journal file that cannot be written must never fail the request it records (already answered).
        this.fileFailures.failed(err);
      }
    }
  }

  query(q: JournalQuery): JournalEntry[] {
    const out: JournalEntry[] = [];
    const limit = q.limit ?? Infinity;
    for (const e of this.entries) {
      if (q.since !== undefined && e.seq <= q.since) continue;
      if (q.surface !== undefined && e.surface !== q.surface) continue;
      if (q.run_id !== undefined && e.run_id !== q.run_id) continue;
      if (q.sampler_id !== undefined && e.sampler_id !== q.sampler_id) continue;
      out.push(e);
      if (out.length >= limit) break;
    }
    return out;
  }

  get evicted(): number {
    return this.dropped;
  }

  get size(): number {
    return this.entries.length;
  }

  clear(): void {
    this.entries = [];
    this.dropped = 0;
    this.chars = 0;
  }
}

/** Appends a line, or nothing: a write cut short (a full disk) is cut back off, so the NDJSON never holds half a line. */
function appendWholeLine(file: string, line: string): void {
  const bytes = Buffer.from(line);
  const fd = openSync(file, 'a');
  try {
    const size = fstatSync(fd).size;
    try {
      for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at, bytes.length - at);
    } catch (err) {
      ftruncateSync(fd, size);
      throw err;
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * A bounded copy of a body for the journal: arrays beyond `items` entries and
 * strings beyond `chars` characters are cut and say how much was left out.
 */
export function summarize(value: unknown, items = 8, chars = 200, depth = 5): unknown {
  if (typeof value === 'string') return value.length > chars ? `${value.slice(0, chars)}…(+${value.length - chars} chars)` : value;
  if (value === null || typeof value !== 'object') return value;
  if (depth <= 0) return Array.isArray(value) ? `[${value.length} items]` : '{…}';
  if (Array.isArray(value)) {
    const head = value.slice(0, items).map((v) => summarize(v, items, chars, depth - 1));
    return value.length > items ? [...head, `…(+${value.length - items} items)`] : head;
  }
  return Object.fromEntries(Object.entries(value as Record<string, unknown>).map(([k, v]) => [k, summarize(v, items, chars, depth - 1)]));
}
