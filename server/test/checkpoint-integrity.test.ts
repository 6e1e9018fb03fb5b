import { openDatabase } from '../core/sqlite.js';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { client, fakeCheckpointFiles, newRun, startTestServer, type Client } from './helpers.js';

/**
 * A checkpoint file changed on disk after its save (flipped bytes, cut
 * short, gone) is never loaded, served or downloaded as if it were the
 * checkpoint: each use answers a 409 naming the checkpoint and the file.
 */

const dirs: string[] = [];
const servers: RunningServer[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

async function serverWithCheckpoint(target: 'trainer' | 'sampler' = 'sampler') {
  const dataDir = mkdtempSync(join(tmpdir(), 'loops-mock-integrity-'));
  dirs.push(dataDir);
  const server = await startTestServer({ dataDir });
  servers.push(server);
  const api = client(server);
  const run = await newRun(api);
  const c = server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, target, 'final', fakeCheckpointFiles(), { r: 16 });
  const path = `bt://loops:${run.id}/${target === 'trainer' ? 'weights' : 'sampler_weights'}/final`;
  const file = (name: string) => join(dataDir, 'checkpoints', c.id, name);
  return { dataDir, server, api, run, c, path, file };
}

async function download(server: RunningServer, api: Client, id: string, name: string) {
  const listed = await api.get(`/v1/loops/checkpoints/${id}/files`);
  const url = listed.body.presigned_urls.find((f: any) => f.relative_file_name === name).url.replace(/^http:\/\/[^/]+/, '');
  return server.app.inject({ method: 'GET', url });
}

function flipBytes(file: string, count: number): void {
  const bytes = readFileSync(file);
  for (let i = 0; i < count; i++) bytes[100 + i]! ^= 0xff;
  writeFileSync(file, bytes);
}

function expectDamaged(res: { status: number; body: any }, path: string, id: string, name: string, what: RegExp): void {
  expect(res.status, JSON.stringify(res.body)).toBe(409);
  expect(res.body.error).toMatchObject({ type: 'conflict', type_detail: 'checkpoint_damaged', checkpoint_id: id, relative_file_name: name });
  expect(res.body.error.message).toContain(`Checkpoint ${path} (id ${id}) is damaged: its file '${name}'`);
  expect(res.body.error.message).toMatch(what);
}

describe('a damaged checkpoint file', () => {
  it.each([
    ['64 flipped bytes', (f: string) => flipBytes(f, 64), /does not match the SHA-256 recorded when it was saved/],
    ['cut short', (f: string) => truncateSync(f, 500), /is 500 bytes; the save wrote 1024/],
    ['gone', (f: string) => rmSync(f), /is missing from its folder/],
  ])('(%s) is a 409 naming the checkpoint and file: download, validate, a sampler of it', async (_, damage, what) => {
    const { server, api, run, c, path, file } = await serverWithCheckpoint();
    damage(file('adapter_model.safetensors'));
    const res = await download(server, api, c.id, 'adapter_model.safetensors');
    expectDamaged({ status: res.statusCode, body: res.json() }, path, c.id, 'adapter_model.safetensors', what);
    // The other file is whole and still downloads.
    expect((await download(server, api, c.id, 'adapter_config.json')).statusCode).toBe(200);
    expectDamaged(await api.post('/v1/loops/checkpoints/validate', { checkpoint_path: path }), path, c.id, 'adapter_model.safetensors', what);
    expectDamaged(
      await api.post('/v1/loops/samplers', { session_id: run.session_id, base_model: run.base_model, model_path: path }),
      path,
      c.id,
      'adapter_model.safetensors',
      what,
    );
  });

  it('a trainer checkpoint with a damaged optimizer file is refused by load_state at submission, not loaded done', async () => {
    const { api, run, c, server } = await serverWithCheckpoint('trainer');
    // A save_state of the run's real trainer: its optimizer file is what load_state_with_optimizer reads, load_state never.
    const saved = await api.post(`/trainer/${run.id}/save_state`, { name: 'real' }, { 'idempotency-key': randomUUID() });
    expect(saved.status).toBe(200);
    let op: any;
    do op = await api.get(`/trainer/${run.id}/operations/${saved.body.operation_id}`);
    while (op.status === 408 || op.body.status === 'pending' || op.body.status === 'running');
    expect(op.body.status, JSON.stringify(op.body)).toBe('done');
    const real = server.core.checkpoints.find(run.id, 'trainer', 'real')!;
    const optimizer = join(server.core.store.file, '..', 'checkpoints', real.id, 'optimizer.safetensors');
    truncateSync(optimizer, readFileSync(optimizer).byteLength - 64);
    const path = `bt://loops:${run.id}/weights/real`;
    for (const route of ['load_state', 'load_state_with_optimizer']) {
      const res = await api.post(`/trainer/${run.id}/${route}`, { path }, { 'idempotency-key': randomUUID() });
      expectDamaged(res, path, real.id, 'optimizer.safetensors', /bytes; the save wrote/);
    }
    // A new run from it is refused too.
    expectDamaged(
      await api.post('/v1/loops/runs', { session_id: run.session_id, base_model: run.base_model, lora_rank: 16, path }),
      path,
      real.id,
      'optimizer.safetensors',
      /bytes; the save wrote/,
    );
    expect(c.files.every((f) => f.sha256?.length === 64)).toBe(true);
  });

  it('a checkpoint saved before checksums is checked by its size only', async () => {
    const { dataDir, server, c, path, file } = await serverWithCheckpoint();
    await server.close();
    servers.splice(servers.indexOf(server), 1);
    // The record as a loops-mock before checksums wrote it.
    const db = openDatabase(join(dataDir, 'loops-mock.sqlite'));
    const old = { ...c, files: c.files.map(({ sha256: _, ...f }) => f) };
    db.prepare("UPDATE records SET data = ? WHERE kind = 'checkpoint' AND id = ?").run(JSON.stringify(old), c.id);
    db.close();
    flipBytes(file('adapter_model.safetensors'), 8);
    truncateSync(file('adapter_config.json'), 3);
    const again = await startTestServer({ dataDir });
    servers.push(again);
    const api = client(again);
    const same = await download(again, api, c.id, 'adapter_model.safetensors');
    expect(same.statusCode).toBe(200);
    const short = await download(again, api, c.id, 'adapter_config.json');
    expectDamaged({ status: short.statusCode, body: short.json() }, path, c.id, 'adapter_config.json', /is 3 bytes; the save wrote/);
  });

  it("the folder's manifest is no file of the checkpoint: never listed", async () => {
    const { server, api, c } = await serverWithCheckpoint();
    const listed = (await api.get(`/v1/loops/checkpoints/${c.id}/files`)).body.presigned_urls.map((f: any) => f.relative_file_name);
    expect(listed).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    expect(readdirSync(join(server.core.store.file, '..', 'checkpoints', c.id)).sort()).toEqual([
      '.loops-mock-checkpoint.json',
      'adapter_config.json',
      'adapter_model.safetensors',
    ]);
  });
});
