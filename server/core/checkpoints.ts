import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { Clock } from './clock.js';
import { conflict, invalid, LoopsError, notFound } from './errors.js';
import { newCheckpointId, newSecret } from './ids.js';
import type { CheckpointFileRecord, CheckpointRecord, CheckpointTarget, Principal, RunRecord } from './records.js';
import { asStorageError } from './storage-errors.js';
import type { Store } from './store.js';

/** `weights` holds resumable trainer state, `sampler_weights` a servable PEFT adapter. */
const PATH_SEGMENT: Record<CheckpointTarget, string> = { trainer: 'weights', sampler: 'sampler_weights' };
const CHECKPOINT_PATH = /^bt:\/\/loops:([A-Za-z0-9]+)\/(weights|sampler_weights)\/([^/]+)$/;
/** A checkpoint name is one safe path segment: it becomes a folder name. */
const SAFE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const SAFE_FILE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(\/[A-Za-z0-9][A-Za-z0-9._-]{0,127})*$/;

export interface ParsedCheckpointPath {
  runId: string;
  target: CheckpointTarget;
  name: string;
}

export function checkpointPath(c: Pick<CheckpointRecord, 'run_id' | 'target' | 'name'>): string {
  return `bt://loops:${c.run_id}/${PATH_SEGMENT[c.target]}/${c.name}`;
}

/** Parses a bt:// checkpoint URI, or throws a 400 that shows the expected form. */
export function parseCheckpointPath(path: string, field: string): ParsedCheckpointPath {
  const m = CHECKPOINT_PATH.exec(path);
  if (!m || !SAFE_NAME.test(m[3]!)) {
    throw invalid(
      `${field} '${path}' is not a Loops checkpoint path: expected bt://loops:<run_id>/weights/<name> or bt://loops:<run_id>/sampler_weights/<name>.`,
      { field },
    );
  }
  return { runId: m[1]!, target: m[2] === 'weights' ? 'trainer' : 'sampler', name: m[3]! };
}

export function assertSafeCheckpointName(name: string, field: string): void {
  if (!SAFE_NAME.test(name)) {
    throw invalid(`${field} '${name}' is not a safe checkpoint name: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/').`, {
      field,
    });
  }
}

export interface CheckpointFileInput {
  relative_file_name: string;
  data: Uint8Array;
}

/** Where checkpoint bytes live: a folder per checkpoint under the data dir, or memory. */
interface BlobStore {
  /** Puts the files in place; until `commit`, a crash leaves the version the record names. */
  write(record: CheckpointRecord, files: CheckpointFileInput[]): void;
  /** Called once the record is committed: the replaced version goes. */
  commit(id: string): void;
  /** Called when the record could not be committed: the version before comes back. */
  abandon(id: string): void;
  read(id: string, relative: string): Buffer | undefined;
}

class MemoryBlobs implements BlobStore {
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

class DirectoryBlobs implements BlobStore {
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

export interface PresignedFile {
  relative_file_name: string;
  size_bytes: number;
  last_modified: number;
  /** Path and query of the download route, to be joined onto the public URL. */
  path: string;
}

/** Checkpoint records, their files, and the signed URLs that download them. */
export class Checkpoints {
  private readonly records = new Map<string, CheckpointRecord>();
  private readonly blobs: BlobStore;
  private readonly secret: string;
  /** Where messages say the disk failed. */
  private readonly where: string;
  /** What the start found in the checkpoints folder (nothing without a data dir). */
  readonly recovery: RecoveryReport = { unrecorded: [] };

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    dataDir: string | undefined,
    private readonly presignTtlMs: number,
  ) {
    this.where = dataDir ?? '(memory)';
    for (const c of store.load<CheckpointRecord>('checkpoint')) this.records.set(c.id, c);
    if (dataDir) {
      const blobs = new DirectoryBlobs(join(dataDir, 'checkpoints'));
      this.recovery = blobs.recover(this.records);
      this.blobs = blobs;
    } else {
      this.blobs = new MemoryBlobs();
    }
    // The signing secret survives restarts, so URLs handed out stay valid until they expire.
    const kept = store.getMeta('presign_secret');
    this.secret = kept ?? newSecret();
    // Written once: a restart on a full disk has nothing to write here.
    if (kept === undefined) store.setMeta('presign_secret', this.secret);
  }

