import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { client, fakeCheckpointFiles, newRun, startTestServer, type Client } from './helpers.js';

let server: RunningServer;
let api: Client;

beforeEach(async () => {
  server = await startTestServer();
  api = client(server);
});
afterEach(() => server.close());
describe('checkpoints', () => {
  async function runWithCheckpoints(n = 2) {
    const run = await newRun(api);
    const record = server.core.fleet.findRun(run.id)!;
    const trainer = server.core.checkpoints.save(record, 'trainer', 'final', fakeCheckpointFiles(n), { r: 16 });
    const sampler = server.core.checkpoints.save(record, 'sampler', 'final', fakeCheckpointFiles(2), { r: 16 });
    return { run, trainer, sampler };
  }

  it('lists by exactly one filter', async () => {
    const { run, trainer, sampler } = await runWithCheckpoints();
    const byRun = await api.get(`/v1/loops/checkpoints?run_id=${run.id}`);
    expect(byRun.body.checkpoints.map((c: any) => c.id).sort()).toEqual([trainer.id, sampler.id].sort());
    const t = byRun.body.checkpoints.find((c: any) => c.target === 'trainer');
    expect(t).toMatchObject({
      checkpoint_id: 'final',
      checkpoint_type: 'lora',
      base_model: run.base_model,
      run_id: run.id,
      sync_status: null,
      lora_adapter_config: { r: 16 },
    });
    expect(byRun.body.checkpoints.find((c: any) => c.target === 'sampler')).toMatchObject({
      checkpoint_id: 'final',
      checkpoint_type: 'lora',
      sync_status: null,
    });
    expect(t.id).toMatch(/^[A-Za-z0-9]{7}$/);
    expect(t.size_bytes).toBe(fakeCheckpointFiles(2).reduce((s, f) => s + f.data.byteLength, 0));
    expect((await api.get(`/v1/loops/checkpoints?base_model=${run.base_model}`)).body.checkpoints).toHaveLength(2);
    const byPath = await api.get(`/v1/loops/checkpoints?checkpoint_path=${encodeURIComponent(`bt://loops:${run.id}/sampler_weights/final`)}`);
    expect(byPath.body.checkpoints.map((c: any) => c.id)).toEqual([sampler.id]);
    for (const query of ['', `?run_id=${run.id}&base_model=${run.base_model}`]) {
      const res = await api.get(`/v1/loops/checkpoints${query}`);
      expect(res.status).toBe(400);
      expect(res.body.error.message).toContain('exactly one');
    }
    expect((await api.get('/v1/loops/checkpoints?checkpoint_path=s3://bucket/x')).status).toBe(400);
  });

  it('validates paths: 200 for a real one, 400 for malformed, missing or foreign', async () => {
    const { run } = await runWithCheckpoints();
    expect((await api.post('/v1/loops/checkpoints/validate', { checkpoint_path: `bt://loops:${run.id}/sampler_weights/final` })).body).toEqual({});
    for (const bad of ['nonsense', `bt://loops:${run.id}/sampler_weights/other`, `bt://loops:${run.id}/sampler_weights/../../etc`]) {
      const res = await api.post('/v1/loops/checkpoints/validate', { checkpoint_path: bad });
      expect(res.status, bad).toBe(400);
      expect(res.body.error.field).toBe('checkpoint_path');
    }
    const other = client(server, 'someone-else');
    expect((await other.post('/v1/loops/checkpoints/validate', { checkpoint_path: `bt://loops:${run.id}/sampler_weights/final` })).status).toBe(400);
  });

  it('pages files with an integer page_token and serves their bytes through signed URLs', async () => {
    const { trainer } = await runWithCheckpoints(5);
    const first = await api.get(`/v1/loops/checkpoints/${trainer.id}/files?page_size=2`);
    expect(first.body.total_count).toBe(5);
    expect(first.body.next_page_token).toBe(2);
    const names: string[] = first.body.presigned_urls.map((f: any) => f.relative_file_name);
    let token = first.body.next_page_token;
    while (token !== null) {
      const page = await api.get(`/v1/loops/checkpoints/${trainer.id}/files?page_size=2&page_token=${token}`);
      names.push(...page.body.presigned_urls.map((f: any) => f.relative_file_name));
      token = page.body.next_page_token;
    }
    expect(names).toEqual(fakeCheckpointFiles(5).map((f) => f.relative_file_name));

    const all = await api.get(`/v1/loops/checkpoints/${trainer.id}/files`);
    expect(all.body.next_page_token).toBeNull();
    const file = all.body.presigned_urls.find((f: any) => f.relative_file_name === 'adapter_model.safetensors');
    expect(file.url.startsWith(server.url)).toBe(true);
    const download = await server.app.inject({ method: 'GET', url: file.url.slice(server.url.length) });
    expect(download.statusCode).toBe(200);
    expect(Buffer.from(download.rawPayload)).toEqual(Buffer.from(fakeCheckpointFiles(2)[1]!.data));
    expect(download.rawPayload.length).toBe(file.size_bytes);

    const tampered = file.url.slice(server.url.length).replace(/signature=(.)/, (_: string, c: string) => `signature=${c === 'A' ? 'B' : 'A'}`);
    expect((await server.app.inject({ method: 'GET', url: tampered })).statusCode).toBe(403);
    const otherFile = file.url.slice(server.url.length).replace('adapter_model.safetensors', 'adapter_config.json');
    expect((await server.app.inject({ method: 'GET', url: otherFile })).statusCode).toBe(403);
    const foreign = await server.app.inject({ method: 'GET', url: file.url.slice(server.url.length), headers: { authorization: 'Bearer another-org' } });
    expect(foreign.statusCode).toBe(403);
    expect((await api.get(`/v1/loops/checkpoints/${trainer.id}/files?page_token=-1`)).status).toBe(400);
    expect((await client(server, 'another-org').get(`/v1/loops/checkpoints/${trainer.id}/files`)).status).toBe(404);
  });

  it('saving an existing name replaces its files and keeps its id', async () => {
    const { run, trainer } = await runWithCheckpoints();
    const again = server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', 'final', fakeCheckpointFiles(3), null);
    expect(again.id).toBe(trainer.id);
    expect((await api.get(`/v1/loops/checkpoints/${trainer.id}/files`)).body.total_count).toBe(3);
    expect(() => server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', '../escape', fakeCheckpointFiles(), null)).toThrow(
      /safe checkpoint name/,
    );
  });
});
