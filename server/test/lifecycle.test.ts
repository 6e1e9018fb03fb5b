import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock, type RunningServer } from '../index.js';
import { client, newRun, newSession, startTestServer, type Client } from './helpers.js';

let server: RunningServer;
let clock: ManualClock;
let api: Client;
afterEach(() => server?.close());

async function start(options: { coldStartMs?: number; deactivationMs?: number } = {}) {
  clock = new ManualClock();
  server = await startTestServer({ clock, ...options });
  api = client(server);
}

const samplerStatus = async (id: string) => (await api.get(`/v1/loops/samplers/${id}`)).body.sampler.status.name;
const deploymentStatus = async (id: string) => (await api.get(`/v1/loops/deployments/${id}`)).body.deployment.status.name;

describe('cold start', () => {
  it('walks a sampler BUILDING → DEPLOYING → LOADING_MODEL → ACTIVE and its trainer CREATED → DEPLOYING → RUNNING', async () => {
    await start({ coldStartMs: 3000 });
    const run = await newRun(api);
    expect(run.sampler.status.name).toBe('BUILDING');
    expect(await deploymentStatus(run.deployment_id)).toBe('CREATED');
    const seen: string[] = [];
    for (let t = 0; t < 4; t++) {
      seen.push(await samplerStatus(run.sampler.id));
      clock.advance(1000);
    }
    expect(seen).toEqual(['BUILDING', 'DEPLOYING', 'LOADING_MODEL', 'ACTIVE']);
    expect(await deploymentStatus(run.deployment_id)).toBe('RUNNING');
    const generic = await api.get(`/v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}`);
    expect(generic.body.status).toBe('ACTIVE');
  });

  it('reports a not-yet-deployed sampler with null autoscaling settings and no active replicas', async () => {
    await start({ coldStartMs: 3000 });
    const run = await newRun(api);
    const generic = await api.get(`/v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}`);
    expect(generic.body).toMatchObject({ status: 'BUILDING', active_replica_count: 0, autoscaling_settings: null });
  });

  it('is immediate by default', async () => {
    await start();
    const run = await newRun(api);
    expect(run.sampler.status.name).toBe('ACTIVE');
    expect(await deploymentStatus(run.deployment_id)).toBe('RUNNING');
  });

  it('a deactivation during the cold start stops the walk', async () => {
    await start({ coldStartMs: 3000 });
    const run = await newRun(api);
    clock.advance(1500);
    await api.post(`/v1/loops/runs/${run.id}/deactivate`);
    clock.advance(5000);
    expect(await samplerStatus(run.sampler.id)).toBe('INACTIVE');
    expect(await deploymentStatus(run.deployment_id)).toBe('STOPPED');
  });
});

describe('deactivation', () => {
  it('walks the paired sampler DEACTIVATING → INACTIVE while the run is INACTIVE at once', async () => {
    await start({ deactivationMs: 2000 });
    const run = await newRun(api);
    await api.post(`/v1/loops/runs/${run.id}/deactivate`);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
    expect(await samplerStatus(run.sampler.id)).toBe('DEACTIVATING');
    clock.advance(2000);
    expect(await samplerStatus(run.sampler.id)).toBe('INACTIVE');
  });

  it('is idempotent', async () => {
    await start();
    const run = await newRun(api);
    expect((await api.post(`/v1/loops/runs/${run.id}/deactivate`)).status).toBe(200);
    expect((await api.post(`/v1/loops/runs/${run.id}/deactivate`)).status).toBe(200);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
  });
});

describe('idle timeout', () => {
  it('stops a run after scale_down_delay_seconds without trainer requests; trainer requests keep it warm', async () => {
    await start();
    const idle = await newRun(api, { scale_down_delay_seconds: 60 });
    const busy = await newRun(api, { scale_down_delay_seconds: 60 });
    for (let i = 0; i < 3; i++) {
      clock.advance(40_000);
      await server.app.inject({ method: 'GET', url: `/trainer/${busy.id}/policy_version` });
    }
    const runs = Object.fromEntries((await api.get('/v1/loops/runs')).body.runs.map((r: any) => [r.id, r]));
    expect(runs[idle.id].status.name).toBe('INACTIVE');
    expect(runs[idle.id].sampler.status.name).toBe('SCALED_TO_ZERO');
    expect(await deploymentStatus(idle.deployment_id)).toBe('SCALED_TO_ZERO');
    expect(runs[busy.id].status.name).toBe('ACTIVE');
    clock.advance(60_000);
    expect((await api.get(`/v1/loops/runs/${busy.id}`)).body.run.status.name).toBe('INACTIVE');
    const logs = (await api.get(`/v1/loops/deployments/${idle.deployment_id}/logs`)).body.logs.map((l: any) => l.message);
    expect(logs.some((m: string) => m.includes('idle for 60s'))).toBe(true);
  });

  it('waits for the default hour', async () => {
    await start();
    const run = await newRun(api);
    clock.advance(3_599_000);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('ACTIVE');
    clock.advance(1000);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
  });
});

