import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';

/**
 * The SQLite the store runs on. Node's own (`node:sqlite`, built in from Node 22.13, and in 24) where the runtime
 * has it: nothing to compile when loops-mock is installed. Else better-sqlite3 (Node 20), a native addon that
 * npm builds from source offline. One small face over both: what store.ts and data-dir.ts use, with the same
 * SQLite error codes (SQLITE_FULL, SQLITE_IOERR_*, ...) on errors from either, so a full disk reads the same.
 * LOOPS_MOCK_SQLITE=better-sqlite3 picks the addon even where Node has its own (to compare the two).
 */
export type SqliteDriver = 'node:sqlite' | 'better-sqlite3';

export interface SqlStatement {
  run(...params: unknown[]): unknown;
  get(...params: unknown[]): unknown;
  all(...params: unknown[]): unknown[];
}

export interface SqlDatabase {
  readonly driver: SqliteDriver;
  exec(sql: string): void;
  prepare(sql: string): SqlStatement;
  /** Runs `fn` in a transaction (a savepoint when nested): all of its writes land, or none. */
  transaction<T>(fn: () => T): T;
  readonly inTransaction: boolean;
  readonly open: boolean;
  close(): void;
}

export interface OpenOptions {
  /** Refuse a file that is not there (never create one). */
  mustExist?: boolean;
  readonly?: boolean;
}

/** Thrown when neither SQLite is at hand: names the runtime and the two ways to get one. */
export class SqliteUnavailableError extends Error {
  override readonly name = 'SqliteUnavailableError';
}

interface NodeSqlite {
  DatabaseSync: new (
    file: string,
    options?: { readOnly?: boolean },
  ) => {
    exec(sql: string): void;
    prepare(sql: string): SqlStatement;
    close(): void;
  };
}

interface BetterSqliteDatabase {
  exec(sql: string): void;
  prepare(sql: string): SqlStatement;
  transaction<F extends () => unknown>(fn: F): F;
  readonly inTransaction: boolean;
  readonly open: boolean;
  close(): void;
}
type BetterSqlite = new (file: string, options?: { fileMustExist?: boolean; readonly?: boolean }) => BetterSqliteDatabase;

/** Node's own SQLite, or undefined where this Node has none (20, or 22 before 22.13 without its flag). */
function nodeSqlite(): NodeSqlite | undefined {
  if (process.env.LOOPS_MOCK_SQLITE === 'better-sqlite3') return undefined;
  return loadNodeSqlite();
}

let builtin: { module: NodeSqlite | undefined } | undefined;
function loadNodeSqlite(): NodeSqlite | undefined {
  if (builtin) return builtin.module;
  // Node 22 calls its SQLite experimental, on stderr, once: not a word for the user of a server whose output
  // (the variables, one-line refusals) scripts read. Node 24 says nothing.
  const emit = process.emitWarning;
  process.emitWarning = function (this: unknown, warning: string | Error, ...rest: unknown[]) {
    const text = typeof warning === 'string' ? warning : warning?.message;
    if (/^SQLite is an experimental feature/.test(String(text))) return;
    return (emit as (...a: unknown[]) => void).call(process, warning, ...rest);
  } as typeof process.emitWarning;
  try {
    builtin = { module: (process as { getBuiltinModule?: (id: string) => unknown }).getBuiltinModule?.('node:sqlite') as NodeSqlite | undefined };
  } catch {
    builtin = { module: undefined };
  } finally {
    process.emitWarning = emit;
  }
  return builtin.module;
}

let betterSqlite: BetterSqlite | undefined;
function loadBetterSqlite(): BetterSqlite {
  if (betterSqlite) return betterSqlite;
  try {
    betterSqlite = createRequire(import.meta.url)('better-sqlite3') as BetterSqlite;
    return betterSqlite;
  } catch (err) {
    // The command prefixes "loops-mock: " itself. Where Node has its own, only LOOPS_MOCK_SQLITE=better-sqlite3 brings us here.
    const why = nodeSqlite()
      ? `LOOPS_MOCK_SQLITE=better-sqlite3 asks for better-sqlite3 on Node ${process.versions.node}`
      : `Node ${process.versions.node} has none built in`;
    throw new SqliteUnavailableError(
      `the store needs SQLite: ${why}, and better-sqlite3 could not be loaded (${(err as Error).message.split('\n')[0]}). ` +
        'Run it on Node 22.13 or later (node:sqlite is built in), or install a C/C++ toolchain (g++, make, python3) and run npm install again, which builds better-sqlite3 for this Node.',
    );
  }
}

