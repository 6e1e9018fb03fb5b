import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { MockAdmin, type RunningServer, type StartOptions } from '../index.js';
import { MockAdminError } from '../index.js';
import { shippedScenarioNames } from '../admin/scenario.js';
import { http, startTestServer, wireDatum } from './helpers.js';

const MODEL = 'Qwen/Qwen3.5-2B';
const KEY = 'admin-test-key';
let server: RunningServer;
afterEach(() => server?.close());

async function start(options: StartOptions = {}) {
  server = await startTestServer({ admin: true, ...options });
  return { api: http(server.url, KEY), admin: new MockAdmin(server.url, options.adminToken) };
}

type Api = ReturnType<typeof http>;
const data = [wireDatum([1, 2, 3, 4, 5], [2, 3, 4, 5, 6])];
const fb = { data, loss_fn: 'cross_entropy' };
const sampleBody = { prompt: { chunks: [{ type: 'encoded_text', tokens: [1, 2, 3] }] }, num_samples: 1, sampling_params: { max_tokens: 2, seed: 1 } };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function newRun(api: Api, extra: Record<string, unknown> = {}) {
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 4, seed: 1, ...extra });
  if (res.status !== 200) throw new Error(JSON.stringify(res.body));
  const sampler = new URL(res.body.run.sampler.base_url).pathname;
  return { run: res.body.run, trainer: new URL(res.body.run.base_url).pathname, sampler, samplerId: sampler.split('/')[2]! };
}

/** Submits and polls to the end; returns every poll status seen and the final body. */
async function submitAndPoll(api: Api, trainer: string, op: string, body: unknown, key: string) {
  const submitted = await api.call('POST', `${trainer}/${op}`, body, { 'idempotency-key': key });
  const statuses: number[] = [];
  if (submitted.status !== 200) return { submitted, statuses, final: submitted };
  for (;;) {
    const polled = await api.call('GET', `${trainer}/operations/${submitted.body.operation_id}`);
    statuses.push(polled.status);
    if (polled.status !== 408) return { submitted, statuses, final: polled };
  }
}

