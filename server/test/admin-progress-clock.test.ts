import { existsSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer, StartOptions } from '../index.js';
import { startAdmin, type Api, fb, sampleBody, sleep, newRun, submitAndPoll } from './admin-helpers.js';

let server: RunningServer;
afterEach(() => server?.close());

async function start(options: StartOptions = {}) {
  const started = await startAdmin(options);
  server = started.server;
  return started;
}

describe('operation progress', () => {
  /** A run whose engine has already built its graphs, so compute time does not blur poll counts. */
  async function warmRun(api: Api) {
    const r = await newRun(api);
    await submitAndPoll(api, r.trainer, 'forward_backward', fb, 'warm-up');
    return r;
  }

  it('after_polls: the result is released on the Nth poll, earlier polls answer 408 after their window', async () => {
    const { api, admin } = await start({ longPollMs: 1000 });
    const { trainer } = await warmRun(api);
    await admin.addProgress({ match: { op: 'forward' }, mode: 'after_polls', polls: 3 });
    const result = await submitAndPoll(api, trainer, 'forward', fb, 'p-1');
    expect(result.statuses).toEqual([408, 408, 200]);
    // Other operations complete at once.
    expect((await submitAndPoll(api, trainer, 'forward_backward', fb, 'p-2')).statuses).toEqual([200]);
  });

  it("manual: held until released, and the run's next operation waits behind it", async () => {
    const { api, admin } = await start({ longPollMs: 300 });
    const { trainer } = await warmRun(api);
    await admin.addProgress({ match: { op: 'forward_backward' }, mode: 'manual', times: 1 });
    const held = (await api.call('POST', `${trainer}/forward_backward`, fb, { 'idempotency-key': 'm-1' })).body.operation_id;
    const next = (await api.call('POST', `${trainer}/optim_step`, {}, { 'idempotency-key': 'm-2' })).body.operation_id;
    expect((await api.call('GET', `${trainer}/operations/${held}`)).status).toBe(408);
    expect((await api.call('GET', `${trainer}/operations/${next}`)).status).toBe(408);
    expect((await admin.heldOperations()).map((h) => h.operation_id)).toEqual([held]);
    await admin.release(held);
    expect((await submitAndPoll(api, trainer, 'forward_backward', fb, 'm-1')).final.body.status).toBe('done');
    expect((await submitAndPoll(api, trainer, 'optim_step', {}, 'm-2')).final.body).toMatchObject({ status: 'done', result: { policy_version: 1 } });
    await expect(admin.release(held)).rejects.toThrow(/409/);
  });

  it('after_ms on the virtual clock: a waiting poll is answered when time is moved past the release', async () => {
    const { api, admin } = await start({ clock: 'virtual', longPollMs: 10_000 });
    const { trainer } = await newRun(api);
    await admin.addProgress({ match: { op: 'forward' }, mode: 'after_ms', ms: 15_000 });
    const id = (await api.call('POST', `${trainer}/forward`, fb, { 'idempotency-key': 't-1' })).body.operation_id;
    const poll = api.call('GET', `${trainer}/operations/${id}`);
    await sleep(200);
    await admin.advanceClock(10_000);
    expect((await poll).status).toBe(408);
    const second = api.call('GET', `${trainer}/operations/${id}`);
    await sleep(200);
    await admin.advanceClock(5_000);
    expect((await second).body.status).toBe('done');
  });
});

