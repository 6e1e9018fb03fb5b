import { afterEach, describe, expect, it } from 'vitest';
import { History } from '../core/history.js';
import type { Operation } from '../core/operations.js';
import { ManualClock, type RunningServer, type StartOptions } from '../index.js';
import { http, startTestServer, wireDatum } from './helpers.js';

// The dashboard's data routes without a browser: their contract, their refusals, and the history they read.

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

async function start(options: StartOptions = {}) {
  server = await startTestServer(options);
  const get = async (url: string, headers: Record<string, string> = {}) => {
    const res = await server!.app.inject({ method: 'GET', url, headers });
    return { status: res.statusCode, body: res.json() as any, headers: res.headers };
  };
  return { server, get };
}

describe('the dashboard data routes', () => {
  it('are listed in /openapi.json under the dashboard tag', async () => {
    const { get } = await start();
    const doc = (await get('/openapi.json')).body;
    for (const path of ['/_mock/dashboard/overview', '/_mock/dashboard/runs/{run_id}', '/_mock/dashboard/samplers/{sampler_id}', '/_mock/dashboard/journal']) {
      expect(doc.paths[path]?.get?.tags, path).toEqual(['dashboard']);
    }
    expect(doc.paths['/_mock/ui/login'].post.tags).toEqual(['dashboard']);
  });

  it('answer bad input with 4xx JSON that names the field', async () => {
    const { get, server } = await start();
    const missing = await get('/_mock/dashboard/runs/nope');
    expect(missing.status).toBe(404);
    expect(missing.body.error).toMatchObject({ type: 'not_found', field: 'run_id' });
    expect((await get('/_mock/dashboard/samplers/nope')).body.error).toMatchObject({ type: 'not_found', field: 'sampler_id' });
    const status = await get('/_mock/dashboard/journal?status=40');
    expect(status.status).toBe(400);
    expect(status.body.error.message).toMatch(/status/);
    expect((await get('/_mock/dashboard/journal?limit=0')).status).toBe(400);
    expect((await get('/_mock/dashboard/journal?surface=moon')).status).toBe(400);
    expect((await get('/_mock/dashboard/journal?colour=red')).status).toBe(400);
    expect((await get('/_mock/ui/secrets.js')).body.error).toMatchObject({ type: 'not_found' });
    const login = await server.app.inject({ method: 'POST', url: '/_mock/ui/login', payload: { token: 'x' } });
    expect(login.statusCode).toBe(401);
    expect(login.json().error.message).toMatch(/--admin-token/);
    expect((await server.app.inject({ method: 'POST', url: '/_mock/ui/login', payload: {} })).statusCode).toBe(400);
  });

  it('serve the page as ES modules: every module app.js imports, near and far, with a JavaScript type', async () => {
    const { get, server } = await start();
    const page = (await server.app.inject({ method: 'GET', url: '/_mock/ui' })).body;
    expect(page).toContain('<script type="module" src="/_mock/ui/app.js"></script>');
    const seen = new Set<string>();
    const pending = ['app.js'];
    while (pending.length) {
      const name = pending.pop()!;
      if (seen.has(name)) continue;
      seen.add(name);
      const res = await server.app.inject({ method: 'GET', url: `/_mock/ui/${name}` });
      expect(res.statusCode, name).toBe(200);
      expect(res.headers['content-type'], name).toBe('text/javascript; charset=utf-8');
      for (const m of res.body.matchAll(/^import .* from '\.\/([\w-]+\.js)';$/gm)) pending.push(m[1]!);
    }
    // One module per view, the charts, the poll loop and the data routes: not one script.
    expect([...seen].sort()).toEqual(
      expect.arrayContaining(['charts.js', 'live.js', 'view-journal.js', 'view-models.js', 'view-rules.js', 'view-runs.js', 'view-samplers.js']),
    );
    expect((await get('/_mock/ui/ticks.d.ts')).status).toBe(404);
  });

  it('filter the journal by status class and text, from a cursor', async () => {
    const { get, server } = await start();
    // Over real HTTP: the journal records a request when its connection is done with it.
    await fetch(`${server.url}/v1/loops/capabilities`, { headers: { authorization: 'Bearer k' } });
    await fetch(`${server.url}/v1/loops/runs/missing`, { headers: { authorization: 'Bearer k' } });
    const errors = (await get('/_mock/dashboard/journal?status=4xx')).body;
    expect(errors.entries.map((e: any) => e.path)).toEqual(['/v1/loops/runs/missing']);
    expect((await get('/_mock/dashboard/journal?q=CAPABILITIES')).body.entries.map((e: any) => e.path)).toEqual(['/v1/loops/capabilities']);
    const all = (await get('/_mock/dashboard/journal')).body;
    expect(all.entries.map((e: any) => e.seq)).toEqual([1, 2]);
    expect((await get(`/_mock/dashboard/journal?since=${all.next_since}`)).body.entries).toEqual([]);
  });

  it("keep a run's policy version once it is deactivated: the version it reached, not 0", async () => {
    const { get, server } = await start();
    const api = http(server.url);
    const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
    const run = (await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4, seed: 1 })).body.run;
    const trainer = new URL(run.base_url).pathname;
    const data = [wireDatum([5, 6, 7, 8], [6, 7, 8, 9])];
    for (let i = 0; i < 3; i++) {
      await api.op(trainer, 'forward_backward', { data, loss_fn: 'cross_entropy' });
      await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
    }
    // A last operation that reports no version of its own: the version is the steps applied when it finished.
    await api.op(trainer, 'forward', { data, loss_fn: 'cross_entropy' });
    const version = async () => ({
      overview: (await get('/_mock/dashboard/overview')).body.runs.find((r: any) => r.id === run.id).policy_version,
      detail: (await get(`/_mock/dashboard/runs/${run.id}`)).body.run.policy_version,
    });
    expect(await version()).toEqual({ overview: 3, detail: 3 });
    expect((await api.call('POST', `/v1/loops/runs/${run.id}/deactivate`)).status).toBe(200);
    expect((await get(`/_mock/dashboard/runs/${run.id}`)).body.run.status).toBe('INACTIVE');
    expect(await version()).toEqual({ overview: 3, detail: 3 });
  });

  it('with --api-key take the admin token as a header or the sign-in cookie, which the admin API takes too', async () => {
    const { get, server } = await start({ apiKeys: [{ key: 'sk-never-shown' }], admin: true, adminToken: 'sesame' });
    expect((await get('/_mock/dashboard/overview')).status).toBe(401);
    expect((await get('/_mock/dashboard/overview', { authorization: 'Bearer sk-never-shown' })).status).toBe(401);
    const byHeader = await get('/_mock/dashboard/overview', { authorization: 'Bearer sesame' });
    expect(byHeader.status).toBe(200);
    expect(JSON.stringify(byHeader.body)).not.toContain('sk-never-shown');
    const login = await server.app.inject({ method: 'POST', url: '/_mock/ui/login', payload: { token: 'sesame' } });
    const cookie = String(login.headers['set-cookie']);
    expect(cookie).toMatch(/^loops_mock_admin=sesame; Path=\/_mock; HttpOnly; SameSite=Strict$/);
    const jar = cookie.split(';')[0]!;
    expect((await get('/_mock/dashboard/overview', { cookie: jar })).body.signed_in).toBe(true);
    expect((await get('/_mock/faults', { cookie: jar })).status).toBe(200);
    expect((await get('/_mock/faults', { cookie: 'loops_mock_admin=guess' })).status).toBe(401);
    expect((await get('/_mock/faults', { cookie: 'loops_mock_admin=%E0%A4%A' })).status).toBe(401);
  });
});

