import { createHash, randomUUID } from 'node:crypto';
import type { Clock } from './clock.js';
import { conflict } from './errors.js';

export type OperationStatus = 'queued' | 'running' | 'done' | 'error';

export interface OperationError {
  message: string;
  /** The server-side exception class name; the SDK raises with it. */
  error_class: string;
}

export interface Operation {
  id: string;
  runId: string;
  op: string;
  status: OperationStatus;
  result?: unknown;
  error?: OperationError;
  submittedAt: number;
  finishedAt?: number;
}

/** An error an operation ends with, carrying the exception class the client sees. */
export class OperationFailure extends Error {
  constructor(readonly errorClass: string, message: string) {
    super(message);
  }
}

export type WaitOutcome = 'done' | 'timeout' | 'shutdown';

interface Entry {
  op: Operation;
  key?: string;
  bodyHash?: string;
  waiters: Set<(outcome: WaitOutcome) => void>;
}

export interface OperationOptions {
  /** How long a finished operation's result stays retrievable. */
  ttlMs: number;
}

/**
 * Submit-then-poll operations. Each run executes its operations one at a
 * time in submission order; runs are independent. A result is kept for the
 * retention time, then forgotten (404). The same Idempotency-Key with the
 * same body returns the same operation; with another body, 409.
 */
export class Operations {
  private readonly entries = new Map<string, Entry>();
  private readonly byKey = new Map<string, Entry>();
  private readonly chains = new Map<string, Promise<void>>();
  /** Finished entries in finishing order (the clock only moves forward): expiry pops from the front. */
  private readonly finished: Entry[] = [];
  private closed = false;

  constructor(private readonly clock: Clock, private readonly options: OperationOptions) {}

  get isClosed(): boolean {
    return this.closed;
  }

  /** Queues `work` behind the run's earlier operations, or returns the operation an idempotency key already names. */
  submit(runId: string, op: string, body: unknown, idempotencyKey: string | undefined, work: (operation: Operation) => Promise<unknown>): Operation {
    this.sweep();
    const bodyHash = createHash('sha256').update(`${op}\n${JSON.stringify(body)}`).digest('hex');
    const keyId = idempotencyKey === undefined ? undefined : `${runId}\n${idempotencyKey}`;
    if (keyId) {
      const prior = this.byKey.get(keyId);
      if (prior) {
        if (prior.bodyHash !== bodyHash) {
          throw conflict(`Idempotency-Key '${idempotencyKey}' was already used for a different ${prior.op.op} request on this run (operation ${prior.op.id}); use a new key for a new request.`, { field: 'Idempotency-Key', operation_id: prior.op.id });
        }
        return prior.op;
      }
    }
    const operation: Operation = { id: randomUUID(), runId, op, status: 'queued', submittedAt: this.clock.now() };
    const entry: Entry = { op: operation, key: keyId, bodyHash, waiters: new Set() };
    this.entries.set(operation.id, entry);
    if (keyId) this.byKey.set(keyId, entry);
    const previous = this.chains.get(runId) ?? Promise.resolve();
    const next = previous.then(async () => {
      if (operation.status !== 'queued') return;
      operation.status = 'running';
      try {
        const result = await work(operation);
        this.finish(entry, 'done', result);
      } catch (err) {
        const failure = err instanceof OperationFailure ? err : new OperationFailure((err as Error)?.name && (err as Error).name !== 'Error' ? (err as Error).name : 'RuntimeError', (err as Error)?.message ?? String(err));
        this.finish(entry, 'error', undefined, { message: failure.message, error_class: failure.errorClass });
      }
    });
    this.chains.set(runId, next);
    return operation;
  }

  /** An operation of the run, unless unknown or past retention. */
  get(runId: string, id: string): Operation | undefined {
    this.sweep();
    const entry = this.entries.get(id);
    return entry && entry.op.runId === runId ? entry.op : undefined;
  }

  /** Resolves when the operation finishes, the window passes, or the server shuts down. `cancel` drops the wait (a client gone). */
  wait(op: Operation, windowMs: number): { outcome: Promise<WaitOutcome>; cancel: () => void } {
    const entry = this.entries.get(op.id);
    if (this.closed) return { outcome: Promise.resolve('shutdown'), cancel: () => {} };
    if (!entry || op.status === 'done' || op.status === 'error') return { outcome: Promise.resolve('done'), cancel: () => {} };
    let waiter!: (outcome: WaitOutcome) => void;
    let timer: { cancel(): void } | undefined;
    const outcome = new Promise<WaitOutcome>((resolve) => {
      waiter = (o) => {
        entry.waiters.delete(waiter);
        timer?.cancel();
        resolve(o);
      };
      entry.waiters.add(waiter);
      timer = this.clock.setTimer(windowMs, () => waiter('timeout'));
    });
    return { outcome, cancel: () => { entry.waiters.delete(waiter); timer?.cancel(); } };
  }

  /** Fails every queued or running operation of a run (its trainer stopped). */
  failPending(runId: string, errorClass: string, message: string): void {
    for (const entry of this.entries.values()) {
      if (entry.op.runId === runId && (entry.op.status === 'queued' || entry.op.status === 'running')) {
        this.finish(entry, 'error', undefined, { message, error_class: errorClass });
      }
    }
  }

  /** Wakes every long poll with 'shutdown'; later waits answer the same at once. */
  shutdown(): void {
    this.closed = true;
    for (const entry of this.entries.values()) for (const w of [...entry.waiters]) w('shutdown');
  }

  private finish(entry: Entry, status: 'done' | 'error', result?: unknown, error?: OperationError): void {
    // A run stopped mid-operation already failed it; the late result is dropped.
    if (entry.op.status === 'done' || entry.op.status === 'error') return;
    entry.op.status = status;
    entry.op.result = result;
    entry.op.error = error;
    entry.op.finishedAt = this.clock.now();
    this.finished.push(entry);
    for (const w of [...entry.waiters]) w('done');
  }

  /** Forgets results past retention, with their idempotency keys: only the expired ones are touched. */
  private sweep(): void {
    const cutoff = this.clock.now() - this.options.ttlMs;
    let expired = 0;
    while (expired < this.finished.length && this.finished[expired]!.op.finishedAt! < cutoff) {
      const entry = this.finished[expired++]!;
      this.entries.delete(entry.op.id);
      if (entry.key) this.byKey.delete(entry.key);
    }
    if (expired) this.finished.splice(0, expired);
  }
}
