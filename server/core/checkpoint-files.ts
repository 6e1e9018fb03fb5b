// A checkpoint's files: where their bytes live (a folder per checkpoint, written whole with a manifest, or memory), recovery after a crash, hashes.
import { createHash } from 'node:crypto';
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { CheckpointRecord } from './records.js';

/** A checkpoint name is one safe path segment: it becomes a folder name. */
export const SAFE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
export const SAFE_FILE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(\/[A-Za-z0-9][A-Za-z0-9._-]{0,127})*$/;

export interface CheckpointFileInput {
  relative_file_name: string;
  data: Uint8Array;
}

/** Where checkpoint bytes live: a folder per checkpoint under the data dir, or memory. */
export interface BlobStore {
  /** Puts the files in place; until `commit`, a crash leaves the version the record names. */
  write(record: CheckpointRecord, files: CheckpointFileInput[]): void;
  /** Called once the record is committed: the replaced version goes. */
  commit(id: string): void;
  /** Called when the record could not be committed: the version before comes back. */
  abandon(id: string): void;
  read(id: string, relative: string): Buffer | undefined;
}

export class MemoryBlobs implements BlobStore {
  private readonly blobs = new Map<string, Map<string, Buffer>>();
  /** The version a save not yet committed replaced (undefined: none). */
  private readonly replaced = new Map<string, Map<string, Buffer> | undefined>();
  write(record: CheckpointRecord, files: CheckpointFileInput[]): void {
    this.replaced.set(record.id, this.blobs.get(record.id));
    this.blobs.set(record.id, new Map(files.map((f) => [f.relative_file_name, Buffer.from(f.data)])));
  }
  commit(id: string): void {
    this.replaced.delete(id);
  }
  abandon(id: string): void {
    const old = this.replaced.get(id);
    this.replaced.delete(id);
    if (old) this.blobs.set(id, old);
    else this.blobs.delete(id);
  }
  read(id: string, relative: string): Buffer | undefined {
    return this.blobs.get(id)?.get(relative);
  }
}

/**
 * A checkpoint folder's own copy of its record, written with its files. It
 * cannot collide with a checkpoint file (those never start with '.'), and
 * lets --rebuild-records give a folder its record back.
 */
export const MANIFEST_FILE = '.loops-mock-checkpoint.json';
const MANIFEST_FORMAT = 'loops-mock-checkpoint/1';

/** The record a checkpoint folder's manifest holds, or why there is none. */
export function readManifest(folder: string): { record: CheckpointRecord } | { problem: string } {
  const file = join(folder, MANIFEST_FILE);
  if (!existsSync(file)) return { problem: `it has no ${MANIFEST_FILE} (saved by a loops-mock before manifests, or not a checkpoint)` };
  let parsed: { format?: unknown; record?: Partial<CheckpointRecord> };
  try {
    parsed = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    return { problem: `its ${MANIFEST_FILE} is not JSON (${(err as Error).message})` };
  }
  const r = parsed?.record;
  if (
    parsed?.format !== MANIFEST_FORMAT ||
    !r ||
    typeof r.id !== 'string' ||
    typeof r.run_id !== 'string' ||
    typeof r.org_id !== 'string' ||
    (r.target !== 'trainer' && r.target !== 'sampler') ||
    typeof r.name !== 'string' ||
    !SAFE_NAME.test(r.name) ||
    !Array.isArray(r.files) ||
    !r.files.every((f) => typeof f?.relative_file_name === 'string' && SAFE_FILE.test(f.relative_file_name) && Number.isInteger(f.size_bytes))
  ) {
    return { problem: `its ${MANIFEST_FILE} is not a ${MANIFEST_FORMAT} manifest` };
  }
  return { record: r as CheckpointRecord };
}

/** A save's scratch folder: `.<checkpoint id>.partial` (ids are 7 letters and digits); a name only a save makes. */
export const SCRATCH = /^\.[A-Za-z0-9]{7}\.partial$/;

/** What recovery did with a checkpoints folder's entries. */
export interface RecoveryReport {
  /** Entries no record names and no save left unfinished: kept, not served. */
  unrecorded: string[];
}

export class DirectoryBlobs implements BlobStore {
  constructor(private readonly root: string) {}

  private marker(id: string): string {
    return join(this.root, `.${id}.saving`);
  }

  write(record: CheckpointRecord, files: CheckpointFileInput[]): void {
    let placed = false;
    try {
      this.place(record, files, () => {
        placed = true;
      });
    } catch (err) {
      // A write refused part way (a full disk) leaves no scratch folder holding space, and the version it replaces in place.
      rmSync(join(this.root, `.${record.id}.partial`), { recursive: true, force: true });
      if (placed) this.abandon(record.id);
      else {
        const target = join(this.root, record.id);
        const previous = join(this.root, `.${record.id}.previous`);
        if (!existsSync(target) && existsSync(previous)) renameSync(previous, target);
        rmSync(this.marker(record.id), { force: true });
      }
      throw err;
    }
  }

