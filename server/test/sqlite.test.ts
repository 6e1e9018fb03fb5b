import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { openDatabase, sqliteDriver } from '../core/sqlite.js';
import { asStorageError, StorageError } from '../core/storage-errors.js';
import { Store } from '../core/store.js';

// The store runs on Node's own SQLite where the runtime has it (no compiler at install), else on
// better-sqlite3 (Node 20). CI runs this file on Node 20 and on Node 24: each driver meets the same checks.

const builtIn = (process as { getBuiltinModule?: (id: string) => unknown }).getBuiltinModule?.('node:sqlite') !== undefined;

describe(`SQLite on Node ${process.versions.node}`, () => {
  it("uses Node's own SQLite where this Node has one, else better-sqlite3", () => {
    expect(sqliteDriver()).toBe(builtIn ? 'node:sqlite' : 'better-sqlite3');
    expect(openDatabase(':memory:').driver).toBe(sqliteDriver());
  });

  it('a transaction lands whole or not at all, a nested one as a savepoint', () => {
    const db = openDatabase(':memory:');
    db.exec('CREATE TABLE t (x INTEGER)');
    const insert = db.prepare('INSERT INTO t (x) VALUES (?)');
    const count = () => (db.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n;
    db.transaction(() => {
      insert.run(1);
      expect(() =>
        db.transaction(() => {
          insert.run(2);
          throw new Error('inner fails');
        }),
      ).toThrow('inner fails');
      expect(db.inTransaction).toBe(true);
    });
    expect([count(), db.inTransaction]).toEqual([1, false]);
    expect(() =>
      db.transaction(() => {
        insert.run(3);
        throw new Error('outer fails');
      }),
    ).toThrow('outer fails');
    expect(count()).toBe(1);
    db.close();
    expect(db.open).toBe(false);
  });

  it("a full database is SQLITE_FULL on either driver, and the store's 507 names the data dir", () => {
    const dir = mkdtempSync(join(tmpdir(), 'loops-mock-sqlite-'));
    const db = openDatabase(join(dir, 'full.sqlite'));
    db.exec('CREATE TABLE t (x TEXT)');
    // SQLite's own page limit: past it a write fails exactly as on a full disk.
    db.exec('PRAGMA max_page_count = 4');
    const insert = db.prepare('INSERT INTO t (x) VALUES (?)');
    let err: unknown;
    try {
      db.transaction(() => {
        for (let i = 0; i < 100; i++) insert.run('x'.repeat(4096));
      });
    } catch (e) {
      err = e;
    }
    expect((err as { code?: string }).code).toBe('SQLITE_FULL');
    expect(db.inTransaction).toBe(false);
    expect((db.prepare('SELECT count(*) AS n FROM t').get() as { n: number }).n).toBe(0);
    const mapped = asStorageError(err, dir, 'a test row');
    expect(mapped).toBeInstanceOf(StorageError);
    expect((mapped as StorageError).message).toContain(dir);
    db.close();
  });

  it('the store keeps records across a reopen of its data dir', () => {
    const dir = mkdtempSync(join(tmpdir(), 'loops-mock-sqlite-store-'));
    const store = new Store(dir);
    store.transaction(() => store.put('run', 'r1', { id: 'r1', n: 1 }));
    store.setMeta('k', 'v');
    store.close();
    const again = new Store(dir);
    expect([again.load<{ id: string }>('run'), again.getMeta('k')]).toEqual([[{ id: 'r1', n: 1 }], 'v']);
    again.close();
  });
});
