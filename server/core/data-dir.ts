import { existsSync, mkdirSync, readdirSync, renameSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { MANIFEST_FILE, readManifest, SCRATCH } from './checkpoint-files.js';
import type { CheckpointRecord } from './records.js';
import { openDatabase, SqliteUnavailableError, type SqlDatabase } from './sqlite.js';
import { DataDirError, Store, WAYS_OUT } from './store.js';

const DATABASE_FILES = ['loops-mock.sqlite', 'loops-mock.sqlite-wal', 'loops-mock.sqlite-shm'];

/** How a start treats a data dir whose database is missing or unreadable. */
export interface DataDirStart {
  /** Move the database and checkpoints into a set-aside folder first, and start empty. */
  fresh?: boolean;
  /** Give checkpoint folders that no record names their records back, from their manifests. */
  rebuildRecords?: boolean;
}

/** What the checks before the core opens the data dir found and did, as lines for the person starting it. */
export interface DataDirNotes {
  notes: string[];
}

/** What the database file is, without changing it. */
type DatabaseState = { ok: true } | { ok: false; why: string; unreadable: boolean };

function inspectDatabase(file: string): DatabaseState {
  if (!existsSync(file)) return { ok: false, why: `${file} is missing`, unreadable: false };
  if (statSync(file).size === 0) return { ok: false, why: `${file} is empty (0 bytes)`, unreadable: false };
  let db: SqlDatabase | undefined;
  try {
    db = openDatabase(file, { mustExist: true });
    const table = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'records'").get();
    return table ? { ok: true } : { ok: false, why: `${file} has no records table (not a loops-mock database, or one never written)`, unreadable: false };
  } catch (err) {
    if (err instanceof SqliteUnavailableError) throw err;
    return { ok: false, why: `${file} cannot be read as a loops-mock database: ${(err as Error).message}`, unreadable: true };
  } finally {
    db?.close();
  }
}

/** Why the database's records cannot all be read, or undefined when they can. */
function unreadableRecords(dataDir: string): string | undefined {
  let store: Store | undefined;
  try {
    store = new Store(dataDir);
    store.checkRecords();
    return undefined;
  } catch (err) {
    if (!(err instanceof DataDirError)) throw err;
    return err.message.slice(0, err.message.indexOf(WAYS_OUT)).trim();
  } finally {
    store?.close();
  }
}

/** The entries of the checkpoints folder that hold (or may hold) checkpoints: everything but a save's scratch folders. */
function checkpointEntries(root: string): string[] {
  if (!existsSync(root)) return [];
  return readdirSync(root).filter((name) => !SCRATCH.test(name));
}

/** A folder in the data dir named for now, for what is set aside: never overwriting one from before. */
function setAsideFolder(dataDir: string): string {
  const stamp = new Date().toISOString().replace(/[:.]/g, '-');
  let folder = join(dataDir, `set-aside-${stamp}`);
  for (let n = 2; existsSync(folder); n++) folder = join(dataDir, `set-aside-${stamp}-${n}`);
  mkdirSync(folder, { recursive: true, mode: 0o700 });
  return folder;
}

function moveAside(dataDir: string, names: string[]): string | undefined {
  const present = names.filter((n) => existsSync(join(dataDir, n)));
  if (!present.length) return undefined;
  const folder = setAsideFolder(dataDir);
  for (const n of present) renameSync(join(dataDir, n), join(folder, n));
  return folder;
}

/**
 * Runs before the core opens a data dir. Checkpoint folders are the user's
 * weights: a database that is missing, empty, table-less or unreadable while
 * checkpoint folders exist stops the start (DataDirError), unless `fresh`
 * (everything set aside, start empty) or `rebuildRecords` (an unreadable
 * database set aside, the folders' records rebuilt) says what to do.
 * Nothing here deletes a file.
 */
export function prepareDataDir(dataDir: string, start: DataDirStart = {}): DataDirNotes {
  const notes: string[] = [];
  const database = join(dataDir, 'loops-mock.sqlite');
  const root = join(dataDir, 'checkpoints');
  if (start.fresh) {
    const folder = moveAside(dataDir, [...DATABASE_FILES, 'checkpoints']);
    if (folder) notes.push(`--data-dir-fresh: the database and checkpoints that were in ${dataDir} are now in ${folder}; starting empty`);
    return { notes };
  }
  const state = inspectDatabase(database);
  const entries = checkpointEntries(root);
  if (!state.ok && state.unreadable && !start.rebuildRecords) throw new DataDirError(`${state.why}. ${WAYS_OUT}`);
  if (!state.ok && entries.length && !start.rebuildRecords) {
    throw new DataDirError(
      `${state.why}, but ${root} holds ${entries.length} checkpoint folder${entries.length === 1 ? '' : 's'} that it would name. ${WAYS_OUT}`,
    );
  }
  // With --rebuild-records, a database whose pages or records cannot all be read is set aside too (the core would stop on it).
  const why = !state.ok ? (state.unreadable ? state.why : undefined) : start.rebuildRecords ? unreadableRecords(dataDir) : undefined;
  if (why) {
    const folder = moveAside(dataDir, DATABASE_FILES);
    notes.push(`--rebuild-records: ${why.replace(/\.$/, '')}; it is now in ${folder}, and a new one holds the rebuilt checkpoint records`);
  }
  if (start.rebuildRecords) notes.push(...rebuildRecords(dataDir, root, entries));
  return { notes };
}

/**
 * Gives each checkpoint folder that no record names the record its manifest
 * holds. Runs, sessions and samplers are not rebuilt (they live only in the
 * database): a rebuilt checkpoint lists, loads into a new run, serves a new
 * sampler and downloads, for the key that saved it.
 */
function rebuildRecords(dataDir: string, root: string, entries: string[]): string[] {
  const store = new Store(dataDir);
  try {
    const recorded = new Map(store.load<CheckpointRecord>('checkpoint').map((c) => [c.id, c]));
    const byPath = new Set([...recorded.values()].map((c) => `${c.run_id}/${c.target}/${c.name}`));
    const rebuilt: string[] = [];
    const kept: string[] = [];
    for (const name of entries) {
      if (recorded.has(name)) continue;
      const folder = join(root, name);
      if (name.startsWith('.') || !statSync(folder).isDirectory()) continue;
      const found = readManifest(folder);
      if ('problem' in found) {
        kept.push(`${name} (${found.problem})`);
        continue;
      }
      const c = found.record;
      const path = `${c.run_id}/${c.target}/${c.name}`;
      if (c.id !== name) {
        kept.push(`${name} (its ${MANIFEST_FILE} names checkpoint ${c.id})`);
        continue;
      }
      if (byPath.has(path)) {
        kept.push(`${name} (a record already names ${c.target} checkpoint '${c.name}' of run ${c.run_id})`);
        continue;
      }
      store.put('checkpoint', c.id, c);
      recorded.set(c.id, c);
      byPath.add(path);
      rebuilt.push(`${c.id} (${c.target} '${c.name}' of run ${c.run_id})`);
    }
    const lines = [
      `--rebuild-records: ${rebuilt.length} checkpoint record${rebuilt.length === 1 ? '' : 's'} rebuilt from ${root}${rebuilt.length ? `: ${rebuilt.join(', ')}` : ''}`,
    ];
    if (kept.length) lines.push(`--rebuild-records: kept without a record: ${kept.join('; ')}`);
    return lines;
  } finally {
    store.close();
  }
}

/** The start-up line about checkpoints-folder entries no record names (kept, never served), or none. */
export function unrecordedNote(dataDir: string, unrecorded: string[]): string[] {
  if (!unrecorded.length) return [];
  const shown = unrecorded.slice(0, 10).join(', ') + (unrecorded.length > 10 ? `, and ${unrecorded.length - 10} more` : '');
  return [
    `${join(dataDir, 'checkpoints')} holds ${unrecorded.length} entr${unrecorded.length === 1 ? 'y' : 'ies'} no record names, kept and not served: ${shown}. Checkpoint folders among them get their records back with --rebuild-records; anything else is yours to move or remove`,
  ];
}