  /**
   * Saves a checkpoint of `run`. Saving a name that exists replaces it: the
   * record keeps its global id, and the new files take the place of the old.
   */
  save(
    run: RunRecord,
    target: CheckpointTarget,
    name: string,
    files: CheckpointFileInput[],
    loraAdapterConfig: Record<string, unknown> | null,
  ): CheckpointRecord {
    assertSafeCheckpointName(name, 'name');
    for (const f of files) {
      if (!SAFE_FILE.test(f.relative_file_name)) throw invalid(`Unsafe checkpoint file name '${f.relative_file_name}'.`, { field: 'relative_file_name' });
    }
    const previous = this.find(run.id, target, name);
    const now = this.clock.now();
    const record: CheckpointRecord = {
      id: previous?.id ?? newCheckpointId(),
      run_id: run.id,
      org_id: run.org_id,
      user_id: run.user_id,
      team_id: run.team_id,
      base_model: run.base_model,
      target,
      name,
      created_at: now,
      lora_adapter_config: loraAdapterConfig,
      files: files.map((f) => ({ relative_file_name: f.relative_file_name, size_bytes: f.data.byteLength, last_modified: now, sha256: sha256Of(f.data) })),
    };
    // A full disk refusing the files or the record is an error naming the disk and this checkpoint (never done).
    const what = `the ${target} checkpoint '${name}'`;
    try {
      this.blobs.write(record, files);
    } catch (err) {
      const mapped = asStorageError(err, this.where, what);
      if (mapped !== err) this.store.noteRefused();
      throw mapped;
    }
    try {
      this.store.put('checkpoint', record.id, record);
    } catch (err) {
      this.blobs.abandon(record.id);
      throw asStorageError(err, this.where, what);
    }
    this.records.set(record.id, record);
    this.blobs.commit(record.id);
    return record;
  }

  find(runId: string, target: CheckpointTarget, name: string): CheckpointRecord | undefined {
    for (const c of this.records.values()) if (c.run_id === runId && c.target === target && c.name === name) return c;
    return undefined;
  }

  /** The checkpoint a bt:// path names, if the caller's organisation may read it; else a 400 (the route's documented answer). */
  resolve(p: Principal, path: string, field: string, expected?: CheckpointTarget): CheckpointRecord {
    const parsed = parseCheckpointPath(path, field);
    if (expected && parsed.target !== expected) {
      const want =
        expected === 'trainer'
          ? 'a trainer checkpoint (bt://loops:<run_id>/weights/<name>)'
          : 'a sampler checkpoint (bt://loops:<run_id>/sampler_weights/<name>)';
      throw invalid(`${field} must name ${want}; '${path}' is a ${parsed.target} checkpoint.`, { field });
    }
    const c = this.find(parsed.runId, parsed.target, parsed.name);
    if (!c || c.org_id !== p.org_id)
      throw invalid(
        `${field} '${path}' does not name a checkpoint you can access: GET /v1/loops/checkpoints?run_id=${parsed.runId} lists that run's checkpoints.`,
        { field },
      );
    // Checked now, so that a damaged checkpoint is refused here rather than loaded into a trainer or sampler.
    this.readFiles(c);
    return c;
  }

  /** Checkpoints matching exactly one filter. */
  list(p: Principal, filter: { run_id?: string; base_model?: string; checkpoint_path?: string }): CheckpointRecord[] {
    const given = Object.entries(filter).filter(([, v]) => v !== undefined);
    if (given.length !== 1) {
      throw invalid(`Give exactly one filter of run_id, base_model or checkpoint_path (got ${given.length ? given.map(([k]) => k).join(', ') : 'none'}).`, {
        field: 'query',
      });
    }
    const all = [...this.records.values()].filter((c) => c.org_id === p.org_id);
    let out: CheckpointRecord[];
    if (filter.run_id !== undefined) out = all.filter((c) => c.run_id === filter.run_id);
    // Docs: "checkpoints across the caller's runs of this base model".
    else if (filter.base_model !== undefined) out = all.filter((c) => c.base_model === filter.base_model && c.user_id === p.user_id);
    else {
      const parsed = parseCheckpointPath(filter.checkpoint_path!, 'checkpoint_path');
      out = all.filter((c) => c.run_id === parsed.runId && c.target === parsed.target && c.name === parsed.name);
    }
    return out.sort((a, b) => a.created_at - b.created_at);
  }