  private place(record: CheckpointRecord, files: CheckpointFileInput[], onPlaced: () => void): void {
    const id = record.id;
    // Write into a scratch folder, then rename: a checkpoint folder is whole or absent.
    const scratch = join(this.root, `.${id}.partial`);
    rmSync(scratch, { recursive: true, force: true });
    const folders = new Set<string>([scratch]);
    for (const f of files) {
      const target = join(scratch, f.relative_file_name);
      mkdirSync(dirname(target), { recursive: true, mode: 0o700 });
      folders.add(dirname(target));
      writeDurably(target, f.data);
    }
    mkdirSync(scratch, { recursive: true, mode: 0o700 });
    writeDurably(join(scratch, MANIFEST_FILE), Buffer.from(JSON.stringify({ format: MANIFEST_FORMAT, record })));
    // The marker says "a save of this id is under way": a folder it names that no committed record matches is that save's, and goes.
    writeDurably(this.marker(id), new Uint8Array());
    // The files' names in their folders reach the disk too, before the folder takes its place.
    for (const folder of folders) syncFolder(folder);
    // Replacing: move the old folder aside first, so that some whole version exists at every instant.
    const target = join(this.root, id);
    const previous = join(this.root, `.${id}.previous`);
    rmSync(previous, { recursive: true, force: true });
    if (existsSync(target)) renameSync(target, previous);
    renameSync(scratch, target);
    onPlaced();
    syncFolder(this.root);
  }

  commit(id: string): void {
    rmSync(join(this.root, `.${id}.previous`), { recursive: true, force: true });
    rmSync(this.marker(id), { force: true });
    syncFolder(this.root);
  }

  abandon(id: string): void {
    const target = join(this.root, id);
    const previous = join(this.root, `.${id}.previous`);
    rmSync(target, { recursive: true, force: true });
    if (existsSync(previous)) renameSync(previous, target);
    rmSync(this.marker(id), { force: true });
    syncFolder(this.root);
  }

  /**
   * Finishes or undoes the saves a crash interrupted: a save whose record
   * was committed keeps its new folder; one whose record never was (never
   * reported done) gives way to the version before it, or to nothing. A
   * scratch folder is always a save's unfinished write and goes. Anything
   * else no record names is kept and reported: it may be a checkpoint whose
   * record was lost, or the user's own file.
   */
  recover(records: ReadonlyMap<string, CheckpointRecord>): RecoveryReport {
    if (!existsSync(this.root)) return { unrecorded: [] };
    for (const name of readdirSync(this.root)) {
      const saving = /^\.([A-Za-z0-9]{7})\.saving$/.exec(name);
      if (!saving) continue;
      const id = saving[1]!;
      const target = join(this.root, id);
      const previous = join(this.root, `.${id}.previous`);
      const written = existsSync(target) ? readManifest(target) : undefined;
      const record = records.get(id);
      const committed = record !== undefined && written !== undefined && 'record' in written && sameVersion(record, written.record);
      if (committed) this.commit(id);
      else if (record === undefined || existsSync(previous)) this.abandon(id);
      // A record whose older folder was written before manifests, the save cut off before its move: that folder stays.
      else rmSync(join(this.root, name), { force: true });
    }
    for (const name of readdirSync(this.root)) {
      // Left by a loops-mock before markers: the old rule (restore it where the checkpoint's folder is gone).
      const previous = /^\.([A-Za-z0-9]{7})\.previous$/.exec(name);
      if (previous && !existsSync(join(this.root, previous[1]!))) renameSync(join(this.root, name), join(this.root, previous[1]!));
      else if (previous || SCRATCH.test(name)) rmSync(join(this.root, name), { recursive: true, force: true });
    }
    syncFolder(this.root);
    return {
      unrecorded: readdirSync(this.root)
        .filter((name) => !records.has(name))
        .sort(),
    };
  }

  read(id: string, relative: string): Buffer | undefined {
    const file = join(this.root, id, relative);
    return existsSync(file) ? readFileSync(file) : undefined;
  }
}

/** Whether a folder's manifest is the version a record names (same save: same time and files). */
function sameVersion(a: CheckpointRecord, b: CheckpointRecord): boolean {
  return a.created_at === b.created_at && JSON.stringify(a.files) === JSON.stringify(b.files);
}

export function sha256Of(data: Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Written and flushed to the disk before it counts as written. */
function writeDurably(file: string, data: Uint8Array): void {
  // Owner-only, as the database is: checkpoints are the user's weights.
  const fd = openSync(file, 'w', 0o600);
  try {
    let at = 0;
    while (at < data.byteLength) at += writeSync(fd, data, at, data.byteLength - at);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** A folder's entries flushed to the disk (a new or renamed name survives a crash). */
function syncFolder(folder: string): void {
  const fd = openSync(folder, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
