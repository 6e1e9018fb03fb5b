import { createHmac, timingSafeEqual } from 'node:crypto';
import { join } from 'node:path';
import type { Clock } from './clock.js';
import { conflict, invalid, LoopsError, notFound } from './errors.js';
import { newCheckpointId, newSecret } from './ids.js';
import type { CheckpointFileRecord, CheckpointRecord, CheckpointTarget, Principal, RunRecord } from './records.js';
import { asStorageError } from './storage-errors.js';
import type { Store } from './store.js';
import {
  type BlobStore,
  type CheckpointFileInput,
  DirectoryBlobs,
  MemoryBlobs,
  type RecoveryReport,
  SAFE_FILE,
  SAFE_NAME,
  sha256Of,
} from './checkpoint-files.js';

/** `weights` holds resumable trainer state, `sampler_weights` a servable PEFT adapter. */
const PATH_SEGMENT: Record<CheckpointTarget, string> = { trainer: 'weights', sampler: 'sampler_weights' };
const CHECKPOINT_PATH = /^bt:\/\/loops:([A-Za-z0-9]+)\/(weights|sampler_weights)\/([^/]+)$/;

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
