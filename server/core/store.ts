import { chmodSync, closeSync, mkdirSync, openSync } from 'node:fs';
import { join } from 'node:path';
import type { LogLevel, LogRecord } from './records.js';
import { LOG_LEVELS } from './records.js';
import { openDatabase, SqliteUnavailableError, type SqlDatabase, type SqlStatement } from './sqlite.js';
import { asStorageError, BackgroundWriteFailures, StorageError } from './storage-errors.js';

/**
 * The data dir cannot be used as it is (an unreadable database, a broken
 * record, checkpoint folders without their database): the start stops with
 * this one line, which names the file, what is wrong and the way out.
 */
export class DataDirError extends Error {
  override readonly name = 'DataDirError';
}

/** The two ways past a data dir that cannot be used (server/core/data-dir.ts); neither deletes anything. */
export const WAYS_OUT =
  "Start with --rebuild-records to set the database aside and rebuild the checkpoints' records from their folders, or with --data-dir-fresh to set the database and checkpoints aside and start empty (nothing is deleted).";

function unreadableDatabase(file: string, err: unknown): DataDirError {
  return new DataDirError(`${file} cannot be read as a loops-mock database: ${(err as Error).message}. ${WAYS_OUT}`);
}

export type RecordKind = 'org' | 'team' | 'user' | 'session' | 'run' | 'deployment' | 'sampler' | 'checkpoint' | 'user_config' | 'model_deployment';

/** The newest log lines kept per deployment (what GET .../logs can page through). */
export const LOGS_PER_DEPLOYMENT = 10_000;
const LOG_TRIM_EVERY = 500;

export interface LogQuery {
  deploymentId: string;
  startMs?: number;
  endMs?: number;
  direction: 'asc' | 'desc';
  limit: number;
  minLevel?: LogLevel;
  /** Only lines of replicas whose name starts so (`sampler` for a sampler's own lines). */
  replicaPrefix?: string;
}

/**
 * Durable record storage on SQLite: in memory without a data dir, a file in it
 * with one. Records are JSON documents keyed by (kind, id); every write is its
 * own transaction, or part of a caller's `transaction`, so a crash never
 * leaves half a change behind. A write the disk refuses (full, I/O error)
 * throws a StorageError (507) and leaves the database as it was; the next
 * write is tried afresh, so writes resume by themselves once there is room.
 */
export class Store {
  readonly file: string;
  private readonly db: SqlDatabase;
  private readonly upsert: SqlStatement;
  private readonly insertLog: SqlStatement;
  private readonly trimLogs: SqlStatement;
  /** Lines written per deployment since its last trim: every LOG_TRIM_EVERY lines its oldest beyond LOGS_PER_DEPLOYMENT go. */
  private readonly sinceTrim = new Map<string, number>();
  private writes = 0;
  /** Writes the disk refused (full, I/O error), and whether the latest write was one. */
  private refused = 0;
  private lastWriteRefused = false;
  private bestEffortDepth = 0;
  /** Where messages say the disk failed. */
  private readonly where: string;
  /** Writes nobody waited for that failed (log lines after their request was answered, timed status changes). */
  readonly background: BackgroundWriteFailures;

