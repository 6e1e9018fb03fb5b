import { openDatabase } from '../core/sqlite.js';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { MANIFEST_FILE } from '../core/checkpoint-files.js';
import { DataDirError } from '../core/store.js';
import { ConfigError, type RunningServer } from '../index.js';
import { client, fakeCheckpointFiles, newRun, startTestServer } from './helpers.js';

/**
 * A data dir whose database is missing, empty, table-less, unreadable or
 * holds a broken record never costs a checkpoint: the start is refused with
 * one line naming the file and both ways out, and each way out works.
 */

const dirs: string[] = [];
const servers: RunningServer[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const tempDir = () => {
  const d = mkdtempSync(join(tmpdir(), 'loops-mock-datadir-'));
  dirs.push(d);
  return d;
};
const start = async (options: Parameters<typeof startTestServer>[0]) => {
  const s = await startTestServer(options);
  servers.push(s);
  return s;
};

const KEY = 'owner-key';

/** A data dir holding one saved checkpoint, the server stopped: the state a restart finds. */
async function savedCheckpoint(): Promise<{ dataDir: string; id: string; runId: string; folder: string; bytes: Buffer }> {
  const dataDir = tempDir();
  const server = await startTestServer({ dataDir });
  const run = await newRun(client(server, KEY));
  const c = server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'sampler', 'final', fakeCheckpointFiles(), { r: 16 });
  await server.close();
  const folder = join(dataDir, 'checkpoints', c.id);
  return { dataDir, id: c.id, runId: run.id, folder, bytes: readFileSync(join(folder, 'adapter_model.safetensors')) };
}

function removeDatabase(dataDir: string): void {
  for (const f of ['loops-mock.sqlite', 'loops-mock.sqlite-wal', 'loops-mock.sqlite-shm']) rmSync(join(dataDir, f), { force: true });
}

