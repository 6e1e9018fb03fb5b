import { createHash } from 'node:crypto';

/** Distinct wrong admin tokens one client address may try in a window before it must wait. */
export const WRONG_TOKENS_PER_WINDOW = 10;
export const ATTEMPT_WINDOW_MS = 60_000;
/** Addresses remembered at most; the oldest are forgotten first (a flood of addresses cannot grow memory). */
const MAX_ADDRESSES = 10_000;

/**
 * Wrong admin tokens per client address, so that guessing the token is slow:
 * past WRONG_TOKENS_PER_WINDOW distinct wrong tokens within ATTEMPT_WINDOW_MS,
 * every attempt from that address (the right token too, or a guess could still
 * be told apart) waits until the oldest of them leaves the window. The same
 * wrong token sent again counts once: a dashboard still polling with the cookie
 * of an earlier server does not lock its own user out. Wall-clock time (not the
 * server's clock, which --clock virtual stops), injectable for tests.
 */
export class TokenAttempts {
  private readonly wrong = new Map<string, Map<string, number>>();

  constructor(
    private readonly now: () => number = () => performance.now(),
    readonly limit = WRONG_TOKENS_PER_WINDOW,
    readonly windowMs = ATTEMPT_WINDOW_MS,
  ) {}

  /** Seconds until `address` may try a token again; 0 when it may now. */
  waitSeconds(address: string): number {
    const tried = this.current(address);
    if (!tried || tried.size < this.limit) return 0;
    const oldest = Math.min(...tried.values());
    return Math.max(1, Math.ceil((oldest + this.windowMs - this.now()) / 1000));
  }

  /** Counts a wrong token from `address`. */
  recordWrong(address: string, token: string): void {
    const tried = this.current(address) ?? new Map<string, number>();
    const digest = createHash('sha256').update(token).digest('base64');
    if (!tried.has(digest)) tried.set(digest, this.now());
    this.wrong.delete(address);
    this.wrong.set(address, tried);
    if (this.wrong.size > MAX_ADDRESSES) this.wrong.delete(this.wrong.keys().next().value!);
  }

  /** The address's wrong tokens still in the window (older ones dropped). */
  private current(address: string): Map<string, number> | undefined {
    const tried = this.wrong.get(address);
    if (!tried) return undefined;
    const since = this.now() - this.windowMs;
    for (const [digest, at] of tried) if (at <= since) tried.delete(digest);
    if (tried.size === 0) {
      this.wrong.delete(address);
      return undefined;
    }
    return tried;
  }
}
