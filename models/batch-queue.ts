/** What a schedule sees of a queue: how much waits, and how to run the next batch. */
export interface Batches {
  readonly size: number;
  runBatch(): Promise<void>;
}

/** Decides when batches run; called on every push. */
export type BatchSchedule = (queue: Batches) => void;

export interface BatchQueueOptions<T, R> {
  /** Requests of one key may share a batch; others wait for a batch of their own. */
  keyOf: (request: T) => string;
  maxBatch: number;
  /** Whether `next` may join the requests already taken for a batch (default: any may); one that may not waits for a later batch. */
  fits?: (taken: T[], next: T) => boolean;
  /** Computes one batch: one result per request, in order. */
  run: (batch: T[]) => Promise<R[]>;
  schedule: BatchSchedule;
}

/**
 * Gathers requests that arrive while earlier ones compute, and runs them in
 * batches: the oldest request with the next ones of its key, oldest first.
 */
export class BatchQueue<T, R> implements Batches {
  private pending: { request: T; resolve: (r: R) => void; reject: (e: Error) => void }[] = [];

  constructor(private readonly options: BatchQueueOptions<T, R>) {}

  get size(): number {
    return this.pending.length;
  }

  push(request: T): Promise<R> {
    return new Promise((resolve, reject) => {
      this.pending.push({ request, resolve, reject });
      this.options.schedule(this);
    });
  }

  /**
   * Runs one batch of the oldest request's key (nothing if none waits): the next ones of that key that fit,
   * in order. A batch of several that fails is run again one request at a time, so that a request that
   * fails alone gets its own error and the others their results.
   */
  async runBatch(): Promise<void> {
    const head = this.pending[0];
    if (!head) return;
    const { keyOf, maxBatch, run, fits } = this.options;
    const key = keyOf(head.request);
    const batch: typeof this.pending = [];
    for (const p of this.pending) {
      if (batch.length === maxBatch) break;
      if (keyOf(p.request) !== key) continue;
      if (
        batch.length &&
        fits &&
        !fits(
          batch.map((b) => b.request),
          p.request,
        )
      )
        continue;
      batch.push(p);
    }
    this.pending = this.pending.filter((p) => !batch.includes(p));
    try {
      const results = await run(batch.map((p) => p.request));
      batch.forEach((p, i) => {
        p.resolve(results[i]!);
      });
    } catch (err) {
      if (batch.length === 1) batch[0]!.reject(err as Error);
      else
        for (const p of batch)
          await run([p.request]).then(
            ([r]) => p.resolve(r!),
            (e: Error) => p.reject(e),
          );
    }
  }
}

/**
 * Runs batches from the next turn of the event loop until none waits; each
 * first waits up to `waitMs` (1 ms at a time) while fewer requests wait than
 * `expected()`, so that requests about to come join it. `gaveUp` is told when
 * a wait ran out with fewer than expected: those did not come.
 */
export function flushSoon(expected: () => number, waitMs: number, gaveUp?: () => void): BatchSchedule {
  let flushing = false;
  return (queue) => {
    if (flushing) return;
    flushing = true;
    setImmediate(async () => {
      while (queue.size) {
        let waited = 0;
        for (; queue.size < expected() && waited < waitMs; waited++) await new Promise((r) => setTimeout(r, 1));
        if (waited === waitMs && queue.size < expected()) gaveUp?.();
        await queue.runBatch();
      }
      flushing = false;
    });
  };
}