async function refusal(dataDir: string): Promise<string> {
  const err = await startTestServer({ dataDir }).then(
    (s) => {
      servers.push(s);
      throw new Error('the server started');
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(DataDirError);
  const message = (err as Error).message;
  expect(message).not.toContain('\n');
  expect(message).toContain('--rebuild-records');
  expect(message).toContain('--data-dir-fresh');
  return message;
}

/** The checkpoint's file downloaded through its presigned URL, as the key that saved it. */
async function download(server: RunningServer, id: string, file = 'adapter_model.safetensors') {
  const listed = await client(server, KEY).get(`/v1/loops/checkpoints/${id}/files`);
  expect(listed.status, JSON.stringify(listed.body)).toBe(200);
  const url = listed.body.presigned_urls.find((f: any) => f.relative_file_name === file).url.replace(/^http:\/\/[^/]+/, '');
  return server.app.inject({ method: 'GET', url });
}

describe('a missing or unusable database beside checkpoint folders', () => {
  it.each([
    ['missing', (d: string) => removeDatabase(d), 'is missing'],
    [
      '0 bytes',
      (d: string) => {
        removeDatabase(d);
        writeFileSync(join(d, 'loops-mock.sqlite'), '');
      },
      'is empty (0 bytes)',
    ],
    [
      'table-less',
      (d: string) => {
        removeDatabase(d);
        const db = openDatabase(join(d, 'loops-mock.sqlite'));
        db.exec('CREATE TABLE other (x)');
        db.close();
      },
      'has no records table',
    ],
  ])('(%s) refuses the start with one line naming the database and the checkpoints, and removes nothing', async (_, damage, why) => {
    const saved = await savedCheckpoint();
    damage(saved.dataDir);
    const message = await refusal(saved.dataDir);
    expect(message).toContain(join(saved.dataDir, 'loops-mock.sqlite'));
    expect(message).toContain(why);
    expect(message).toContain(`${join(saved.dataDir, 'checkpoints')} holds 1 checkpoint folder`);
    expect(readFileSync(join(saved.folder, 'adapter_model.safetensors'))).toEqual(saved.bytes);
    // Refused again: the refusal itself made nothing that would let a second start through.
    await refusal(saved.dataDir);
  });

  it('with --rebuild-records gives the folders their records back: listed, validated and downloaded for the key that saved them', async () => {
    const saved = await savedCheckpoint();
    removeDatabase(saved.dataDir);
    const server = await start({ dataDir: saved.dataDir, rebuildRecords: true });
    expect(server.notes.join('\n')).toContain(
      `1 checkpoint record rebuilt from ${join(saved.dataDir, 'checkpoints')}: ${saved.id} (sampler 'final' of run ${saved.runId})`,
    );
    const api = client(server, KEY);
    expect((await api.get(`/v1/loops/checkpoints?run_id=${saved.runId}`)).body.checkpoints.map((c: any) => c.id)).toEqual([saved.id]);
    expect((await api.post('/v1/loops/checkpoints/validate', { checkpoint_path: `bt://loops:${saved.runId}/sampler_weights/final` })).status).toBe(200);
    const res = await download(server, saved.id);
    expect(res.statusCode).toBe(200);
    expect(Buffer.from(res.rawPayload)).toEqual(saved.bytes);
    // Another key's organisation still cannot see it.
    expect((await client(server, 'other-key').get(`/v1/loops/checkpoints?run_id=${saved.runId}`)).body.checkpoints).toEqual([]);
  });

  it('with --data-dir-fresh starts empty and moves the old state aside, byte for byte', async () => {
    const saved = await savedCheckpoint();
    writeFileSync(join(saved.dataDir, 'loops-mock.sqlite'), '');
    const server = await start({ dataDir: saved.dataDir, dataDirFresh: true });
    const aside = readdirSync(saved.dataDir).filter((n) => n.startsWith('set-aside-'));
    expect(aside).toHaveLength(1);
    expect(server.notes.join('\n')).toContain(join(saved.dataDir, aside[0]!));
    expect(readFileSync(join(saved.dataDir, aside[0]!, 'checkpoints', saved.id, 'adapter_model.safetensors'))).toEqual(saved.bytes);
    expect(existsSync(join(saved.dataDir, aside[0]!, 'loops-mock.sqlite'))).toBe(true);
    expect((await client(server, KEY).get(`/v1/loops/checkpoints?run_id=${saved.runId}`)).body.checkpoints).toEqual([]);
    expect((await client(server, KEY).get('/v1/loops/runs')).body.runs).toEqual([]);
  });

  it('an unreadable database is refused even without checkpoints; --rebuild-records sets it aside, never deletes it', async () => {
    const saved = await savedCheckpoint();
    removeDatabase(saved.dataDir);
    const garbage = Buffer.alloc(8192, 0x5a);
    writeFileSync(join(saved.dataDir, 'loops-mock.sqlite'), garbage);
    const message = await refusal(saved.dataDir);
    expect(message).toContain(`${join(saved.dataDir, 'loops-mock.sqlite')} cannot be read as a loops-mock database: file is not a database`);
    const server = await start({ dataDir: saved.dataDir, rebuildRecords: true });
    const aside = readdirSync(saved.dataDir).find((n) => n.startsWith('set-aside-'))!;
    expect(readFileSync(join(saved.dataDir, aside, 'loops-mock.sqlite'))).toEqual(garbage);
    expect((await client(server, KEY).get(`/v1/loops/checkpoints?run_id=${saved.runId}`)).body.checkpoints.map((c: any) => c.id)).toEqual([saved.id]);
  });

  it('a record that is not JSON is refused with one line naming the database, the record and the ways out', async () => {
    const saved = await savedCheckpoint();
    const db = openDatabase(join(saved.dataDir, 'loops-mock.sqlite'));
    db.prepare("UPDATE records SET data = '{broken' WHERE kind = 'run' AND id = ?").run(saved.runId);
    db.close();
    const message = await refusal(saved.dataDir);
    expect(message).toContain(`${join(saved.dataDir, 'loops-mock.sqlite')}: the run record ${saved.runId} is not JSON`);
    // The way out it names works: the database goes aside whole, the checkpoint comes back.
    const server = await start({ dataDir: saved.dataDir, rebuildRecords: true });
    const aside = readdirSync(saved.dataDir).find((n) => n.startsWith('set-aside-'))!;
    expect(server.notes[0]).toContain(`the run record ${saved.runId} is not JSON`);
    expect(server.notes[0]).toContain(`it is now in ${join(saved.dataDir, aside)}`);
    expect(existsSync(join(saved.dataDir, aside, 'loops-mock.sqlite'))).toBe(true);
    expect((await client(server, KEY).get(`/v1/loops/checkpoints?run_id=${saved.runId}`)).body.checkpoints.map((c: any) => c.id)).toEqual([saved.id]);
  });

  it('the two flags need --data-dir, and do not go together', async () => {
    await expect(startTestServer({ rebuildRecords: true })).rejects.toThrow(ConfigError);
    await expect(startTestServer({ dataDirFresh: true })).rejects.toThrow(/--data-dir-fresh needs --data-dir/);
    await expect(startTestServer({ dataDir: tempDir(), dataDirFresh: true, rebuildRecords: true })).rejects.toThrow(/do not go together/);
  });

  it('a first start (no database, no checkpoints) just starts', async () => {
    const server = await start({ dataDir: join(tempDir(), 'new') });
    expect(server.notes).toEqual([]);
  });
});

describe('the checkpoints folder at start, with its database', () => {
  it("keeps and reports what no record names (a user's own file, a folder whose record is gone); serves the rest", async () => {
    const saved = await savedCheckpoint();
    const root = join(saved.dataDir, 'checkpoints');
    writeFileSync(join(root, 'notes.txt'), 'my notes');
    // Named like a save's marks, but no save makes these names (a checkpoint id is 7 letters and digits).
    writeFileSync(join(root, '.my-draft.partial'), 'draft');
    mkdirSync(join(root, 'notes'));
    writeFileSync(join(root, '.notes.saving'), '');
    mkdirSync(join(root, 'Abc1234'));
    writeFileSync(join(root, 'Abc1234', 'weights.bin'), 'x');
    const server = await start({ dataDir: saved.dataDir });
    expect(readFileSync(join(root, 'notes.txt'), 'utf8')).toBe('my notes');
    expect(existsSync(join(root, 'Abc1234', 'weights.bin'))).toBe(true);
    expect(readFileSync(join(root, '.my-draft.partial'), 'utf8')).toBe('draft');
    expect(existsSync(join(root, 'notes'))).toBe(true);
    expect(server.notes).toHaveLength(1);
    expect(server.notes[0]).toContain(
      `${root} holds 5 entries no record names, kept and not served: .my-draft.partial, .notes.saving, Abc1234, notes, notes.txt`,
    );
    expect((await download(server, saved.id)).statusCode).toBe(200);
  });

  it('removes a half-written .partial folder', async () => {
    const saved = await savedCheckpoint();
    const partial = join(saved.dataDir, 'checkpoints', '.Zzz9999.partial');
    mkdirSync(partial);
    writeFileSync(join(partial, 'half'), 'x');
    const server = await start({ dataDir: saved.dataDir });
    expect(existsSync(partial)).toBe(false);
    expect(server.notes).toEqual([]);
  });

  it('a save cut off before its record was committed: a new checkpoint goes, a replacement gives way to the version before', async () => {
    const saved = await savedCheckpoint();
    const root = join(saved.dataDir, 'checkpoints');
    // A new checkpoint's folder in place, its record never written: what a crash right after the folder's rename leaves.
    mkdirSync(join(root, 'New0001'));
    writeFileSync(join(root, 'New0001', MANIFEST_FILE), JSON.stringify({ format: 'loops-mock-checkpoint/1', record: { id: 'New0001' } }));
    writeFileSync(join(root, '.New0001.saving'), '');
    // A replacement of the saved one moved in, the old version still aside, the record still the old one's.
    renameSync(saved.folder, join(root, `.${saved.id}.previous`));
    mkdirSync(saved.folder);
    writeFileSync(join(saved.folder, 'adapter_model.safetensors'), 'the replacement, never reported done');
    writeFileSync(join(root, `.${saved.id}.saving`), '');
    const server = await start({ dataDir: saved.dataDir });
    expect(readdirSync(root).sort()).toEqual([saved.id]);
    expect(server.notes).toEqual([]);
    const res = await download(server, saved.id);
    expect(res.statusCode).toBe(200);
    expect(Buffer.from(res.rawPayload)).toEqual(saved.bytes);
  });

  it('a save cut off after its record was committed keeps the new version', async () => {
    const saved = await savedCheckpoint();
    const root = join(saved.dataDir, 'checkpoints');
    // The replaced version still aside and the marker still there: the save's last step (removing both) never ran.
    mkdirSync(join(root, `.${saved.id}.previous`));
    writeFileSync(join(root, `.${saved.id}.previous`, 'adapter_model.safetensors'), 'the old version');
    writeFileSync(join(root, `.${saved.id}.saving`), '');
    const server = await start({ dataDir: saved.dataDir });
    expect(readdirSync(root).sort()).toEqual([saved.id]);
    expect(Buffer.from((await download(server, saved.id)).rawPayload)).toEqual(saved.bytes);
  });

  it("writes each checkpoint's manifest into its folder: its record, with every file's size and SHA-256", async () => {
    const saved = await savedCheckpoint();
    const manifest = JSON.parse(readFileSync(join(saved.folder, MANIFEST_FILE), 'utf8'));
    expect(manifest.format).toBe('loops-mock-checkpoint/1');
    expect(manifest.record).toMatchObject({ id: saved.id, run_id: saved.runId, target: 'sampler', name: 'final' });
    expect(manifest.record.files.map((f: any) => [f.relative_file_name, f.size_bytes, f.sha256.length])).toEqual([
      ['adapter_config.json', expect.any(Number), 64],
      ['adapter_model.safetensors', 1024, 64],
    ]);
  });

  it('a truncated manifest leaves the folder kept and reported by --rebuild-records, not rebuilt', async () => {
    const saved = await savedCheckpoint();
    removeDatabase(saved.dataDir);
    truncateSync(join(saved.folder, MANIFEST_FILE), 10);
    const server = await start({ dataDir: saved.dataDir, rebuildRecords: true });
    expect(server.notes.join('\n')).toContain(`0 checkpoint records rebuilt`);
    expect(server.notes.join('\n')).toContain(`kept without a record: ${saved.id} (its ${MANIFEST_FILE} is not JSON`);
    expect(existsSync(join(saved.folder, 'adapter_model.safetensors'))).toBe(true);
  });
});
