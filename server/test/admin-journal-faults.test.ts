import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { MockAdminError } from '../index.js';
import { MODEL, KEY, fb, sampleBody, newRun, submitAndPoll, adminServerPerTest } from './admin-helpers.js';

const servers = adminServerPerTest();
const start = servers.start;

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
    expect(submit).toMatchObject({
      surface: 'trainer',
      route: '/trainer/{run_id}/forward',
      status: 200,
      run_id: run.id,
      headers: { auth: 'bearer', idempotency_key: 'key-1' },
    });
    expect(submit.operation_id).toBe(done.submitted.body.operation_id);
    expect((submit.body as { loss_fn: string }).loss_fn).toBe('cross_entropy');
    const poll = entries.find((e) => e.route === '/trainer/{run_id}/operations/{operation_id}')!;
    expect(poll).toMatchObject({ op: 'forward', operation_id: submit.operation_id, response: { operation_status: 'done' } });
    const sample = entries.find((e) => e.surface === 'sampler')!;
    expect(sample).toMatchObject({
      sampler_id: samplerId,
      op: 'sample',
      headers: { min_policy_version: '0', affinity_key: 'user-7' },
      response: { policy_version: 0 },
    });
    expect(entries[0]).toMatchObject({ surface: 'control', method: 'POST', path: '/v1/loops/sessions' });

    expect((await admin.journal({ surface: 'trainer' })).entries.every((e) => e.surface === 'trainer')).toBe(true);
    expect((await admin.journal({ run_id: run.id })).entries.every((e) => e.run_id === run.id)).toBe(true);
    const page = await admin.journal({ since: submit.seq, limit: 2 });
    expect(page.entries.map((e) => e.seq)).toEqual([submit.seq + 1, submit.seq + 2]);
    expect(page.next_since).toBe(submit.seq + 2);

    const ndjson = await (await fetch(`${servers.current.url}/_mock/journal?format=ndjson&surface=sampler`)).text();
    expect(
      ndjson
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).op),
    ).toEqual(['sample']);
    const fileLines = readFileSync(journalFile, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(fileLines.length).toBeGreaterThanOrEqual(entries.length);
    expect((await fetch(`${servers.current.url}/_mock/journal?surface=nope`)).status).toBe(400);
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
    await admin.addFault({
      match: { surface: 'control', method: 'POST', route: '/v1/loops/sessions' },
      action: { type: 'respond', status: 429, retry_after_s: 3 },
      times: 1,
    });
    const refused = await api.call('POST', '/v1/loops/sessions');
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('3');
    expect(refused.body.error).toMatchObject({ type: 'rate_limited', fault_id: 'fault_1' });
    expect((await api.call('POST', '/v1/loops/sessions')).status).toBe(200);
    expect((await admin.faults())[0]).toMatchObject({ matched: 1, fired: 1, remaining: 0 });
    const custom = await admin.addFault({
      match: { route: '/v1/loops/capabilities' },
      action: { type: 'respond', status: 500, body: { detail: 'boom' }, headers: { 'x-upstream': 'down' } },
    });
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
    expect(drops.map((e) => [e.status, e.fault!.action])).toEqual([
      [0, 'drop'],
      [0, 'drop_after'],
    ]);
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
    await admin.addFault({
      match: { surface: 'trainer', method: 'POST', op: 'forward_backward', run_id: a.run.id, headers: { 'idempotency-key': '*' } },
      action: { type: 'respond', status: 500 },
    });
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