  get(p: Principal, id: string): CheckpointRecord {
    const c = this.records.get(id);
    if (!c || c.org_id !== p.org_id)
      throw notFound(`Checkpoint '${id}' not found. Use the checkpoint's \`id\` from GET /v1/loops/checkpoints.`, { field: 'checkpoint_id' });
    return c;
  }

  /** Every file of a checkpoint, by relative name, each checked against its size and checksum from the save. */
  readFiles(c: CheckpointRecord): Map<string, Uint8Array> {
    const out = new Map<string, Uint8Array>();
    for (const f of c.files) out.set(f.relative_file_name, this.readChecked(c, f));
    return out;
  }

  /**
   * One file's bytes, or a 409 naming the checkpoint and file when they are
   * not what the save wrote. Records from before checksums carry none: their
   * files are checked by size only.
   */
  private readChecked(c: CheckpointRecord, f: CheckpointFileRecord): Buffer {
    const bytes = this.blobs.read(c.id, f.relative_file_name);
    const damaged = (what: string) =>
      conflict(
        `Checkpoint ${checkpointPath(c)} (id ${c.id}) is damaged: its file '${f.relative_file_name}' ${what}. It cannot be loaded, served or downloaded; save it again from a trainer (or put the original file back).`,
        { type_detail: 'checkpoint_damaged', checkpoint_id: c.id, relative_file_name: f.relative_file_name },
      );
    if (!bytes) throw damaged('is missing from its folder');
    if (bytes.byteLength !== f.size_bytes) throw damaged(`is ${bytes.byteLength} bytes; the save wrote ${f.size_bytes}`);
    if (f.sha256 !== undefined && sha256Of(bytes) !== f.sha256) throw damaged('does not match the SHA-256 recorded when it was saved');
    return bytes;
  }

  totalBytes(runIds: Set<string>): number {
    let total = 0;
    for (const c of this.records.values()) if (runIds.has(c.run_id)) total += c.files.reduce((s, f) => s + f.size_bytes, 0);
    return total;
  }

  /** One page of a checkpoint's files, each with a signed, expiring download path. */
  files(p: Principal, id: string, pageSize: number, pageToken: number): { files: PresignedFile[]; total: number; next: number | null } {
    const c = this.get(p, id);
    const page = c.files.slice(pageToken, pageToken + pageSize);
    const expires = this.clock.now() + this.presignTtlMs;
    const files = page.map((f) => ({
      ...f,
      path: `/checkpoint-files/${c.id}/${f.relative_file_name.split('/').map(encodeURIComponent).join('/')}?expires=${expires}&signature=${this.sign(c, f.relative_file_name, expires)}`,
    }));
    const next = pageToken + pageSize < c.files.length ? pageToken + pageSize : null;
    return { files, total: c.files.length, next };
  }

  /**
   * The bytes behind a signed download path. The signature binds checkpoint,
   * file, expiry and owning organisation; a caller who also sends an API key
   * of another organisation is refused.
   */
  download(id: string, relative: string, expires: number, signature: string, caller?: Principal): Buffer {
    const c = this.records.get(id);
    const denied = () =>
      new LoopsError(
        'forbidden',
        'The download URL is not valid: its signature does not match. Ask GET /v1/loops/checkpoints/{checkpoint_id}/files for a fresh URL.',
      );
    if (!c) throw denied();
    const expected = Buffer.from(this.sign(c, relative, expires));
    const given = Buffer.from(signature);
    if (expected.length !== given.length || !timingSafeEqual(expected, given)) throw denied();
    if (this.clock.now() > expires)
      throw new LoopsError('forbidden', 'The download URL has expired. Ask GET /v1/loops/checkpoints/{checkpoint_id}/files for a fresh URL.');
    if (caller && caller.org_id !== c.org_id) throw new LoopsError('forbidden', 'This download URL belongs to another organisation.');
    const file = c.files.find((f) => f.relative_file_name === relative);
    if (!file) throw notFound(`Checkpoint ${c.id} has no file '${relative}'.`);
    return this.readChecked(c, file);
  }

  private sign(c: CheckpointRecord, relative: string, expires: number): string {
    return createHmac('sha256', this.secret)
      .update([c.id, c.org_id, relative, String(expires)].join('\n'))
      .digest('base64url');
  }
}
