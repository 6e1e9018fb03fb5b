import { createHash, randomUUID } from 'node:crypto';
import type { Clock } from './clock.js';
import { conflict, notFound } from './errors.js';
import type { Hold, Progress } from './progress.js';

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
  constructor(
    readonly errorClass: string,
    message: string,
  ) {
    super(message);
  }
}

export type WaitOutcome = 'done' | 'timeout' | 'shutdown';

interface Entry {
  op: Operation;
  key?: string;
  bodyHash?: string;
  waiters: Set<(outcome: WaitOutcome) => void>;
  /** A progress rule holding the result back (see progress.ts). */
  hold?: Hold;
}

export interface OperationOptions {
  /** How long a finished operation's result stays retrievable. */
  operationTtlMs: number;
}

/** An operation whose result a progress rule is holding back. */
export interface HeldOperation {
  operation_id: string;
  run_id: string;
  op: string;
  status: OperationStatus;
  rule: string;
  mode: string;
  polls_seen: number;
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
  private readonly finishListeners: ((operation: Operation) => void)[] = [];

  constructor(
    private readonly clock: Clock,
    private readonly options: OperationOptions,
    private readonly progress: Progress,
  ) {}

  /** Told of every operation as it finishes, done or error (the run history the dashboard charts). */
  onFinish(listener: (operation: Operation) => void): void {
    this.finishListeners.push(listener);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * Queues `work` behind the run's earlier operations, or returns the
   * operation an idempotency key already names. A progress rule may hold its
   * result back; the run's next operation waits for it, as behind a slow one.
   */
  submit(runId: string, op: string, body: unknown, idempotencyKey: string | undefined, work: (operation: Operation) => Promise<unknown>): Operation {
    this.sweep();
    const bodyHash = createHash('sha256')
      .update(`${op}\n${JSON.stringify(body)}`)
      .digest('hex');
    const keyId = idempotencyKey === undefined ? undefined : `${runId}\n${idempotencyKey}`;
    if (keyId) {
      const prior = this.byKey.get(keyId);
      if (prior) {
        if (prior.bodyHash !== bodyHash) {
          throw conflict(
            `Idempotency-Key '${idempotencyKey}' was already used for a different ${prior.op.op} request on this run (operation ${prior.op.id}); use a new key for a new request.`,
            { field: 'Idempotency-Key', operation_id: prior.op.id },
          );
        }
        return prior.op;
      }
    }
    const operation: Operation = { id: randomUUID(), runId, op, status: 'queued', submittedAt: this.clock.now() };
    const entry: Entry = { op: operation, key: keyId, bodyHash, waiters: new Set(), hold: this.progress.holdFor(runId, op) };
    this.entries.set(operation.id, entry);
    if (keyId) this.byKey.set(keyId, entry);
    const previous = this.chains.get(runId) ?? Promise.resolve();
    const next = previous.then(async () => {
      if (operation.status !== 'queued') return;
      operation.status = 'running';
      let outcome: { result: unknown } | { failure: OperationFailure };
      try {
        outcome = { result: await work(operation) };
      } catch (err) {
        outcome = {
          failure:
            err instanceof OperationFailure
              ? err
              : new OperationFailure(
                  (err as Error)?.name && (err as Error).name !== 'Error' ? (err as Error).name : 'RuntimeError',
                  (err as Error)?.message ?? String(err),
                ),
        };
      }
      if (entry.hold) await entry.hold.released;
      if ('result' in outcome) this.finish(entry, 'done', outcome.result);
      else this.finish(entry, 'error', undefined, { message: outcome.failure.message, error_class: outcome.failure.errorClass });
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

  /** Any run's operation by id (the admin API releases held ones). */
  find(id: string): Operation | undefined {
    this.sweep();
    return this.entries.get(id)?.op;
  }

  /** Counts a poll of a held operation; the poll a rule names releases it. */
  notePoll(op: Operation): void {
    const hold = this.entries.get(op.id)?.hold;
    if (!hold || hold.isReleased) return;
    hold.pollsSeen++;
    if (hold.mode === 'after_polls' && hold.pollsSeen >= hold.polls) hold.release();
  }

  /** Releases a held operation's result now. */
  release(id: string): Operation {
    const entry = this.entries.get(id);
    if (!entry) throw notFound(`No operation '${id}': unknown or expired.`, { field: 'operation_id' });
    if (!entry.hold || entry.hold.isReleased)
      throw conflict(`Operation ${id} is not held by a progress rule (its status is ${entry.op.status}).`, { field: 'operation_id' });
    entry.hold.release();
    return entry.op;
  }

  /** Operations whose results are held back now. */
  held(): HeldOperation[] {
    const out: HeldOperation[] = [];
    for (const { op, hold } of this.entries.values()) {
      if (hold && !hold.isReleased && (op.status === 'queued' || op.status === 'running')) {
        out.push({ operation_id: op.id, run_id: op.runId, op: op.op, status: op.status, rule: hold.rule, mode: hold.mode, polls_seen: hold.pollsSeen });
      }
    }
    return out;
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
    return {
      outcome,
      cancel: () => {
        entry.waiters.delete(waiter);
        timer?.cancel();
      },
    };
  }

  /** Fails every queued or running operation of a run (its trainer stopped). */
  failPending(runId: string, errorClass: string, message: string): void {
    for (const entry of this.entries.values()) {
      if (entry.op.runId === runId && (entry.op.status === 'queued' || entry.op.status === 'running')) {
        this.finish(entry, 'error', undefined, { message, error_class: errorClass });
      }
    }
  }

  /**
   * Stops taking work: long polls are woken with 'shutdown' (a 503, on
   * which the SDK raises ServerShutdownError) and later waits answer the same
   * at once; queued operations fail with ServerShutdown and are never run,
   * so nothing of them is written; a running one goes on to its end (drain()
   * waits for it) and held results are let go.
   */
  shutdown(): void {
    this.closed = true;
    const waiting = [...this.entries.values()].flatMap((entry) => [...entry.waiters]);
    for (const entry of this.entries.values()) {
      if (entry.op.status === 'queued')
        this.finish(
          entry,
          'error',
          undefined,
          {
            message: `loops-mock shut down before ${entry.op.op} ran: nothing of it was done. Submit it again to a running server.`,
            error_class: 'ServerShutdown',
          },
          false,
        );
      entry.hold?.release();
    }
    for (const w of waiting) w('shutdown');
  }

  /** Resolves once every operation that was running has finished (and so written what it writes). */
  async drain(): Promise<void> {
    await Promise.all([...this.chains.values()].map((c) => c.catch(() => undefined)));
  }

  private finish(entry: Entry, status: 'done' | 'error', result?: unknown, error?: OperationError, wake = true): void {
    // A run stopped mid-operation already failed it; the late result is dropped.
    if (entry.op.status === 'done' || entry.op.status === 'error') return;
    entry.op.status = status;
    entry.op.result = result;
    entry.op.error = error;
    entry.op.finishedAt = this.clock.now();
    this.finished.push(entry);
    for (const listener of this.finishListeners) listener(entry.op);
    if (wake) for (const w of [...entry.waiters]) w('done');
  }

  /** Forgets results past retention, with their idempotency keys: only the expired ones are touched. */
  private sweep(): void {
    const cutoff = this.clock.now() - this.options.operationTtlMs;
    let expired = 0;
    while (expired < this.finished.length && this.finished[expired]!.op.finishedAt! < cutoff) {
      const entry = this.finished[expired++]!;
      this.entries.delete(entry.op.id);
      if (entry.key) this.byKey.delete(entry.key);
    }
    if (expired) this.finished.splice(0, expired);
  }
}
