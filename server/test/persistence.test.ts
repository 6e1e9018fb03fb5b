import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { client, fakeCheckpointFiles, newRun, startTestServer } from './helpers.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const tempDir = () => {
  const d = mkdtempSync(join(tmpdir(), 'loops-mock-'));
  dirs.push(d);
  return d;
};

describe('a data dir', () => {
  it('brings every record back after a restart; live runs come back INACTIVE with the reason logged', async () => {
    const dataDir = tempDir();
    const first = await startTestServer({ dataDir });
    const api = client(first);
    const run = await newRun(api, { name: 'survivor' });
    const trainerOnly = await newRun(api, {}, '/v1/loops/trainers');
    const stopped = await newRun(api);
    await api.post(`/v1/loops/runs/${stopped.id}/deactivate`);
    const standalone = (await api.post('/v1/loops/samplers', { session_id: run.session_id, base_model: 'Qwen/Qwen3-8B' })).body.sampler;
    await api.patch('/v1/loops/user_config', { trainer_accelerator_priority: ['H100'] });
    const ckpt = first.core.checkpoints.save(first.core.fleet.findRun(run.id)!, 'sampler', 'final', fakeCheckpointFiles(), { r: 16 });
    const filesBefore = (await api.get(`/v1/loops/checkpoints/${ckpt.id}/files`)).body.presigned_urls;
    await first.close();

    const second = await startTestServer({ dataDir });
    const again = client(second);
    const runs = Object.fromEntries((await again.get('/v1/loops/runs')).body.runs.map((r: any) => [r.id, r]));
    expect(Object.keys(runs).sort()).toEqual([run.id, trainerOnly.id, stopped.id].sort());
    expect(runs[run.id]).toMatchObject({ name: 'survivor', session_id: run.session_id, status: { name: 'INACTIVE' }, created_at: run.created_at });
    expect(runs[run.id].sampler.status.name).toBe('INACTIVE');
    expect((await again.get(`/v1/loops/sessions/${run.session_id}`)).status).toBe(200);
    expect((await again.get(`/v1/loops/samplers/${standalone.id}`)).body.sampler.status.name).toBe('INACTIVE');
    expect((await again.get(`/v1/loops/deployments/${run.deployment_id}`)).body.deployment.status.name).toBe('STOPPED');
    expect((await again.get('/v1/loops/user_config')).body.user_config.trainer_accelerator_priority).toEqual(['H100']);
    const logs = (await again.get(`/v1/loops/deployments/${run.deployment_id}/logs`)).body.logs.map((l: any) => l.message);
    expect(logs).toContain(`Run ${run.id} INACTIVE: server restarted`);

    // Checkpoints, their files and the URLs handed out before the restart all survive.
    const listed = (await again.get(`/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
    expect(listed.map((c: any) => c.id)).toEqual([ckpt.id]);
    const oldUrl = filesBefore.find((f: any) => f.relative_file_name === 'adapter_model.safetensors').url;
    const download = await second.app.inject({ method: 'GET', url: oldUrl.replace(/^http:\/\/[^/]+/, '') });
    expect(download.statusCode).toBe(200);
    expect(Buffer.from(download.rawPayload)).toEqual(Buffer.from(fakeCheckpointFiles()[1]!.data));
    expect((await again.post('/v1/loops/checkpoints/validate', { checkpoint_path: `bt://loops:${run.id}/sampler_weights/final` })).status).toBe(200);
    await second.close();
  });

  it('keeps the same user for the same key across restarts', async () => {
    const dataDir = tempDir();
    const first = await startTestServer({ dataDir });
    const run = await newRun(client(first, 'stable-key'));
    await first.close();
    const second = await startTestServer({ dataDir });
    expect((await client(second, 'stable-key').get('/v1/loops/runs')).body.runs.map((r: any) => r.id)).toEqual([run.id]);
    expect((await client(second, 'other-key').get('/v1/loops/runs')).body.runs).toEqual([]);
    await second.close();
  });

  it('writes checkpoint folders whole: no partial folder is left behind', async () => {
    const dataDir = tempDir();
    const server = await startTestServer({ dataDir });
    const run = await newRun(client(server));
    server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', 'a', fakeCheckpointFiles(3), null);
    server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', 'a', fakeCheckpointFiles(2), null);
    expect(readdirSync(join(dataDir, 'checkpoints')).filter((n) => n.includes('partial'))).toEqual([]);
    expect(readdirSync(join(dataDir, 'checkpoints'))).toHaveLength(1);
    await server.close();
  });

  it('without a data dir, state lives in memory only', async () => {
    const first = await startTestServer();
    await newRun(client(first, 'k'));
    await first.close();
    const second = await startTestServer();
    expect((await client(second, 'k').get('/v1/loops/runs')).body.runs).toEqual([]);
    await second.close();
  });
});

describe('checkpoint folders after a crash', () => {
  it('restore the previous version when a replacement was cut off, and drop unfinished writes', async () => {
    const { mkdirSync, renameSync, writeFileSync, existsSync } = await import('node:fs');
    const dataDir = tempDir();
    const first = await startTestServer({ dataDir });
    const run = await newRun(client(first));
    const ckpt = first.core.checkpoints.save(first.core.fleet.findRun(run.id)!, 'trainer', 'a', fakeCheckpointFiles(), null);
    await first.close();
    // Simulate a crash between moving the old folder aside and renaming the new one in.
    const root = join(dataDir, 'checkpoints');
    renameSync(join(root, ckpt.id), join(root, `.${ckpt.id}.previous`));
    mkdirSync(join(root, '.XXXXXXX.partial'));
    writeFileSync(join(root, '.XXXXXXX.partial', 'half'), 'x');
    const second = await startTestServer({ dataDir });
    expect(existsSync(join(root, '.XXXXXXX.partial'))).toBe(false);
    const files = (await client(second).get(`/v1/loops/checkpoints/${ckpt.id}/files`)).body.presigned_urls;
    const res = await second.app.inject({ method: 'GET', url: files[1].url.replace(/^http:\/\/[^/]+/, '') });
    expect(res.statusCode).toBe(200);
    await second.close();
  });
});

describe('shutdown with work in hand', () => {
  it('finishes and records what was running, fails what was queued (its poller told ServerShutdown) and writes nothing of it', async () => {
    const dataDir = tempDir();
    const first = await startTestServer({ dataDir, admin: true });
    const api = client(first);
    const run = await newRun(api, { lora_rank: 4 });
    const trainer = `/trainer/${run.id}`;
    // The first save is done and then held (a progress rule): the run's queue is busy with it when the server stops.
    first.core.progress.add({ mode: 'manual', match: { op: 'save_state' }, times: 1 });
    const running = (await api.post(`${trainer}/save_state`, { name: 'running' })).body.operation_id;
    const queued = (await api.post(`${trainer}/save_state`, { name: 'queued' })).body.operation_id;
    expect(first.core.operations.find(queued)!.status).toBe('queued');
    // A client long-polling the queued one while the server stops gets its end, not a hang.
    const poll = fetch(`${first.url}${trainer}/operations/${queued}`, { headers: { authorization: `Bearer ${first.apiKey}` } });
    await new Promise((r) => setTimeout(r, 100));
    const closing = first.close();
    const answer = await poll;
    // 503 (the SDK's ServerShutdownError), saying the operation was not run.
    expect(answer.status).toBe(503);
    expect(((await answer.json()) as any).error).toMatchObject({ type: 'shutting_down', operation_status: 'error', error_class: 'ServerShutdown' });
    await closing;
    expect(first.core.operations.find(running)?.status ?? 'done').toBe('done');

    // A folder left by a save whose record never landed (a crash between the two, its .saving marker still there) is not a checkpoint.
    // (One without a marker is kept and reported instead: server/test/data-dir-start.test.ts.)
    const folders = join(dataDir, 'checkpoints');
    mkdirSync(join(folders, 'Orphan1'));
    writeFileSync(join(folders, '.Orphan1.saving'), '');
    const second = await startTestServer({ dataDir });
    try {
      const listed = (await client(second).get(`/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
      expect(listed.map((c: any) => c.checkpoint_id)).toEqual(['running']);
      expect(readdirSync(folders)).toEqual([listed[0].id]);
    } finally {
      await second.close();
    }
  });
});
