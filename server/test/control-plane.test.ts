import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { VERSION } from '../index.js';
import { client, fakeCheckpointFiles, newRun, newSession, startTestServer, type Client } from './helpers.js';

let server: RunningServer;
let api: Client;

beforeEach(async () => {
  server = await startTestServer();
  api = client(server);
});
afterEach(() => server.close());

describe('sessions', () => {
  it('creates with no body, {} or a training_project_id, and reads back', async () => {
    for (const body of [undefined, {}, { training_project_id: 'tp1' }, '']) {
      const res = await api.post('/v1/loops/sessions', body);
      expect(res.status).toBe(200);
      expect(res.body.session.id).toMatch(/^[a-z0-9]{7}$/);
      const got = await api.get(`/v1/loops/sessions/${res.body.session.id}`);
      expect(got.body).toEqual(res.body);
    }
  });

  it('answers 404 for an unknown session', async () => {
    const res = await api.get('/v1/loops/sessions/nope123');
    expect(res.status).toBe(404);
    expect(res.body.error.type).toBe('not_found');
  });
});

describe('runs', () => {
  it('POST /runs creates a trainer with a paired, active sampler and URLs into this server', async () => {
    const run = await newRun(api, { name: 'campaign' });
    expect(run.id).toMatch(/^[a-z0-9]{7}$/);
    expect(run.name).toBe('campaign');
    expect(run.status).toEqual({ name: 'ACTIVE' });
    expect(run.base_url).toBe(`${server.url}/trainer/${run.id}`);
    expect(run.sampler.base_url).toBe(`${server.url}/sampler/${run.sampler.id}`);
    expect(run.sampler.status).toEqual({ name: 'ACTIVE' });
    expect(run.sampler.model_id).toMatch(/^[a-z0-9]{8}$/);
    expect(run.deployment_id).toMatch(/^[a-z0-9]{7}$/);
    expect(new Date(run.created_at).toISOString()).toBe(run.created_at);
    expect(run.user.email).toContain('@');
  });

  it('defaults the name to the base model', async () => {
    const run = await newRun(api);
    expect(run.name).toBe('Qwen/Qwen3.5-2B');
  });

  it('POST /trainers creates a trainer only; POST /samplers {run_id} pairs one later', async () => {
    const run = await newRun(api, {}, '/v1/loops/trainers');
    expect(run.sampler).toBeNull();
    const paired = await api.post('/v1/loops/samplers', { session_id: run.session_id, run_id: run.id });
    expect(paired.status).toBe(200);
    expect(paired.body.sampler.base_model).toBe(run.base_model);
    const again = await api.post('/v1/loops/samplers', { session_id: run.session_id, run_id: run.id });
    expect(again.body.sampler.id).toBe(paired.body.sampler.id);
    const got = await api.get(`/v1/loops/runs/${run.id}`);
    expect(got.body.run.sampler.id).toBe(paired.body.sampler.id);
  });

  it('GET /runs filters by run_id and base_model and includes inactive runs', async () => {
    const a = await newRun(api);
    const b = await newRun(api, { base_model: 'Qwen/Qwen3-8B' });
    await api.post(`/v1/loops/runs/${a.id}/deactivate`);
    const all = await api.get('/v1/loops/runs');
    expect(all.body.runs.map((r: any) => r.id).sort()).toEqual([a.id, b.id].sort());
    expect((await api.get(`/v1/loops/runs?run_id=${a.id}`)).body.runs.map((r: any) => r.status.name)).toEqual(['INACTIVE']);
    expect((await api.get('/v1/loops/runs?base_model=Qwen/Qwen3-8B')).body.runs.map((r: any) => r.id)).toEqual([b.id]);
    expect((await api.get('/v1/loops/runs?base_model=Qwen/Qwen3-0.6B')).body.runs).toEqual([]);
  });

  it('deactivation stops the run and its paired sampler and keeps checkpoints', async () => {
    const run = await newRun(api);
    server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', 'final', fakeCheckpointFiles(), null);
    const res = await api.post(`/v1/loops/runs/${run.id}/deactivate`);
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ id: run.id, base_model: run.base_model, user: run.user });
    const got = (await api.get(`/v1/loops/runs/${run.id}`)).body.run;
    expect(got.status.name).toBe('INACTIVE');
    expect(got.sampler.status.name).toBe('INACTIVE');
    expect((await api.get(`/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints).toHaveLength(1);
    const sampler = await api.post('/v1/loops/samplers', { session_id: run.session_id, run_id: run.id });
    expect(sampler.status).toBe(400);
    expect(sampler.body.error.message).toContain('INACTIVE');
  });

  it('validates the request against the model', async () => {
    const sessionId = await newSession(api);
    const cases: [Record<string, unknown>, string][] = [
      [{ base_model: 'gpt-4' }, 'base_model'],
      [{ base_model: 'Qwen/Qwen3-0.6B', max_seq_len: 8193 }, 'max_seq_len'],
      [{ base_model: 'Qwen/Qwen3-0.6B', max_seq_len: 0 }, 'max_seq_len'],
      [{ base_model: 'Qwen/Qwen3-0.6B', lora_rank: 129 }, 'lora_rank'],
      [{ base_model: 'Qwen/Qwen3-0.6B', lora_rank: 0 }, 'lora_rank'],
      [{ base_model: 'Qwen/Qwen3-0.6B', scale_down_delay_seconds: 0 }, 'scale_down_delay_seconds'],
      [{ base_model: 'Qwen/Qwen3-0.6B', scale_down_delay_seconds: 3601 }, 'scale_down_delay_seconds'],
      [{ base_model: 'Qwen/Qwen3-0.6B', availability_model: 'preemptible' }, 'availability_model'],
      [{ base_model: 'Qwen/Qwen3-0.6B', replicas: 0 }, 'replicas'],
      [{ base_model: 'Qwen/Qwen3-0.6B', name: '' }, 'name'],
      [{ base_model: 'Qwen/Qwen3-0.6B', path: 'bt://loops:abc/weights/../x' }, 'path'],
      [{ base_model: 'Qwen/Qwen3-0.6B', path: 'bt://loops:abcdefg/weights/missing' }, 'path'],
    ];
    for (const [body, field] of cases) {
      const res = await api.post('/v1/loops/runs', { session_id: sessionId, ...body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.error.field, JSON.stringify(body)).toContain(field);
    }
    const unknownSession = await api.post('/v1/loops/runs', { session_id: 'zzzzzzz', base_model: 'Qwen/Qwen3-0.6B' });
    expect(unknownSession.status).toBe(404);
    expect(unknownSession.body.error.field).toBe('session_id');
  });

  it('lists every supported model when base_model is unknown', async () => {
    const res = await api.post('/v1/loops/runs', { session_id: await newSession(api), base_model: 'meta/llama' });
    expect(res.body.error.supported).toContain('Qwen/Qwen3.5-2B');
    expect(res.body.error.message).toContain('moonshotai/Kimi-K2.6');
  });

  it('loads a run from a trainer checkpoint path of the same base model only', async () => {
    const source = await newRun(api);
    server.core.checkpoints.save(server.core.fleet.findRun(source.id)!, 'trainer', 'step-1', fakeCheckpointFiles(), null);
    server.core.checkpoints.save(server.core.fleet.findRun(source.id)!, 'sampler', 'step-1', fakeCheckpointFiles(), null);
    const ok = await newRun(api, { path: `bt://loops:${source.id}/weights/step-1` });
    expect(ok.status.name).toBe('ACTIVE');
    const sessionId = await newSession(api);
    const wrongModel = await api.post('/v1/loops/runs', { session_id: sessionId, base_model: 'Qwen/Qwen3-8B', path: `bt://loops:${source.id}/weights/step-1` });
    expect(wrongModel.status).toBe(400);
    expect(wrongModel.body.error.message).toContain('Qwen/Qwen3.5-2B');
    const samplerPath = await api.post('/v1/loops/runs', {
      session_id: sessionId,
      base_model: 'Qwen/Qwen3.5-2B',
      path: `bt://loops:${source.id}/sampler_weights/step-1`,
    });
    expect(samplerPath.status).toBe(400);
    expect(samplerPath.body.error.message).toContain('trainer checkpoint');
  });
});

describe('samplers', () => {
  it('creates a standalone sampler, lists newest first, and gets by id', async () => {
    const sessionId = await newSession(api);
    const a = await api.post('/v1/loops/samplers', { session_id: sessionId, base_model: 'Qwen/Qwen3-8B' });
    const b = await api.post('/v1/loops/samplers', { session_id: sessionId, base_model: 'Qwen/Qwen3-8B', max_seq_length: 4096 });
    expect(a.status).toBe(200);
    expect(a.body.sampler.status.name).toBe('ACTIVE');
    const list = await api.get('/v1/loops/samplers');
    expect(list.body.samplers.map((s: any) => s.id)).toEqual([b.body.sampler.id, a.body.sampler.id]);
    expect((await api.get(`/v1/loops/samplers/${a.body.sampler.id}`)).body.sampler.id).toBe(a.body.sampler.id);
    expect((await api.get('/v1/loops/samplers/nothere')).status).toBe(404);
  });

  it('rejects bad combinations naming the field', async () => {
    const sessionId = await newSession(api);
    const run = await newRun(api, { session_id: sessionId });
    const cases: [Record<string, unknown>, string][] = [
      [{}, 'base_model'],
      [{ base_model: 'nope' }, 'base_model'],
      [{ base_model: 'Qwen/Qwen3-8B', max_seq_length: 200000 }, 'max_seq_length'],
      [{ run_id: run.id, base_model: 'Qwen/Qwen3-8B' }, 'base_model'],
      [{ base_model: 'Qwen/Qwen3-8B', model_path: 'weights/x' }, 'model_path'],
      [{ base_model: 'Qwen/Qwen3-8B', model_path: `bt://loops:${run.id}/sampler_weights/none` }, 'model_path'],
    ];
    for (const [body, field] of cases) {
      const res = await api.post('/v1/loops/samplers', { session_id: sessionId, ...body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.error.field, JSON.stringify(body)).toContain(field);
    }
    expect((await api.post('/v1/loops/samplers', { session_id: sessionId, run_id: 'zzzzzzz' })).status).toBe(404);
  });

  it('serves a sampler checkpoint as a standalone sampler and reuses one from a session', async () => {
    const run = await newRun(api);
    server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'sampler', 'final', fakeCheckpointFiles(), null);
    const path = `bt://loops:${run.id}/sampler_weights/final`;
    const first = await api.post('/v1/loops/samplers', { session_id: run.session_id, base_model: run.base_model, model_path: path });
    expect(first.status).toBe(200);
    const reused = await api.post('/v1/loops/samplers', {
      session_id: await newSession(api),
      base_model: run.base_model,
      model_path: path,
      reuse_from_session_id: run.session_id,
    });
    expect(reused.body.sampler.id).toBe(first.body.sampler.id);
  });

  it('reaches samplers through the generic model-deployment API', async () => {
    const run = await newRun(api);
    const { model_id, deployment_id } = run.sampler;
    const base = `/v1/models/${model_id}/deployments/${deployment_id}`;
    const got = await api.get(base);
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ id: deployment_id, model_id, status: 'ACTIVE', active_replica_count: 1 });
    expect(got.body.autoscaling_settings).not.toBeNull();

    const renamed = await api.patch(base, { name: 'my-sampler.v2' });
    expect(renamed.body.name).toBe('my-sampler.v2');
    expect((await api.patch(base, { name: 'has space' })).status).toBe(400);
    expect((await api.patch(base, { nickname: 'x' })).status).toBe(400);
    expect((await api.patch(base, { name: null })).body.name).toBe('my-sampler.v2');

    expect((await api.post(`${base}/deactivate`)).body).toEqual({ success: true });
    expect((await api.get(base)).body.status).toBe('INACTIVE');
    expect((await api.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('ACTIVE');

    expect((await api.delete(base)).body).toEqual({ id: deployment_id, deleted: true, model_id });
    expect((await api.get(base)).status).toBe(404);
    expect((await api.get(`/v1/models/${model_id}/deployments/zzzzzzz`)).status).toBe(404);
    expect((await api.get(`/v1/models/zzzzzzzz/deployments/${deployment_id}`)).status).toBe(404);
  });
});

describe('deployments', () => {
  it('lists, gets, logs, meters and deactivates', async () => {
    const run = await newRun(api);
    const list = await api.get('/v1/loops/deployments');
    expect(list.body.deployments).toHaveLength(1);
    const d = list.body.deployments[0];
    expect(d).toMatchObject({
      id: run.deployment_id,
      active_run_id: run.id,
      latest_run_id: run.id,
      base_model: run.base_model,
      base_url: run.base_url,
      status: { name: 'RUNNING' },
    });
    expect(d.sampler.id).toBe(run.sampler.id);
    expect((await api.get(`/v1/loops/deployments/${d.id}`)).body.deployment.id).toBe(d.id);

    // Trainer traffic shows up in logs and metrics.
    for (let i = 0; i < 3; i++) await server.app.inject({ method: 'POST', url: `/trainer/${run.id}/forward`, payload: {} });
    const logs = await api.get(`/v1/loops/deployments/${d.id}/logs`);
    const messages = logs.body.logs.map((l: any) => l.message);
    expect(messages.some((m: string) => m.includes(`Run ${run.id}`))).toBe(true);
    expect(messages.filter((m: string) => m.startsWith('POST /forward -> 400'))).toHaveLength(3);
    expect(logs.body.logs[0].timestamp).toMatch(/^\d{19}$/);
    const warnings = await api.get(`/v1/loops/deployments/${d.id}/logs?min_level=WARNING&direction=desc&limit=2`);
    expect(warnings.body.logs).toHaveLength(2);
    expect(warnings.body.logs.every((l: any) => l.level === 'WARNING')).toBe(true);
    expect((await api.get(`/v1/loops/deployments/${d.id}/logs?limit=0`)).status).toBe(400);
    expect((await api.get(`/v1/loops/deployments/${d.id}/logs?min_level=TRACE`)).status).toBe(400);

    const metrics = await api.post(`/v1/loops/deployments/${d.id}/metrics`, {
      step_seconds: 60,
      start_epoch_millis: Date.now() - 120_000,
      end_epoch_millis: Date.now() + 1000,
    });
    expect(metrics.status).toBe(200);
    const volume = metrics.body.metrics.inference_volume_by_status;
    const total4xx = volume.reduce((s: number, p: any) => s + p.status_4xx * 60, 0);
    expect(Math.round(total4xx)).toBe(3);
    expect(metrics.body.metrics.cpu_memory_usage_bytes.length).toBeGreaterThan(0);
    expect((await api.post(`/v1/loops/deployments/${d.id}/metrics`)).status).toBe(200);
    expect((await api.post(`/v1/loops/deployments/${d.id}/metrics`, { start_epoch_millis: 10, end_epoch_millis: 5 })).status).toBe(400);

    const off = await api.post(`/v1/loops/deployments/${d.id}/deactivate`);
    expect(off.body).toEqual({ id: d.id, base_model: run.base_model, user: run.user });
    const after = (await api.get(`/v1/loops/deployments/${d.id}`)).body.deployment;
    expect(after.status.name).toBe('STOPPED');
    expect(after.active_run_id).toBeNull();
    expect(after.latest_run_id).toBe(run.id);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
  });
});

describe('account routes', () => {
  it('lists capabilities from the model registry', async () => {
    const res = await api.get('/v1/loops/capabilities');
    const models = res.body.supported_models;
    expect(models).toHaveLength(19);
    expect(models.find((m: any) => m.model_name === 'Qwen/Qwen3-0.6B')).toEqual({
      model_name: 'Qwen/Qwen3-0.6B',
      max_context_length: 8192,
      supports_vision_language: false,
      serverless: false,
    });
  });

  it('patches user_config with JSON merge patch semantics', async () => {
    expect((await api.get('/v1/loops/user_config')).body.user_config).toEqual({ trainer_accelerator_priority: null, sampler_accelerator_priority: null });
    const set = await api.patch('/v1/loops/user_config', { trainer_accelerator_priority: ['H200', 'H100'] });
    expect(set.body.user_config).toEqual({ trainer_accelerator_priority: ['H200', 'H100'], sampler_accelerator_priority: null });
    const other = await api.patch('/v1/loops/user_config', { sampler_accelerator_priority: ['H100'] });
    expect(other.body.user_config.trainer_accelerator_priority).toEqual(['H200', 'H100']);
    const cleared = await api.patch('/v1/loops/user_config', { trainer_accelerator_priority: null });
    expect(cleared.body.user_config).toEqual({ trainer_accelerator_priority: null, sampler_accelerator_priority: ['H100'] });
    const empty = await api.patch('/v1/loops/user_config', { sampler_accelerator_priority: [] });
    expect(empty.status).toBe(400);
    expect(empty.body.error.field).toBe('sampler_accelerator_priority');
    expect((await api.patch('/v1/loops/user_config', { sampler_accelerator_priority: ['H100', 'H100'] })).status).toBe(400);
    expect((await api.patch('/v1/loops/user_config', { gpu: ['H100'] })).status).toBe(400);
    expect((await api.get('/v1/loops/user_config')).body.user_config.sampler_accelerator_priority).toEqual(['H100']);
  });

  it('lists teams, filtered by name', async () => {
    const teams = (await api.get('/v1/teams')).body.teams;
    expect(teams).toHaveLength(1);
    expect(teams[0]).toMatchObject({ name: 'Default Team', default: true });
    expect((await api.get('/v1/teams?name=Default%20Team')).body.teams).toHaveLength(1);
    expect((await api.get('/v1/teams?name=other')).body.teams).toHaveLength(0);
  });
});

describe('every response', () => {
  it('carries the version header, on success, on errors and on unknown routes', async () => {
    for (const res of [
      await api.get('/v1/loops/capabilities'),
      await api.get('/v1/loops/runs/none'),
      await api.get('/nowhere'),
      await client(server, null).get('/v1/loops/runs'),
    ]) {
      expect(res.headers['x-loops-mock-version']).toBe(VERSION);
    }
  });

  it('serves an OpenAPI document listing every control-plane route', async () => {
    const doc = (await api.get('/openapi.json')).body;
    expect(doc.openapi).toBe('3.1.0');
    expect(Object.keys(doc.paths)).toEqual(
      expect.arrayContaining([
        '/v1/loops/runs',
        '/v1/loops/runs/{run_id}',
        '/v1/teams/{team_id}/loops/trainers',
        '/v1/models/{model_id}/deployments/{deployment_id}/deactivate',
      ]),
    );
    expect(doc.paths['/v1/loops/runs'].post.requestBody.content['application/json'].schema.required).toEqual(['session_id', 'base_model']);
  });

  it('gives every operation a unique operationId and declares the headers the protocol relies on', async () => {
    const doc = (await api.get('/openapi.json')).body;
    const operations = Object.entries<Record<string, any>>(doc.paths).flatMap(([path, item]) =>
      Object.entries<any>(item).map(([method, op]) => ({ path, method, op })),
    );
    expect(operations.length).toBeGreaterThan(50);
    const ids = operations.map((o) => o.op.operationId);
    expect(ids.every((id) => typeof id === 'string' && /^[a-z][A-Za-z0-9]+$/.test(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    expect(doc.paths['/v1/loops/runs/{run_id}'].get.operationId).toBe('getV1LoopsRunsByRunId');
    const headersOf = (path: string, method: string) => doc.paths[path][method].parameters.filter((p: any) => p.in === 'header').map((p: any) => p.name);
    expect(headersOf('/trainer/{run_id}/forward_backward', 'post')).toEqual(['Idempotency-Key']);
    expect(headersOf('/trainer/{run_id}/operations/{operation_id}', 'get')).toEqual([]);
    for (const route of ['/sampler/{sampler_id}/sample', '/sampler/{sampler_id}/compute_logprobs', '/sampler/{sampler_id}/v1/completions']) {
      expect(headersOf(route, 'post')).toEqual(['X-Min-Policy-Version', 'X-Affinity-Key']);
    }
    expect(doc.paths['/sampler/{sampler_id}/sample'].post.responses['4XX'].headers['Retry-After']).toBeTruthy();
    expect(doc.paths['/healthz'].get.security).toEqual([]);
  });

  it('answers unknown trainer and sampler ids with 404', async () => {
    expect((await server.app.inject({ method: 'GET', url: '/trainer/zzzzzzz/health' })).statusCode).toBe(404);
    expect((await server.app.inject({ method: 'GET', url: '/sampler/zzzzzzz/health' })).statusCode).toBe(404);
  });
});