describe('reuse', () => {
  it('reuse_from_run_id moves a live trainer and sampler to the new run, retiring the old one', async () => {
    await start();
    const old = await newRun(api);
    const fresh = await newRun(api, { reuse_from_run_id: old.id });
    expect(fresh.deployment_id).toBe(old.deployment_id);
    expect(fresh.sampler.id).toBe(old.sampler.id);
    expect(fresh.id).not.toBe(old.id);
    expect((await api.get(`/v1/loops/runs/${old.id}`)).body.run.status.name).toBe('INACTIVE');
    const d = (await api.get(`/v1/loops/deployments/${old.deployment_id}`)).body.deployment;
    expect(d).toMatchObject({ active_run_id: fresh.id, latest_run_id: fresh.id, status: { name: 'RUNNING' } });
    // Deactivating the retired run leaves the shared trainer and sampler alone.
    await api.post(`/v1/loops/runs/${old.id}/deactivate`);
    expect(await samplerStatus(fresh.sampler.id)).toBe('ACTIVE');
  });

  it('reuse_from_session_id reuses the live run of that session and base model', async () => {
    await start();
    const old = await newRun(api);
    const fresh = await newRun(api, { reuse_from_session_id: old.session_id });
    expect(fresh.deployment_id).toBe(old.deployment_id);
    const otherModel = await newRun(api, { reuse_from_session_id: old.session_id, base_model: 'Qwen/Qwen3-8B' });
    expect(otherModel.deployment_id).not.toBe(old.deployment_id);
  });

  it('one trainer per session and base model: a second run of the same model in a session takes over its trainer', async () => {
    await start();
    const session = await newSession(api);
    const first = await newRun(api, { session_id: session });
    const second = await newRun(api, { session_id: session });
    expect(second.id).not.toBe(first.id);
    expect(second.deployment_id).toBe(first.deployment_id);
    expect(second.sampler.id).toBe(first.sampler.id);
    expect((await api.get(`/v1/loops/runs/${first.id}`)).body.run.status.name).toBe('INACTIVE');
    expect((await api.get(`/v1/loops/runs/${second.id}`)).body.run.status.name).toBe('ACTIVE');
    const logs = (await api.get(`/v1/loops/deployments/${first.deployment_id}/logs`)).body.logs.map((l: any) => l.message);
    expect(logs).toContain(`Run ${first.id} INACTIVE: replaced by run ${second.id}`);
    // A trainer-only run of that model takes it over too; another base model gets a trainer of its own.
    const trainerOnly = await newRun(api, { session_id: session }, '/v1/loops/trainers');
    expect(trainerOnly.deployment_id).toBe(first.deployment_id);
    expect((await api.get(`/v1/loops/runs/${second.id}`)).body.run.status.name).toBe('INACTIVE');
    const otherModel = await newRun(api, { session_id: session, base_model: 'Qwen/Qwen3-8B' });
    expect(otherModel.deployment_id).not.toBe(first.deployment_id);
    const live = (await api.get('/v1/loops/runs')).body.runs.filter((r: any) => r.session_id === session && r.status.name === 'ACTIVE');
    expect(live.map((r: any) => r.id).sort()).toEqual([trainerOnly.id, otherModel.id].sort());
  });

  it('replaces a dead run with a fresh trainer, and refuses a different base model', async () => {
    await start();
    const old = await newRun(api);
    await api.post(`/v1/loops/runs/${old.id}/deactivate`);
    const fresh = await newRun(api, { reuse_from_run_id: old.id });
    expect(fresh.deployment_id).not.toBe(old.deployment_id);
    expect(fresh.sampler.id).not.toBe(old.sampler.id);
    const live = await newRun(api);
    const mismatch = await api.post('/v1/loops/runs', { session_id: await newSession(api), base_model: 'Qwen/Qwen3-8B', reuse_from_run_id: live.id });
    expect(mismatch.status).toBe(400);
    expect(mismatch.body.error.field).toBe('reuse_from_run_id');
    expect((await api.post('/v1/loops/runs', { session_id: await newSession(api), base_model: 'Qwen/Qwen3-8B', reuse_from_run_id: 'zzzzzzz' })).status).toBe(
      404,
    );
  });

  it('a trainer-only run reusing a run with a sampler keeps that sampler', async () => {
    await start();
    const old = await newRun(api);
    const fresh = await newRun(api, { reuse_from_run_id: old.id }, '/v1/loops/trainers');
    expect(fresh.sampler.id).toBe(old.sampler.id);
  });
});

describe('what a stopped run leaves behind', () => {
  it("frees its sampler's weights on deactivation, keeping only its records, checkpoints and published version", async () => {
    await start();
    const run = await newRun(api, { lora_rank: 4 });
    const trainer = `/trainer/${run.id}`;
    const stepped = (await api.post(`${trainer}/optim_step`, {})).body.operation_id;
    expect((await api.get(`${trainer}/operations/${stepped}`)).body.status).toBe('done');
    const submitted = (await api.post(`${trainer}/save_weights_for_sampler`, { name: 'kept' })).body.operation_id;
    expect((await api.get(`${trainer}/operations/${submitted}`)).body.status).toBe('done');
    const sampler = server.core.fleet.findSampler(run.sampler.id)!;
    expect(server.core.samplerWeights.get(sampler.id)).toBeDefined();
    expect(server.core.replicas.replicaStates(sampler)).toHaveLength(1);
    await api.post(`/v1/loops/runs/${run.id}/deactivate`);
    // The adapter snapshot the sampler served, and its replicas with theirs, are gone.
    expect(server.core.samplerWeights.get(sampler.id)).toBeUndefined();
    expect(server.core.replicas.replicaStates(sampler)).toEqual([]);
    expect(server.core.replicas.publishedVersion(sampler)).toBe(1);
    expect((await api.get(`/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints).toHaveLength(1);
  });

  it("keeps a deployment's newest 10,000 log lines, not every request it ever served", async () => {
    await start();
    const run = await newRun(api, { lora_rank: 4 });
    for (let i = 0; i < 11_000; i++) server.core.logs.add(run.deployment_id, 'INFO', `line ${i}`, 'trainer-0', `req-${i}`);
    const stored = server.core.logs.query({ deploymentId: run.deployment_id, direction: 'asc', limit: 20_000 });
    expect(stored.length).toBeLessThanOrEqual(10_500);
    expect(stored.length).toBeGreaterThanOrEqual(10_000);
    expect(stored.at(-1)!.message).toBe('line 10999');
  });
});