describe('admin API access', () => {
  it('is absent without --admin, and needs the token when --admin-token is set', async () => {
    server = await startTestServer();
    expect((await fetch(`${server.url}/_mock/journal`)).status).toBe(404);
    await server.close();
    const { admin } = await start({ adminToken: 'sesame' });
    expect((await fetch(`${server.url}/_mock/journal`)).status).toBe(401);
    expect((await fetch(`${server.url}/_mock/journal`, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
    expect((await admin.journal()).entries.length).toBeGreaterThan(0);
    const doc = await (await fetch(`${server.url}/openapi.json`)).json();
    expect(Object.keys(doc.paths)).toContain('/_mock/faults/{fault_id}');
  });
});

describe('the request journal', () => {
  it('records every request in arrival order with its surface, ids and the headers that matter, never the key', async () => {
    const journalFile = join(mkdtempSync(join(tmpdir(), 'journal-')), 'journal.ndjson');
    const { api, admin } = await start({ journalFile });
    const { run, trainer, sampler, samplerId } = await newRun(api);
    const done = await submitAndPoll(api, trainer, 'forward', fb, 'key-1');
    expect(done.final.body.status).toBe('done');
    await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '0', 'x-affinity-key': 'user-7' });

    const { entries } = await admin.journal();
    expect(entries.map((e) => e.seq)).toEqual([...entries.map((e) => e.seq)].sort((a, b) => a - b));
    expect(JSON.stringify(entries)).not.toContain(KEY);
    const submit = entries.find((e) => e.op === 'forward' && e.method === 'POST')!;
    expect(submit).toMatchObject({ surface: 'trainer', route: '/trainer/{run_id}/forward', status: 200, run_id: run.id, headers: { auth: 'bearer', idempotency_key: 'key-1' } });
    expect(submit.operation_id).toBe(done.submitted.body.operation_id);
    expect((submit.body as { loss_fn: string }).loss_fn).toBe('cross_entropy');
    const poll = entries.find((e) => e.route === '/trainer/{run_id}/operations/{operation_id}')!;
    expect(poll).toMatchObject({ op: 'forward', operation_id: submit.operation_id, response: { operation_status: 'done' } });
    const sample = entries.find((e) => e.surface === 'sampler')!;
    expect(sample).toMatchObject({ sampler_id: samplerId, op: 'sample', headers: { min_policy_version: '0', affinity_key: 'user-7' }, response: { policy_version: 0 } });
    expect(entries[0]).toMatchObject({ surface: 'control', method: 'POST', path: '/v1/loops/sessions' });

    expect((await admin.journal({ surface: 'trainer' })).entries.every((e) => e.surface === 'trainer')).toBe(true);
    expect((await admin.journal({ run_id: run.id })).entries.every((e) => e.run_id === run.id)).toBe(true);
    const page = await admin.journal({ since: submit.seq, limit: 2 });
    expect(page.entries.map((e) => e.seq)).toEqual([submit.seq + 1, submit.seq + 2]);
    expect(page.next_since).toBe(submit.seq + 2);

    const ndjson = await (await fetch(`${server.url}/_mock/journal?format=ndjson&surface=sampler`)).text();
    expect(ndjson.trim().split('\n').map((l) => JSON.parse(l).op)).toEqual(['sample']);
    const fileLines = readFileSync(journalFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(fileLines.length).toBeGreaterThanOrEqual(entries.length);
    expect((await fetch(`${server.url}/_mock/journal?surface=nope`)).status).toBe(400);
  });

  it('keeps only the newest entries, counting those it let go', async () => {
    const { api, admin } = await start({ journalSize: 5 });
    for (let i = 0; i < 8; i++) await api.call('GET', '/v1/loops/capabilities');
    const page = await admin.journal();
    expect(page.entries).toHaveLength(5);
    expect(page.evicted).toBe(3);
  });
});

describe('fault actions, as a client sees them', () => {
  it('respond: a status, error body and Retry-After; then the rule is spent', async () => {
    const { api, admin } = await start();
    await admin.addFault({ match: { surface: 'control', method: 'POST', route: '/v1/loops/sessions' }, action: { type: 'respond', status: 429, retry_after_s: 3 }, times: 1 });
    const refused = await api.call('POST', '/v1/loops/sessions');
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('3');
    expect(refused.body.error).toMatchObject({ type: 'rate_limited', fault_id: 'fault_1' });
    expect((await api.call('POST', '/v1/loops/sessions')).status).toBe(200);
    expect((await admin.faults())[0]).toMatchObject({ matched: 1, fired: 1, remaining: 0 });
    const custom = await admin.addFault({ match: { route: '/v1/loops/capabilities' }, action: { type: 'respond', status: 500, body: { detail: 'boom' }, headers: { 'x-upstream': 'down' } } });
    const res = await api.call('GET', '/v1/loops/capabilities');
    expect([res.status, res.body, res.headers.get('x-upstream')]).toEqual([500, { detail: 'boom' }, 'down']);
    await admin.removeFault(custom.id);
    expect((await api.call('GET', '/v1/loops/capabilities')).status).toBe(200);
  });

  it('delay: the answer comes after the delay, unchanged', async () => {
    const { api, admin } = await start();
    await admin.addFault({ match: { route: '/v1/loops/capabilities' }, action: { type: 'delay', ms: 300 } });
    const t0 = performance.now();
    const res = await api.call('GET', '/v1/loops/capabilities');
    expect(res.status).toBe(200);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(290);
  });

  it('drop: before handling nothing happens; after handling the work is done and only the answer is lost', async () => {
    const { api, admin } = await start();
    const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
    const body = { session_id: session, base_model: MODEL, lora_rank: 4 };
    await admin.addFault({ match: { route: '/v1/loops/runs', method: 'POST' }, action: { type: 'drop' }, times: 1 });
    await expect(api.call('POST', '/v1/loops/runs', body)).rejects.toThrow();
    expect((await api.call('GET', '/v1/loops/runs')).body.runs).toHaveLength(0);
    await admin.addFault({ match: { route: '/v1/loops/runs', method: 'POST' }, action: { type: 'drop', phase: 'after' }, times: 1 });
    await expect(api.call('POST', '/v1/loops/runs', body)).rejects.toThrow();
    expect((await api.call('GET', '/v1/loops/runs')).body.runs).toHaveLength(1);
    const drops = (await admin.journal({ surface: 'control' })).entries.filter((e) => e.fault);
    expect(drops.map((e) => [e.status, e.fault!.action])).toEqual([[0, 'drop'], [0, 'drop_after']]);
  });

  it('drop after a submit: resubmitting with the same Idempotency-Key returns the same operation, and the optimizer steps once', async () => {
    const { api, admin } = await start();
    const { trainer } = await newRun(api);
    await admin.addFault({ match: { op: 'optim_step', method: 'POST' }, action: { type: 'drop', phase: 'after' }, times: 1 });
    await submitAndPoll(api, trainer, 'forward_backward', fb, 'fb-1');
    await expect(api.call('POST', `${trainer}/optim_step`, {}, { 'idempotency-key': 'step-1' })).rejects.toThrow();
    const again = await submitAndPoll(api, trainer, 'optim_step', {}, 'step-1');
    expect(again.final.body).toMatchObject({ status: 'done', result: { policy_version: 1 } });
    expect((await api.call('GET', `${trainer}/policy_version`)).body.policy_version).toBe(1);
  });

  it('hold_poll: a poll is held for its whole window and answers 408 though the operation is done', async () => {
    const { api, admin } = await start({ longPollMs: 500 });
    const { trainer } = await newRun(api);
    // Built graphs first: a cold first step could outlast the window by itself and add a real 408.
    await submitAndPoll(api, trainer, 'forward', fb, 'warm-up');
    await admin.addFault({ match: { op: 'forward' }, action: { type: 'hold_poll' }, times: 2 });
    const result = await submitAndPoll(api, trainer, 'forward', fb, 'f-1');
    expect(result.statuses).toEqual([408, 408, 200]);
    expect(result.final.body.status).toBe('done');
  });

  it('fail_operation: the operation is accepted and ends with the given error_class', async () => {
    const { api, admin } = await start();
    const { trainer } = await newRun(api);
    await admin.addFault({ match: { op: 'forward_backward' }, action: { type: 'fail_operation', error_class: 'ValueError', message: 'bad data' } });
    const result = await submitAndPoll(api, trainer, 'forward_backward', fb, 'fb-x');
    expect(result.final.body).toEqual({ status: 'error', error: { error_class: 'ValueError', message: 'bad data' } });
    // Never applied to what it cannot act on: a poll or another route.
    expect((await api.call('GET', `${trainer}/policy_version`)).status).toBe(200);
  });

  it('deactivate: the run stops as the request arrives; it and later requests get 409 run_inactive', async () => {
    const { api, admin } = await start();
    const { run, trainer } = await newRun(api);
    await admin.addFault({ match: { op: 'forward_backward', method: 'POST' }, action: { type: 'deactivate' }, skip: 1, times: 1 });
    expect((await submitAndPoll(api, trainer, 'forward_backward', fb, 'a')).final.body.status).toBe('done');
    const refused = await api.call('POST', `${trainer}/forward_backward`, fb, { 'idempotency-key': 'b' });
    expect([refused.status, refused.body.error.type_detail]).toEqual([409, 'run_inactive']);
    const after = (await api.call('GET', `/v1/loops/runs/${run.id}`)).body.run;
    expect(after.status.name).toBe('INACTIVE');
  });
});

describe('rule matching and firing', () => {
  it('acts only on requests that match every field given', async () => {
    const { api, admin } = await start();
    const a = await newRun(api);
    const b = await newRun(api);
    await admin.addFault({ match: { surface: 'trainer', method: 'POST', op: 'forward_backward', run_id: a.run.id, headers: { 'idempotency-key': '*' } }, action: { type: 'respond', status: 500 } });
    const status = async (trainer: string, op: string, headers: Record<string, string>) => (await api.call('POST', `${trainer}/${op}`, fb, headers)).status;
    expect(await status(a.trainer, 'forward', { 'idempotency-key': 'k1' })).toBe(200);
    expect(await status(b.trainer, 'forward_backward', { 'idempotency-key': 'k2' })).toBe(200);
    expect(await status(a.trainer, 'forward_backward', {})).toBe(200);
    expect(await status(a.trainer, 'forward_backward', { 'idempotency-key': 'k3' })).toBe(500);
    await admin.clearFaults();
    await admin.addFault({ match: { headers: { 'x-affinity-key': 'user-1' } }, action: { type: 'respond', status: 503 } });
    expect((await api.call('POST', `${a.sampler}/compute_logprobs`, { prompt: sampleBody.prompt }, { 'x-affinity-key': 'user-2' })).status).toBe(200);
    expect((await api.call('POST', `${a.sampler}/compute_logprobs`, { prompt: sampleBody.prompt }, { 'x-affinity-key': 'user-1' })).status).toBe(503);
    // The admin API is never faulted, whatever a rule matches.
    await admin.addFault({ action: { type: 'respond', status: 500 } });
    expect((await admin.faults()).length).toBe(2);
  });

  it('skip and times count matches; a probability draws the same sequence from the same seed', async () => {
    const { api, admin } = await start();
    const outcomes = async (n: number) => {
      const seen: number[] = [];
      for (let i = 0; i < n; i++) seen.push((await api.call('GET', '/v1/loops/capabilities')).status);
      return seen;
    };
    await admin.addFault({ match: { route: '/v1/loops/capabilities' }, action: { type: 'respond', status: 500 }, skip: 2, times: 2 });
    expect(await outcomes(6)).toEqual([200, 200, 500, 500, 200, 200]);
    await admin.clearFaults();
    const flaky = { match: { route: '/v1/loops/capabilities' }, action: { type: 'respond' as const, status: 503 }, probability: 0.3, seed: 42 };
    await admin.addFault(flaky);
    const first = await outcomes(40);
    await admin.clearFaults();
    await admin.addFault(flaky);
    expect(await outcomes(40)).toEqual(first);
    const failures = first.filter((s) => s === 503).length;
    expect(failures).toBeGreaterThan(4);
    expect(failures).toBeLessThan(24);
    await admin.clearFaults();
    await admin.addFault({ ...flaky, seed: 43 });
    expect(await outcomes(40)).not.toEqual(first);
  });

  it('refuses rules that cannot work, naming the field', async () => {
    const { admin } = await start();
    const refusal = async (rule: unknown) => {
      try {
        await admin.addFault(rule as never);
      } catch (err) {
        // The package exports the error class, so a test can tell the admin API's refusals from its own bugs.
        expect(err).toBeInstanceOf(MockAdminError);
        expect((err as MockAdminError).status).toBe(400);
        return ((err as MockAdminError).body as { error: { field: string } }).error.field;
      }
      throw new Error('accepted');
    };
    expect(await refusal({ action: { type: 'respond' } })).toBe('action.status');
    expect(await refusal({ action: { type: 'explode' } })).toBe('body.action.type');
    expect(await refusal({ action: { type: 'delay', ms: 5 }, probability: 0 })).toBe('body.probability');
    expect(await refusal({ match: { route: '/trainer/:run_id/forward' }, action: { type: 'delay', ms: 5 } })).toBe('match.route');
    expect(await refusal({ match: { colour: 'red' }, action: { type: 'delay', ms: 5 } })).toBe('body.match.colour');
  });
});

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
    const { api, admin } = await start({ clockMode: 'virtual', longPollMs: 10_000 });
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
  it('sets the replica count, pauses and resumes a replica\'s sync, and gives one replica its own delay', async () => {
    const { api, admin } = await start({ clockMode: 'virtual', floorWaitMs: 0 });
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
    expect(state.replicas.map((r) => [r.policy_version, r.pending_version, r.syncing_version, r.paused])).toEqual([[0, 1, null, true], [0, null, 1, false]]);
    const refused = await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' });
    expect(refused.status).toBe(408);
    expect(refused.body.error.replicas).toEqual([{ replica: 0, policy_version: 0 }, { replica: 1, policy_version: 0 }]);
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
    const { api, admin } = await start({ clockMode: 'virtual' });
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
    const { api, admin } = await start({ clockMode: 'virtual' });
    expect((await admin.updateSettings({ cold_start_ms: 1000, weight_sync_delay_ms: [0, 10] })).cold_start_ms).toBe(1000);
    const { trainer } = await newRun(api);
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(503);
    await admin.advanceClock(1000);
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(200);
    const bad = await fetch(`${server.url}/_mock/settings`, { method: 'PATCH', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ long_poll_ms: 40_000 }) });
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

describe('scenarios', () => {
  it('ships the library the issue asks for, and each one loads by name', async () => {
    const names = shippedScenarioNames();
    for (const required of ['lagging-replica', 'replicas-out-of-step', 'lost-operation', 'shutdown-mid-run', 'sampling-backpressure', 'long-operations', 'user-error', 'slow-cold-start', 'sampler-scale-to-zero', 'run-idle-timeout', 'deactivation-during-training', 'flaky-network']) {
      expect(names).toContain(required);
    }
    const { admin } = await start();
    for (const name of names) {
      const applied = await admin.applyScenario({ name });
      expect(applied.name).toBe(name);
      expect((await admin.faults()).length).toBe(applied.faults);
      expect((await admin.progressRules()).length).toBe(applied.progress);
    }
  });

  it('names the line of a mistake in YAML and in JSON, and refuses files over HTTP', async () => {
    const { admin } = await start();
    const problem = async (text: string) => {
      try {
        await admin.applyScenario({ text });
      } catch (err) {
        return ((err as MockAdminError).body as { error: { message: string; line: number } }).error;
      }
      throw new Error('accepted');
    };
    const yaml = 'name: broken\nfaults:\n  - match:\n      surface: trainer\n    action:\n      type: explode\n';
    expect(await problem(yaml)).toMatchObject({ line: 6 });
    expect((await problem(yaml)).message).toMatch(/scenario:6: .*type/);
    expect(await problem('settings:\n  cold_start_ms: 10\n  colour: red\n')).toMatchObject({ line: 3 });
    expect(await problem('faults:\n  - action:\n      type: respond\n')).toMatchObject({ line: 2 });
    expect(await problem('{\n  "settings": {\n    "long_poll_ms": "soon"\n  }\n}')).toMatchObject({ line: 3 });
    expect(await problem('faults: [\n')).toHaveProperty('line');
    await expect(admin.applyScenario({ name: '../package.json' })).rejects.toThrow(/404/);
    const yamlBody = await fetch(`${server.url}/_mock/scenario`, { method: 'POST', headers: { 'content-type': 'application/yaml' }, body: 'settings:\n  floor_wait_ms: 5\n' });
    expect(yamlBody.status).toBe(200);
    expect((await admin.settings()).floor_wait_ms).toBe(5);
  });

  it('--scenario applies a file at start, again after a reset, and a bad one fails the start with its line', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'scenario-'));
    const file = join(dir, 'mine.yaml');
    writeFileSync(file, 'settings:\n  floor_wait_ms: 7\nfaults:\n  - action: {type: delay, ms: 1}\n');
    const { admin } = await start({ scenario: file });
    expect((await admin.settings()).floor_wait_ms).toBe(7);
    await admin.reset();
    expect((await admin.settings()).floor_wait_ms).toBe(7);
    expect(await admin.faults()).toHaveLength(1);
    await server.close();
    writeFileSync(file, 'settings:\n  floor_wait_ms: -1\n');
    await expect(startTestServer({ admin: true, scenario: file })).rejects.toThrow(/mine\.yaml:2/);
  });

  /** Each shipped scenario, observed from the client side. */
  const effects: Record<string, (api: Api, admin: MockAdmin) => Promise<void>> = {
    baseline: async (api, admin) => {
      const { trainer } = await newRun(api);
      expect((await submitAndPoll(api, trainer, 'forward', fb, 'b-1')).statuses).toEqual([200]);
      expect(await admin.faults()).toEqual([]);
    },
    'lost-operation': async (api) => {
      const { trainer } = await newRun(api);
      await submitAndPoll(api, trainer, 'forward_backward', fb, 'lo-1');
      const first = await submitAndPoll(api, trainer, 'optim_step', {}, 'lo-2');
      expect(first.final.status).toBe(404);
      const again = await submitAndPoll(api, trainer, 'optim_step', {}, 'lo-2');
      expect(again.submitted.body.operation_id).toBe(first.submitted.body.operation_id);
      expect(again.final.body.result.policy_version).toBe(1);
    },
    'dropped-submit': async (api) => {
      const { trainer } = await newRun(api);
      await expect(api.call('POST', `${trainer}/optim_step`, {}, { 'idempotency-key': 'ds' })).rejects.toThrow();
      expect((await submitAndPoll(api, trainer, 'optim_step', {}, 'ds')).final.body.result.policy_version).toBe(1);
    },
    'user-error': async (api) => {
      const { trainer } = await newRun(api);
      for (const key of ['ue-1', 'ue-2']) expect((await submitAndPoll(api, trainer, 'forward_backward', fb, key)).final.body.error.error_class).toBe('ValueError');
      expect((await submitAndPoll(api, trainer, 'forward', fb, 'ue-3')).final.body.status).toBe('done');
    },
    'long-operations': async (api) => {
      const { trainer } = await newRun(api);
      // A forward (not held) builds the graphs, so compute time does not add a window of its own.
      await submitAndPoll(api, trainer, 'forward', fb, 'lop-warm');
      expect((await submitAndPoll(api, trainer, 'forward_backward', fb, 'lop')).statuses).toEqual([408, 408, 408, 200]);
    },
    'deactivation-during-training': async (api) => {
      const { trainer } = await newRun(api);
      for (const key of ['d1', 'd2']) expect((await submitAndPoll(api, trainer, 'forward_backward', fb, key)).final.body.status).toBe('done');
      expect((await api.call('POST', `${trainer}/forward_backward`, fb, { 'idempotency-key': 'd3' })).status).toBe(409);
    },
    'shutdown-mid-run': async (api) => {
      const { trainer } = await newRun(api);
      const statuses: number[] = [];
      for (let i = 0; i < 10; i++) statuses.push((await api.call('GET', `${trainer}/policy_version`)).status);
      expect(statuses).toEqual([200, 200, 200, 200, 200, 200, 503, 503, 503, 200]);
    },
    'sampling-backpressure': async (api) => {
      const { sampler } = await newRun(api);
      const statuses: number[] = [];
      for (let i = 0; i < 4; i++) statuses.push((await api.call('POST', `${sampler}/sample`, sampleBody)).status);
      expect(statuses).toEqual([429, 429, 429, 200]);
    },
    'flaky-network': async (api) => {
      const statuses: number[] = [];
      for (let i = 0; i < 60; i++) statuses.push((await api.call('GET', '/v1/loops/capabilities')).status);
      const failures = statuses.filter((s) => s === 503).length;
      expect(failures).toBeGreaterThan(0);
      expect(failures).toBeLessThan(20);
    },
    'slow-cold-start': async (api, admin) => {
      const { trainer } = await newRun(api);
      expect((await api.call('GET', `${trainer}/health`)).status).toBe(503);
      await admin.advanceClock(4000);
      expect((await api.call('GET', `${trainer}/health`)).status).toBe(200);
    },
    'slow-model-deploy': async (api, admin) => {
      const { run, trainer } = await newRun(api);
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'step-0' }, 'smd-save');
      const [checkpoint] = (await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
      const deployed = (await api.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [checkpoint.id] })).body;
      const status = async () => (await api.call('GET', `/v1/models/${deployed.model_id}/deployments/${deployed.deployment_id}`)).body.status;
      expect(await status()).toBe('BUILDING');
      await admin.advanceClock(3000);
      expect(await status()).toBe('ACTIVE');
    },
    'run-idle-timeout': async (api, admin) => {
      const { run } = await newRun(api);
      await admin.advanceClock(1500);
      expect((await api.call('GET', `/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
    },
    'sampler-scale-to-zero': async (api, admin) => {
      const { sampler, samplerId } = await newRun(api);
      await admin.advanceClock(1000);
      await admin.advanceClock(1000);
      expect((await admin.sampler(samplerId)).status).toBe('SCALED_TO_ZERO');
      expect((await api.call('POST', `${sampler}/sample`, sampleBody)).status).toBe(503);
      await admin.advanceClock(1000);
      expect((await api.call('POST', `${sampler}/sample`, sampleBody)).status).toBe(200);
    },
    'lagging-replica': async (api, admin) => {
      const { trainer, sampler } = await newRun(api);
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'w0' }, 'lr-0');
      await submitAndPoll(api, trainer, 'optim_step', {}, 'lr-1');
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'w1' }, 'lr-2');
      const pending = api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' });
      await sleep(100);
      await admin.advanceClock(300);
      expect((await pending).status).toBe(408);
      await admin.advanceClock(1200);
      expect((await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' })).body.policy_version).toBe(1);
    },
    'replicas-out-of-step': async (api, admin) => {
      const { trainer, sampler, samplerId } = await newRun(api);
      await submitAndPoll(api, trainer, 'optim_step', {}, 'os-1');
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'w1' }, 'os-2');
      const versions = new Set<number>();
      for (let i = 0; i < 4; i++) versions.add((await api.call('POST', `${sampler}/sample`, sampleBody)).body.policy_version);
      expect([...versions].sort()).toEqual([0, 1]);
      expect((await admin.sampler(samplerId)).replicas.map((r) => r.policy_version)).toEqual([1, 0]);
    },
  };

  /** Scenarios whose effect is observed in real time (long-poll windows); the rest run on the virtual clock. */
  const realTime = new Set(['long-operations']);

  it('every shipped scenario takes effect', async () => {
    expect(Object.keys(effects).sort()).toEqual(shippedScenarioNames());
    for (const clockMode of ['virtual', 'real'] as const) {
      const { api, admin } = await start({ clockMode });
      for (const [name, observe] of Object.entries(effects)) {
        if (realTime.has(name) !== (clockMode === 'real')) continue;
        await admin.reset();
        await admin.applyScenario({ name });
        try {
          await observe(api, admin);
        } catch (err) {
          throw new Error(`scenario ${name}: ${(err as Error).message}`);
        }
      }
      await server.close();
    }
  }, 120_000);
});

describe('shutdown with waits held open', () => {
  it('ends a long injected delay, a held poll and a floor wait on the virtual clock instead of hanging the close', async () => {
    const { api, admin } = await start({ clockMode: 'virtual', floorWaitMs: 600_000 });
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
        let submitted;
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

describe('admin input that once broke the server', () => {
  it('refuses, before installing anything, a fault body nested 5,000 (or 40) deep, header names with spaces and values with CR/LF', async () => {
    const { api, admin } = await start();
    // Written as text: building it as an object would test this test's own stack.
    const deep = `{"action":{"type":"respond","status":503,"body":${'{"d":'.repeat(5000)}"bottom"${'}'.repeat(5000)}}}`;
    const bad: [unknown, string, RegExp][] = [
      [deep, 'body', /nests deeper than 64 levels/],
      [`{"action":{"type":"respond","status":503,"body":${'{"d":'.repeat(40)}1${'}'.repeat(40)}}}`, 'action.body', /nests more than 32 levels deep/],
      [{ action: { type: 'respond', status: 503, headers: { 'Bad Name': 'x' } } }, 'action.headers.Bad Name', /not an HTTP header name/],
      [{ action: { type: 'respond', status: 503, headers: { 'X-Ok': 'a\r\nSet-Cookie: y' } } }, 'action.headers.X-Ok', /CR, LF or NUL/],
      [{ match: { headers: { 'has space': 'v' } }, action: { type: 'respond', status: 503 } }, 'match.headers.has space', /not an HTTP header name/],
    ];
    for (const [rule, field, message] of bad) {
      const res = await fetch(`${server.url}/_mock/faults`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof rule === 'string' ? rule : JSON.stringify(rule) });
      const body = await res.json() as { error: { field: string; message: string } };
      expect([res.status, body.error.field], field).toEqual([400, field]);
      expect(body.error.message).toMatch(message);
    }
    expect(await admin.faults()).toEqual([]);
    expect((await api.call('GET', '/v1/loops/capabilities')).status).toBe(200);
  });

  it('refuses a YAML alias bomb with a 400', async () => {
    await start();
    const bomb = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]', ...Array.from({ length: 8 }, (_, i) => `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [${Array(10).fill(`*${String.fromCharCode(97 + i)}`).join(',')}]`)].join('\n');
    const res = await fetch(`${server.url}/_mock/scenario`, { method: 'POST', headers: { 'content-type': 'application/yaml' }, body: bomb });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/alias/i);
  });

  it('journals and never faults /%5Fmock/... as what it is: the admin API', async () => {
    const { api, admin } = await start();
    await admin.addFault({ action: { type: 'respond', status: 503 } });
    const encoded = await fetch(`${server.url}/%5Fmock/faults`);
    expect(encoded.status).toBe(200);
    expect((await api.call('GET', '/v1/loops/capabilities')).status).toBe(503);
    const entry = server.core.journal.query({}).find((e) => e.path === '/%5Fmock/faults')!;
    expect(entry.surface).toBe('admin');
    expect(entry.fault).toBeUndefined();
  });
});
