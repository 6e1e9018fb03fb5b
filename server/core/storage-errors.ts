import { LoopsError } from './errors.js';

/**
 * A write the data dir refused: the filesystem is full (SQLITE_FULL, ENOSPC,
 * EDQUOT) or failed the I/O (SQLITE_IOERR_*, EIO, EROFS). Front doors answer
 * it 507 `insufficient_storage`; an operation that hits it ends with this
 * name as its error_class. Nothing the failed write carried was kept.
 */
export class StorageError extends LoopsError {
  constructor(message: string, details: Record<string, unknown>) {
    super('insufficient_storage', message, details);
    this.name = 'InsufficientStorage';
  }
}

const FULL_CODES = new Set(['SQLITE_FULL', 'ENOSPC', 'EDQUOT']);
const IO_CODES = new Set(['EIO', 'EROFS']);

/** The error code of a failed disk write, or undefined for any other error (those stay bugs, never a 507). */
export function diskErrorCode(err: unknown): string | undefined {
  if (err instanceof StorageError) return String(err.details.code);
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return undefined;
  if (FULL_CODES.has(code) || IO_CODES.has(code) || code.startsWith('SQLITE_IOERR')) return code;
  return undefined;
}

/**
 * `err` as the StorageError a client is answered with when it is a disk
 * failure (`what`: what was not saved, e.g. "the checkpoint 'step-3'"; a
 * StorageError is told again with this `what`), else `err` unchanged.
 */
export function asStorageError(err: unknown, where: string, what: string): unknown {
  const code = diskErrorCode(err);
  if (code === undefined) return err;
  const full = FULL_CODES.has(code);
  const cause = full ? 'is out of space' : 'failed a write';
  const fix = full
    ? 'Free space on that filesystem (or start with another --data-dir); the next write succeeds as soon as there is room, no restart needed.'
    : 'Check that filesystem (dmesg, mount options); the next write is tried afresh.';
  return new StorageError(`The data dir ${where} ${cause} (${code}): ${what} was not saved, and nothing of it was kept. ${fix}`, {
    code,
    data_dir: where,
    reason: full ? 'disk_full' : 'io_error',
  });
}

/**
 * Failures of writes nobody waits for (a request's log line after its answer
 * went out, a journal file line): counted, and told once when they start and
 * once when writes work again, never per line.
 */
export class BackgroundWriteFailures {
  private count = 0;
  private failing = false;
  private lastError: string | undefined;

  /** @param tell where the two notices go (the server log) */
  constructor(
    private readonly what: string,
    private tell: (level: 'warn' | 'info', message: string) => void = () => undefined,
  ) {}

  /** Where notices go from now on (the server log, once it exists). */
  tellTo(tell: (level: 'warn' | 'info', message: string) => void): void {
    this.tell = tell;
  }

  failed(err: unknown): void {
    this.count++;
    this.lastError = (err as Error)?.message ?? String(err);
    if (this.failing) return;
    this.failing = true;
    this.tell('warn', `${this.what} could not be written (${this.lastError}); further failures are counted, not logged, until writes work again.`);
  }

  succeeded(): void {
    if (!this.failing) return;
    this.failing = false;
    this.tell('info', `${this.what} is written again; ${this.count} line(s) failed in all so far.`);
  }

  get failures(): number {
    return this.count;
  }

  get isFailing(): boolean {
    return this.failing;
  }

  get lastMessage(): string | undefined {
    return this.lastError;
  }
}
