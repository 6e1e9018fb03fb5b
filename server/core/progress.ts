import type { Clock } from './clock.js';
import { invalid, notFound } from './errors.js';

export type ProgressMode = 'immediate' | 'after_polls' | 'after_ms' | 'manual';
export const PROGRESS_MODES: readonly ProgressMode[] = ['immediate', 'after_polls', 'after_ms', 'manual'];

export interface ProgressRuleInput {
  match?: { op?: string | string[]; run_id?: string };
  /** immediate: as soon as computed (the default); after_polls: on its Nth poll; after_ms: T ms after submission; manual: when released. */
  mode: ProgressMode;
  polls?: number;
  ms?: number;
  /** Applies to the next N operations it matches, then is spent. Absent: every one. */
  times?: number;
  description?: string;
}

export interface ProgressRule extends ProgressRuleInput {
  id: string;
  /** Operations it held so far. */
  applied: number;
  remaining: number | null;
}

/** What holds one operation's result back, and how to let it go. */
export interface Hold {
  rule: string;
  mode: ProgressMode;
  polls: number;
  pollsSeen: number;
  released: Promise<void>;
  isReleased: boolean;
  release(): void;
}

/**
 * Operation progress rules: hold an operation's result (computed or not)
 * until its Nth poll, a time after submission, or an explicit release, so a
 * client meets many long-poll windows on demand.
 */
export class Progress {
  private rules: ProgressRule[] = [];
  private counter = 0;

  constructor(private readonly clock: Clock) {}

  add(input: ProgressRuleInput): ProgressRule {
    if (input.mode === 'after_polls' && !(input.polls !== undefined && input.polls >= 1))
      throw invalid('mode after_polls needs polls (at least 1): the poll that releases the result.', { field: 'polls' });
    if (input.mode === 'after_ms' && input.ms === undefined)
      throw invalid('mode after_ms needs ms: how long after submission the result is released.', { field: 'ms' });
    const rule: ProgressRule = { ...input, id: `progress_${++this.counter}`, applied: 0, remaining: input.times ?? null };
    this.rules.push(rule);
    return structuredClone(rule);
  }

  list(): ProgressRule[] {
    return structuredClone(this.rules);
  }

  remove(id: string): ProgressRule {
    const at = this.rules.findIndex((r) => r.id === id);
    if (at < 0) throw notFound(`No progress rule '${id}'. GET /_mock/progress lists them.`, { field: 'rule_id' });
    return this.rules.splice(at, 1)[0]!;
  }

  clear(): number {
    const n = this.rules.length;
    this.rules = [];
    return n;
  }

  /**
   * The hold for a new operation, from the first rule that matches it; none means it completes as soon as computed.
   * `namedOnly`: only rules that name `op` match (a deployment's start is held by rules that ask for it, never by
   * a rule meant for every operation).
   */
  holdFor(runId: string, op: string, namedOnly = false): Hold | undefined {
    const rule = this.rules.find(
      (r) =>
        r.remaining !== 0 &&
        (r.match?.run_id === undefined || r.match.run_id === runId) &&
        (r.match?.op === undefined ? !namedOnly : (Array.isArray(r.match.op) ? r.match.op : [r.match.op]).includes(op)),
    );
    if (!rule) return undefined;
    rule.applied++;
    if (rule.remaining !== null) rule.remaining--;
    if (rule.mode === 'immediate') return undefined;
    let release!: () => void;
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const hold: Hold = {
      rule: rule.id,
      mode: rule.mode,
      polls: rule.polls ?? 0,
      pollsSeen: 0,
      released,
      isReleased: false,
      release: () => {
        hold.isReleased = true;
        release();
      },
    };
    if (rule.mode === 'after_ms') this.clock.setTimer(rule.ms!, hold.release);
    return hold;
  }
}