describe('sampler replica control', () => {
  it("sets the replica count, pauses and resumes a replica's sync, and gives one replica its own delay", async () => {
    const { api, admin } = await start({ clock: 'virtual', floorWaitMs: 0 });
    const { trainer, sampler, samplerId: id } = await newRun(api);
    expect((await api.call('POST', `${sampler}/sample`, sampleBody)).status).toBe(200);
    expect((await admin.setReplicas(id, 2)).replicas.map((r) => r.replica)).toEqual([0, 1]);
    await admin.controlReplica(id, 0, { paused: true });
    await admin.controlReplica(id, 1, { sync_delay_ms: 5000 });
    await submitAndPoll(api, trainer, 'forward_backward', fb, 's-1');
    await submitAndPoll(api, trainer, 'optim_step', {}, 's-2');
    await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'v1' }, 's-3');
    let state = await admin.sampler(id);
    expect(state.published_version).toBe(1);
    expect(state.replicas.map((r) => [r.policy_version, r.pending_version, r.syncing_version, r.paused])).toEqual([
      [0, 1, null, true],
      [0, null, 1, false],
    ]);
    const refused = await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' });
    expect(refused.status).toBe(408);
    expect(refused.body.error.replicas).toEqual([
      { replica: 0, policy_version: 0 },
      { replica: 1, policy_version: 0 },
    ]);
    await admin.advanceClock(5000);
    state = await admin.sampler(id);
    expect(state.replicas.map((r) => r.policy_version)).toEqual([0, 1]);
    await admin.controlReplica(id, 0, { paused: false });
    expect((await admin.sampler(id)).replicas.map((r) => r.policy_version)).toEqual([1, 1]);
    const served = await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' });
    expect(served.body.policy_version).toBe(1);
    await expect(admin.controlReplica(id, 5, { paused: true })).rejects.toThrow(/404/);
  });
});

