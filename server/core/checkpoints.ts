import { createHmac, timingSafeEqual } from 'node:crypto';
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { Clock } from './clock.js';
import { invalid, LoopsError, notFound } from './errors.js';
import { newCheckpointId, newSecret } from './ids.js';
import type { CheckpointRecord, CheckpointTarget, Principal, RunRecord } from './records.js';
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
    throw invalid(`${field} '${path}' is not a Loops checkpoint path: expected bt://loops:<run_id>/weights/<name> or bt://loops:<run_id>/sampler_weights/<name>.`, { field });
  }
  return { runId: m[1]!, target: m[2] === 'weights' ? 'trainer' : 'sampler', name: m[3]! };
}

export function assertSafeCheckpointName(name: string, field: string): void {
  if (!SAFE_NAME.test(name)) {
    throw invalid(`${field} '${name}' is not a safe checkpoint name: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit (no '/').`, { field });
  }
}

export interface CheckpointFileInput {
  relative_file_name: string;
  data: Uint8Array;
}

/** Where checkpoint bytes live: a folder per checkpoint under the data dir, or memory. */
interface BlobStore {
  write(id: string, files: CheckpointFileInput[]): void;
  read(id: string, relative: string): Buffer | undefined;
}

class MemoryBlobs implements BlobStore {
  private readonly blobs = new Map<string, Map<string, Buffer>>();
  write(id: string, files: CheckpointFileInput[]): void {
    this.blobs.set(id, new Map(files.map((f) => [f.relative_file_name, Buffer.from(f.data)])));
  }
  read(id: string, relative: string): Buffer | undefined {
    return this.blobs.get(id)?.get(relative);
  }
}

class DirectoryBlobs implements BlobStore {
  constructor(private readonly root: string) {}
  write(id: string, files: CheckpointFileInput[]): void {
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
    // The files' names in their folders reach the disk too, before the folder takes its place.
    for (const folder of folders) syncFolder(folder);
    // Replacing: move the old folder aside first, so that some whole version exists at every instant.
    const target = join(this.root, id);
    const previous = join(this.root, `.${id}.previous`);
    if (existsSync(target)) renameSync(target, previous);
    renameSync(scratch, target);
    syncFolder(this.root);
    rmSync(previous, { recursive: true, force: true });
  }

  /**
   * Finishes or undoes a replacement that a crash interrupted, drops
   * unfinished writes, and removes every folder no record names (written, but
   * its record never committed: the save was never reported done).
   */
  recover(recorded: ReadonlySet<string>): void {
    if (!existsSync(this.root)) return;
    for (const name of readdirSync(this.root)) {
      const previous = /^\.(.+)\.previous$/.exec(name);
      if (previous && !existsSync(join(this.root, previous[1]!))) renameSync(join(this.root, name), join(this.root, previous[1]!));
      else if (previous || name.endsWith('.partial')) rmSync(join(this.root, name), { recursive: true, force: true });
    }
    for (const name of readdirSync(this.root)) {
      if (!name.startsWith('.') && !recorded.has(name)) rmSync(join(this.root, name), { recursive: true, force: true });
    }
  }
  read(id: string, relative: string): Buffer | undefined {
    const file = join(this.root, id, relative);
    return existsSync(file) ? readFileSync(file) : undefined;
  }
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

  constructor(private readonly store: Store, private readonly clock: Clock, dataDir: string | undefined, private readonly presignTtlMs: number) {
    for (const c of store.load<CheckpointRecord>('checkpoint')) this.records.set(c.id, c);
    if (dataDir) {
      const blobs = new DirectoryBlobs(join(dataDir, 'checkpoints'));
      blobs.recover(new Set(this.records.keys()));
      this.blobs = blobs;
    } else {
      this.blobs = new MemoryBlobs();
    }
    // The signing secret survives restarts, so URLs handed out stay valid until they expire.
    this.secret = store.getMeta('presign_secret') ?? newSecret();
    store.setMeta('presign_secret', this.secret);
  }

  /**
   * Saves a checkpoint of `run`. Saving a name that exists replaces it: the
   * record keeps its global id, and the new files take the place of the old.
   */
  save(run: RunRecord, target: CheckpointTarget, name: string, files: CheckpointFileInput[], loraAdapterConfig: Record<string, unknown> | null): CheckpointRecord {
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
      files: files.map((f) => ({ relative_file_name: f.relative_file_name, size_bytes: f.data.byteLength, last_modified: now })),
    };
    this.blobs.write(record.id, files);
    this.records.set(record.id, record);
    this.store.put('checkpoint', record.id, record);
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
      const want = expected === 'trainer' ? 'a trainer checkpoint (bt://loops:<run_id>/weights/<name>)' : 'a sampler checkpoint (bt://loops:<run_id>/sampler_weights/<name>)';
      throw invalid(`${field} must name ${want}; '${path}' is a ${parsed.target} checkpoint.`, { field });
    }
    const c = this.find(parsed.runId, parsed.target, parsed.name);
    if (!c || c.org_id !== p.org_id) throw invalid(`${field} '${path}' does not name a checkpoint you can access: GET /v1/loops/checkpoints?run_id=${parsed.runId} lists that run's checkpoints.`, { field });
    return c;
  }

  /** Checkpoints matching exactly one filter. */
  list(p: Principal, filter: { run_id?: string; base_model?: string; checkpoint_path?: string }): CheckpointRecord[] {
    const given = Object.entries(filter).filter(([, v]) => v !== undefined);
    if (given.length !== 1) {
      throw invalid(`Give exactly one filter of run_id, base_model or checkpoint_path (got ${given.length ? given.map(([k]) => k).join(', ') : 'none'}).`, { field: 'query' });
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
    if (!c || c.org_id !== p.org_id) throw notFound(`Checkpoint '${id}' not found. Use the checkpoint's \`id\` from GET /v1/loops/checkpoints.`, { field: 'checkpoint_id' });
    return c;
  }

  /** Every file of a checkpoint, by relative name. */
  readFiles(c: CheckpointRecord): Map<string, Uint8Array> {
    const out = new Map<string, Uint8Array>();
    for (const f of c.files) {
      const bytes = this.blobs.read(c.id, f.relative_file_name);
      if (!bytes) throw notFound(`Checkpoint ${c.id} is missing its file '${f.relative_file_name}'.`);
      out.set(f.relative_file_name, bytes);
    }
    return out;
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
    const denied = () => new LoopsError('forbidden', 'The download URL is not valid: its signature does not match. Ask GET /v1/loops/checkpoints/{checkpoint_id}/files for a fresh URL.');
    if (!c) throw denied();
    const expected = Buffer.from(this.sign(c, relative, expires));
    const given = Buffer.from(signature);
    if (expected.length !== given.length || !timingSafeEqual(expected, given)) throw denied();
    if (this.clock.now() > expires) throw new LoopsError('forbidden', 'The download URL has expired. Ask GET /v1/loops/checkpoints/{checkpoint_id}/files for a fresh URL.');
    if (caller && caller.org_id !== c.org_id) throw new LoopsError('forbidden', 'This download URL belongs to another organisation.');
    const bytes = this.blobs.read(c.id, relative);
    if (!bytes) throw notFound(`Checkpoint ${c.id} has no file '${relative}'.`);
    return bytes;
  }

  private sign(c: CheckpointRecord, relative: string, expires: number): string {
    return createHmac('sha256', this.secret).update([c.id, c.org_id, relative, String(expires)].join('\n')).digest('base64url');
  }
}