describe('the run history the dashboard charts', () => {
  const op = (runId: string, name: string, result: unknown, status: Operation['status'] = 'done'): Operation =>
    ({
      id: `op-${Math.random()}`,
      runId,
      op: name,
      status,
      result,
      submittedAt: 0,
      finishedAt: 5,
    }) as unknown as Operation;

  it('gives each loss the step it was computed at, an optim_step the step it advanced from, and keeps the newest 5000 events', () => {
    let step = 0;
    const history = new History(new ManualClock(), () => step);
    history.operationFinished(op('r', 'forward_backward', { loss: 3 }));
    step = 1;
    history.operationFinished(op('r', 'optim_step', { policy_version: 1, metrics: { grad_norm: 2, learning_rate: 1e-4 } }));
    history.operationFinished(op('r', 'forward_backward', { loss: 2 }));
    history.operationFinished(op('r', 'optim_step', {}, 'error'));
    history.operationFinished(op('r', 'forward', { loss: 1.5 }));
    step = 7; // load_state_with_optimizer restores a checkpoint's step
    history.operationFinished(op('r', 'load_state_with_optimizer', { path: 'bt://loops:r/weights/a' }));
    history.operationFinished(op('r', 'forward_backward', { loss: 2.5 }));
    expect(history.ofRun('r').map((e) => [e.op, e.step, e.loss ?? null])).toEqual([
      ['forward_backward', 0, 3],
      ['optim_step', 0, null],
      ['forward_backward', 1, 2],
      ['optim_step', 1, null],
      ['forward', 1, 1.5],
      ['load_state_with_optimizer', 7, null],
      ['forward_backward', 7, 2.5],
    ]);
    expect(history.ofRun('r')[1]).toMatchObject({ grad_norm: 2, learning_rate: 1e-4, policy_version: 1, duration_ms: 5 });
    expect(history.ofRun('r')[3]).toMatchObject({ status: 'error' });
    for (let i = 0; i < 5010; i++) history.operationFinished(op('big', 'forward', { loss: i }));
    const kept = history.ofRun('big');
    expect(kept).toHaveLength(5000);
    expect([kept[0]!.loss, kept.at(-1)!.loss]).toEqual([10, 5009]);
  });
});