describe('the virtual clock', () => {
  it('drives an hour-long idle timeout in milliseconds', async () => {
    const { api, admin } = await start({ clock: 'virtual' });
    const { run } = await newRun(api, { scale_down_delay_seconds: 3600 });
    const before = await admin.clock();
    await admin.advanceClock(3_599_000);
    expect((await api.call('GET', `/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('ACTIVE');
    await admin.advanceClock(1000);
    const after = (await api.call('GET', `/v1/loops/runs/${run.id}`)).body.run;
    expect(after.status.name).toBe('INACTIVE');
    expect((await admin.clock()).now_ms - before.now_ms).toBe(3_600_000);
  });

  it('refuses to move a real clock', async () => {
    const { admin } = await start();
    await expect(admin.advanceClock(10)).rejects.toThrow(/409/);
    expect((await admin.clock()).mode).toBe('real');
  });
});

describe('settings and reset', () => {
  it('changes settings at run time and refuses bad ones naming the field', async () => {
    const { api, admin } = await start({ clock: 'virtual' });
    expect((await admin.updateSettings({ cold_start_ms: 1000, weight_sync_delay_ms: [0, 10] })).cold_start_ms).toBe(1000);
    const { trainer } = await newRun(api);
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(503);
    await admin.advanceClock(1000);
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(200);
    const bad = await fetch(`${server.url}/_mock/settings`, {
      method: 'PATCH',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ long_poll_ms: 40_000 }),
    });
    expect([bad.status, (await bad.json()).error.field]).toEqual([400, 'body.long_poll_ms']);
  });

  it('reset empties the server, its data folder and its rules, and puts back the start-up settings', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'reset-'));
    const { api, admin } = await start({ dataDir });
    const { trainer } = await newRun(api);
    await submitAndPoll(api, trainer, 'save_state', { name: 'kept' }, 'r-1');
    expect(readdirSync(join(dataDir, 'checkpoints')).length).toBeGreaterThan(0);
    await admin.addFault({ action: { type: 'delay', ms: 1 } });
    await admin.addProgress({ mode: 'manual' });
    await admin.updateSettings({ cold_start_ms: 5 });
    await admin.reset();
    expect((await api.call('GET', '/v1/loops/runs')).body.runs).toEqual([]);
    expect(existsSync(join(dataDir, 'checkpoints'))).toBe(false);
    expect(await admin.faults()).toEqual([]);
    expect(await admin.progressRules()).toEqual([]);
    expect((await admin.settings()).cold_start_ms).toBe(0);
    expect((await admin.journal()).entries[0]!.path).toBe('/_mock/reset');
    // The fresh server works.
    const again = await newRun(api);
    expect((await submitAndPoll(api, again.trainer, 'forward', fb, 'r-2')).final.body.status).toBe('done');
  });
});

describe('shutdown with waits held open', () => {
  it('ends a long injected delay, a held poll and a floor wait on the virtual clock instead of hanging the close', async () => {
    const { api, admin } = await start({ clock: 'virtual', floorWaitMs: 600_000 });
    const { trainer, sampler } = await newRun(api);
    await admin.updateSettings({ weight_sync_delay_ms: 600_000 });
    await submitAndPoll(api, trainer, 'optim_step', {}, 'sd-0');
    await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'v1' }, 'sd-p');
    const op = (await api.call('POST', `${trainer}/forward`, fb, { 'idempotency-key': 'sd-1' })).body.operation_id;
    await admin.addFault({ match: { route: '/v1/loops/capabilities' }, action: { type: 'delay', ms: 600_000 } });
    await admin.addFault({ match: { op: 'forward' }, action: { type: 'hold_poll' } });
    const waits = [
      api.call('GET', '/v1/loops/capabilities').then((r) => r.status),
      api.call('GET', `${trainer}/operations/${op}`).then((r) => r.status),
      api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' }).then((r) => r.status),
    ];
    await sleep(300);
    const t0 = performance.now();
    await server.close();
    expect(performance.now() - t0).toBeLessThan(5000);
    const statuses = await Promise.all(waits.map((w) => w.catch(() => 0)));
    expect(statuses.slice(1)).toEqual([503, 503]);
    expect(statuses[0]).not.toBe(500);
  });
});

describe('state after injected failures', () => {
  it('a flaky client session ends consistent: every step counted once, every checkpoint listed and downloadable', async () => {
    const { api, admin } = await start();
    const { run, trainer } = await newRun(api);
    await admin.addFault({ match: { surface: 'trainer' }, action: { type: 'respond', status: 503 }, probability: 0.3, seed: 5 });
    await admin.addFault({ match: { surface: 'trainer', method: 'POST' }, action: { type: 'drop', phase: 'after' }, probability: 0.2, seed: 9 });
    /** A client that retries each call with the same key until it gets an answer. */
    const robust = async (op: string, body: unknown, key: string) => {
      for (let attempt = 0; attempt < 50; attempt++) {
        let submitted: Awaited<ReturnType<typeof api.call>>;
        try {
          submitted = await api.call('POST', `${trainer}/${op}`, body, { 'idempotency-key': key });
        } catch {
          continue;
        }
        if (submitted.status !== 200) continue;
        for (;;) {
          const polled = await api.call('GET', `${trainer}/operations/${submitted.body.operation_id}`);
          if (polled.status === 200) return polled.body;
          if (polled.status !== 408 && polled.status !== 503) break;
        }
      }
      throw new Error(`${op} never went through`);
    };
    for (let step = 0; step < 4; step++) {
      await robust('forward_backward', fb, `fb-${step}`);
      await robust('optim_step', {}, `os-${step}`);
      await robust('save_state', { name: `s${step}` }, `ss-${step}`);
    }
    await admin.clearFaults();
    expect((await api.call('GET', `${trainer}/policy_version`)).body.policy_version).toBe(4);
    const listed = (await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints as { checkpoint_id: string; id: string }[];
    expect(listed.map((c) => c.checkpoint_id).sort()).toEqual(['s0', 's1', 's2', 's3']);
    for (const c of listed) {
      const files = (await api.call('GET', `/v1/loops/checkpoints/${c.id}/files`)).body.presigned_urls as { url: string }[];
      expect(files.length).toBeGreaterThan(0);
      for (const f of files) expect((await fetch(f.url)).status).toBe(200);
    }
    expect((await admin.faults()).length).toBe(0);
  });
});
