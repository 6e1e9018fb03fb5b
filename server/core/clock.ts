/**
 * Time as the core sees it. Every timeout, cold start and expiry reads this
 * clock and schedules through it, so tests (and later `--clock virtual`) can
 * move time by hand instead of sleeping.
 */
export interface Timer {
  cancel(): void;
}

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Runs `fn` once, `delayMs` from now. */
  setTimer(delayMs: number, fn: () => void): Timer;
}

export class RealClock implements Clock {
  now(): number {
    return Date.now();
  }

  setTimer(delayMs: number, fn: () => void): Timer {
    // unref: a pending idle timeout must never keep the process alive.
    const handle = setTimeout(fn, Math.max(0, delayMs));
    handle.unref();
    return { cancel: () => clearTimeout(handle) };
  }
}

interface PendingTimer {
  at: number;
  seq: number;
  fn: () => void;
  cancelled: boolean;
}

/** A clock that only moves when told to; timers fire in time order during `advance`. */
export class ManualClock implements Clock {
  private current: number;
  private seq = 0;
  private pending: PendingTimer[] = [];

  constructor(startMs = Date.parse('2026-01-01T00:00:00Z')) {
    this.current = startMs;
  }

  now(): number {
    return this.current;
  }

  setTimer(delayMs: number, fn: () => void): Timer {
    const timer: PendingTimer = { at: this.current + Math.max(0, delayMs), seq: this.seq++, fn, cancelled: false };
    this.pending.push(timer);
    return {
      cancel: () => {
        timer.cancelled = true;
      },
    };
  }

  /** Moves time forward by `ms`, firing every timer that falls due on the way, each at its own time. */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`advance needs a non-negative number of milliseconds, got ${ms}`);
    const target = this.current + ms;
    for (;;) {
      this.pending = this.pending.filter((t) => !t.cancelled);
      const due = this.pending.filter((t) => t.at <= target).sort((a, b) => a.at - b.at || a.seq - b.seq)[0];
      if (!due) break;
      this.pending.splice(this.pending.indexOf(due), 1);
      this.current = Math.max(this.current, due.at);
      due.fn();
    }
    this.current = target;
  }
}