  /** @param tell where the background failures' two notices go (the server log) */
  constructor(dataDir?: string, tell?: (level: 'warn' | 'info', message: string) => void) {
    this.where = dataDir ?? '(memory)';
    this.background = new BackgroundWriteFailures(`A background write to the data dir ${this.where}`, tell);
    this.file = dataDir ? join(dataDir, 'loops-mock.sqlite') : ':memory:';
    if (dataDir) {
      // Owner-only: the database holds the presign secret. SQLite gives its -wal and -shm files the database's mode.
      mkdirSync(dataDir, { recursive: true, mode: 0o700 });
      chmodSync(dataDir, 0o700);
      closeSync(openSync(this.file, 'a', 0o600));
      chmodSync(this.file, 0o600);
    }
    try {
      this.db = openDatabase(this.file);
    } catch (err) {
      throw err instanceof SqliteUnavailableError ? err : unreadableDatabase(this.file, err);
    }
    try {
      if (dataDir) {
        this.db.exec('PRAGMA journal_mode = WAL');
        this.db.exec('PRAGMA synchronous = FULL');
      }
      this.db.exec(`
        CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, id TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (kind, id));
        CREATE TABLE IF NOT EXISTS logs (
          seq INTEGER PRIMARY KEY AUTOINCREMENT, deployment_id TEXT NOT NULL, ts_ms INTEGER NOT NULL,
          level TEXT NOT NULL, level_rank INTEGER NOT NULL, message TEXT NOT NULL, replica TEXT, request_id TEXT);
        CREATE INDEX IF NOT EXISTS logs_by_deployment ON logs (deployment_id, ts_ms);
        CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
      `);
    } catch (err) {
      this.db.close();
      throw unreadableDatabase(this.file, err);
    }
    this.upsert = this.db.prepare('INSERT INTO records (kind, id, data) VALUES (?, ?, ?) ON CONFLICT (kind, id) DO UPDATE SET data = excluded.data');
    this.insertLog = this.db.prepare('INSERT INTO logs (deployment_id, ts_ms, level, level_rank, message, replica, request_id) VALUES (?, ?, ?, ?, ?, ?, ?)');
    this.trimLogs = this.db.prepare(
      'DELETE FROM logs WHERE deployment_id = ? AND seq <= (SELECT seq FROM logs WHERE deployment_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)',
    );
  }

  /**
   * Counts every write. Every change to a record reaches the store (persistence needs it), so while this
   * number stands still an answer built from records and log lines is still true: front doors may keep one.
   */
  get version(): number {
    return this.writes;
  }

  get durable(): boolean {
    return this.file !== ':memory:';
  }

  /** Reads every record once: a DataDirError for the first that cannot be read (what the start would stop on). */
  checkRecords(): void {
    let rows: { kind: string; id: string; data: string }[];
    try {
      rows = this.db.prepare('SELECT kind, id, data FROM records').all() as { kind: string; id: string; data: string }[];
    } catch (err) {
      throw unreadableDatabase(this.file, err);
    }
    for (const r of rows) {
      try {
        JSON.parse(r.data);
      } catch (err) {
        throw new DataDirError(`${this.file}: the ${r.kind} record ${r.id} is not JSON (${(err as Error).message}). ${WAYS_OUT}`);
      }
    }
  }

  /** Every record of a kind; a database or record that cannot be read stops the start with a DataDirError. */
  load<T>(kind: RecordKind): T[] {
    let rows: { id: string; data: string }[];
    try {
      rows = this.db.prepare('SELECT id, data FROM records WHERE kind = ? ORDER BY rowid').all(kind) as { id: string; data: string }[];
    } catch (err) {
      throw unreadableDatabase(this.file, err);
    }
    return rows.map((r) => {
      try {
        return JSON.parse(r.data) as T;
      } catch (err) {
        throw new DataDirError(`${this.file}: the ${kind} record ${r.id} is not JSON (${(err as Error).message}). ${WAYS_OUT}`);
      }
    });
  }

  put(kind: RecordKind, id: string, value: unknown): void {
    this.writes++;
    const data = JSON.stringify(value);
    try {
      this.guard(`the ${kind} record ${id}`, () => this.upsert.run(kind, id, data));
    } catch (err) {
      if (!(err instanceof StorageError) || this.bestEffortDepth === 0 || this.db.inTransaction) throw err;
      this.background.failed(err);
    }
  }

  /**
   * Runs `fn`, whose writes nobody waits on and which must carry on in
   * memory whatever the disk says (a start stopping what was left running):
   * a record write refused there is counted as a background failure, not
   * thrown. Not for use inside a transaction.
   */
  bestEffort(fn: () => void): void {
    this.bestEffortDepth++;
    try {
      fn();
    } finally {
      this.bestEffortDepth--;
    }
  }