/** Which SQLite a database opened now would use. */
export function sqliteDriver(): SqliteDriver {
  return nodeSqlite() ? 'node:sqlite' : 'better-sqlite3';
}

export function openDatabase(file: string, options: OpenOptions = {}): SqlDatabase {
  const builtin = nodeSqlite();
  if (builtin) return new NodeDatabase(builtin, file, options);
  const Database = loadBetterSqlite();
  const db = new Database(file, { fileMustExist: options.mustExist ?? false, readonly: options.readonly ?? false });
  return {
    driver: 'better-sqlite3',
    exec: (sql) => db.exec(sql),
    prepare: (sql) => db.prepare(sql),
    transaction: <T>(fn: () => T) => db.transaction(fn)() as T,
    get inTransaction() {
      return db.inTransaction;
    },
    get open() {
      return db.open;
    },
    close: () => db.close(),
  };
}

/** SQLite's primary result codes by number, for node:sqlite's errors (which carry the number, `errcode`). */
const PRIMARY_CODES: Record<number, string> = {
  1: 'SQLITE_ERROR',
  5: 'SQLITE_BUSY',
  8: 'SQLITE_READONLY',
  10: 'SQLITE_IOERR',
  11: 'SQLITE_CORRUPT',
  13: 'SQLITE_FULL',
  14: 'SQLITE_CANTOPEN',
  19: 'SQLITE_CONSTRAINT',
  26: 'SQLITE_NOTADB',
};

/** Gives a node:sqlite error better-sqlite3's kind of code (SQLITE_FULL, SQLITE_IOERR_...), which storage-errors.ts reads. */
function withSqliteCode(err: unknown): unknown {
  const e = err as { code?: unknown; errcode?: unknown } | null;
  if (e && typeof e.errcode === 'number') {
    const primary = PRIMARY_CODES[e.errcode & 0xff];
    if (primary) e.code = primary === 'SQLITE_IOERR' && e.errcode !== 10 ? `SQLITE_IOERR_${e.errcode >> 8}` : primary;
  }
  return err;
}

function mapped<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw withSqliteCode(err);
  }
}

class NodeDatabase implements SqlDatabase {
  readonly driver = 'node:sqlite';
  private readonly db: InstanceType<NodeSqlite['DatabaseSync']>;
  private depth = 0;
  private isOpen = true;

  constructor(sqlite: NodeSqlite, file: string, options: OpenOptions) {
    if (options.mustExist && file !== ':memory:' && !existsSync(file)) throw new Error(`unable to open database file: ${file} does not exist`);
    this.db = mapped(() => new sqlite.DatabaseSync(file, { readOnly: options.readonly ?? false }));
  }

  exec(sql: string): void {
    mapped(() => this.db.exec(sql));
  }

  prepare(sql: string): SqlStatement {
    const statement = mapped(() => this.db.prepare(sql));
    return {
      run: (...params) => mapped(() => statement.run(...params)),
      get: (...params) => mapped(() => statement.get(...params)),
      all: (...params) => mapped(() => statement.all(...params)),
    };
  }

  transaction<T>(fn: () => T): T {
    const savepoint = `loops_mock_${this.depth}`;
    this.exec(this.depth === 0 ? 'BEGIN' : `SAVEPOINT ${savepoint}`);
    this.depth++;
    try {
      const out = fn();
      // A refused COMMIT (a full disk) leaves the transaction open: the catch rolls it back, as better-sqlite3 does.
      this.exec(this.depth === 1 ? 'COMMIT' : `RELEASE ${savepoint}`);
      this.depth--;
      return out;
    } catch (err) {
      this.depth--;
      try {
        this.db.exec(this.depth === 0 ? 'ROLLBACK' : `ROLLBACK TO ${savepoint}; RELEASE ${savepoint}`);
      } catch {
        // SQLite may have rolled back already (some I/O errors do): nothing is left to undo.
      }
      throw err;
    }
  }

  get inTransaction(): boolean {
    return this.depth > 0;
  }

  get open(): boolean {
    return this.isOpen;
  }

  close(): void {
    if (!this.isOpen) return;
    this.isOpen = false;
    this.db.close();
  }
}