  /** Runs `fn` atomically: all of its writes land, or none (a refused commit rolls all of them back). */
  transaction<T>(fn: () => T): T {
    return this.guard('this change', () => this.db.transaction(fn));
  }

  /** Inside a `transaction`: a failed write there fails all of it, so callers must not swallow one. */
  get inTransaction(): boolean {
    return this.db.inTransaction;
  }

  appendLog(log: LogRecord): void {
    this.writes++;
    this.guard(`the log line of deployment ${log.deployment_id}`, () =>
      this.insertLog.run(log.deployment_id, log.ts_ms, log.level, LOG_LEVELS.indexOf(log.level), log.message, log.replica, log.request_id),
    );
    // Every request writes a line: a long-lived deployment keeps its newest LOGS_PER_DEPLOYMENT, trimmed now and then.
    const n = (this.sinceTrim.get(log.deployment_id) ?? 0) + 1;
    if (n < LOG_TRIM_EVERY) {
      this.sinceTrim.set(log.deployment_id, n);
      return;
    }
    this.sinceTrim.set(log.deployment_id, 0);
    this.guard(`the trim of deployment ${log.deployment_id}'s logs`, () => this.trimLogs.run(log.deployment_id, log.deployment_id, LOGS_PER_DEPLOYMENT));
  }

  queryLogs(q: LogQuery): LogRecord[] {
    const where = ['deployment_id = ?'];
    const args: unknown[] = [q.deploymentId];
    if (q.startMs !== undefined) {
      where.push('ts_ms >= ?');
      args.push(q.startMs);
    }
    if (q.endMs !== undefined) {
      where.push('ts_ms <= ?');
      args.push(q.endMs);
    }
    if (q.minLevel) {
      where.push('level_rank >= ?');
      args.push(LOG_LEVELS.indexOf(q.minLevel));
    }
    if (q.replicaPrefix) {
      where.push("replica LIKE ? ESCAPE '\\'");
      args.push(`${q.replicaPrefix.replace(/[\\%_]/g, (c) => `\\${c}`)}%`);
    }
    const order = q.direction === 'asc' ? 'ASC' : 'DESC';
    const sql = `SELECT deployment_id, ts_ms, level, message, replica, request_id FROM logs WHERE ${where.join(' AND ')}
      ORDER BY ts_ms ${order}, seq ${order} LIMIT ?`;
    return this.db.prepare(sql).all(...args, q.limit) as LogRecord[];
  }

  getMeta(key: string): string | undefined {
    const row = this.db.prepare('SELECT value FROM meta WHERE key = ?').get(key) as { value: string } | undefined;
    return row?.value;
  }

  setMeta(key: string, value: string): void {
    this.writes++;
    this.guard(`the setting ${key}`, () =>
      this.db.prepare('INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value').run(key, value),
    );
  }

  /** Runs one write: a disk failure becomes a StorageError naming the data dir; a success after failures says so once. */
  private guard<T>(what: string, write: () => T): T {
    let out: T;
    try {
      out = write();
    } catch (err) {
      // The innermost write names what failed; a transaction around it passes that on.
      const mapped = err instanceof StorageError ? err : asStorageError(err, this.where, what);
      if (mapped instanceof StorageError && mapped !== err) this.noteRefused();
      throw mapped;
    }
    if (!this.db.inTransaction) {
      this.lastWriteRefused = false;
      this.background.succeeded();
    }
    return out;
  }

  /** A write the disk refused, here or beside the database (a checkpoint's files). */
  noteRefused(): void {
    this.refused++;
    this.lastWriteRefused = true;
  }

  /** What /healthz tells of the data dir: whether the last write went through, and how many the disk refused. */
  get health(): { writable: boolean; refused_writes: number; background_write_failures: number } {
    return { writable: !this.lastWriteRefused, refused_writes: this.refused, background_write_failures: this.background.failures };
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}
