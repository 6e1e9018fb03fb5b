import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock, type RunningServer } from '../index.js';
import { AnswerCache, MAX_ANSWERS } from '../http/answer-cache.js';
import { answerKey } from '../control/context.js';
import { client, newRun, startTestServer } from './helpers.js';

let server: RunningServer;
afterEach(() => server?.close());

const ids = (list: { id: string }[]) => list.map((x) => x.id);

// The list routes keep their answers while the store is unchanged (http/answer-cache.ts): each case asks
// once so an answer is kept, changes something, and asks again.
describe('kept list answers', () => {
  it('show every change to runs, samplers and deployments, made by request or by the server itself', async () => {
    server = await startTestServer();
    const api = client(server);
    const first = await newRun(api);
    for (const path of ['/v1/loops/runs', '/v1/loops/samplers', '/v1/loops/deployments']) expect((await api.get(path)).status).toBe(200);

    const second = await newRun(api);
    expect(ids((await api.get('/v1/loops/runs')).body.runs)).toEqual([second.id, first.id]);
    expect(ids((await api.get('/v1/loops/samplers')).body.samplers)).toEqual([second.sampler.id, first.sampler.id]);
    expect(ids((await api.get('/v1/loops/deployments')).body.deployments)).toEqual([second.deployment_id, first.deployment_id]);

    // A record changed in place: the deactivated run and its deployment.
    expect((await api.post(`/v1/loops/runs/${first.id}/deactivate`)).status).toBe(200);
    const runs = (await api.get('/v1/loops/runs')).body.runs;
    expect(runs.find((r: any) => r.id === first.id).status.name).toBe('INACTIVE');
    // Its deployment is STOPPED, which the list leaves out (GET by id still shows it).
    expect(ids((await api.get('/v1/loops/deployments')).body.deployments)).toEqual([second.deployment_id]);
    expect((await api.get(`/v1/loops/deployments/${first.deployment_id}`)).body.deployment.active_run_id).toBeNull();

    // A change no request made: the admin API's replica count goes through the fleet the same way.
    server.core.fleet.setSamplerReplicas(server.core.fleet.findSampler(second.sampler.id)!, 3);
    const modelDeployment = await api.get(`/v1/models/${second.sampler.model_id}/deployments/${second.sampler.deployment_id}`);
    expect(modelDeployment.body.active_replica_count).toBe(3);
    expect((await api.get('/v1/loops/samplers')).body.samplers).toHaveLength(2);
  });

  it('show new log lines of a deployment, and each query its own lines', async () => {
    server = await startTestServer();
    const api = client(server);
    const run = await newRun(api);
    const logs = `/v1/loops/deployments/${run.deployment_id}/logs`;
    const before = (await api.get(logs)).body.logs.length;
    expect((await api.get(`${logs}?limit=1`)).body.logs).toHaveLength(1);
    await server.app.inject({ method: 'POST', url: `/trainer/${run.id}/forward`, payload: {} });
    const after = (await api.get(logs)).body.logs;
    expect(after).toHaveLength(before + 1);
    expect(after[0].message).toMatch(/^POST \/forward -> 400/);
    expect((await api.get(`${logs}?limit=1`)).body.logs).toHaveLength(1);
  });

  it('of logs without an end follow the clock (the default window ends now); with an end they are kept', async () => {
    const clock = new ManualClock();
    server = await startTestServer({ clock, coldStartMs: 0 });
    const api = client(server);
    const run = await newRun(api);
    const logs = `/v1/loops/deployments/${run.deployment_id}/logs`;
    const fixed = `${logs}?end_epoch_millis=${clock.now()}`;
    expect((await api.get(logs)).body.logs.length).toBeGreaterThan(0);
    const kept = (await api.get(fixed)).body;
    // 31 minutes on, with no record written: the default window has moved past every line.
    const writes = server.core.store.version;
    clock.advance(31 * 60_000);
    expect(server.core.store.version).toBe(writes);
    expect((await api.get(logs)).body.logs).toEqual([]);
    expect((await api.get(fixed)).body).toEqual(kept);
  });

  it('are kept per caller: another user or organisation gets its own list from the same URL', async () => {
    server = await startTestServer({ apiKeys: [{ key: 'alice', org: 'acme' }, { key: 'bob', org: 'acme' }, { key: 'eve' }] });
    const alice = client(server, 'alice');
    const bob = client(server, 'bob');
    const eve = client(server, 'eve');
    const run = await newRun(alice);
    expect(ids((await alice.get('/v1/loops/runs')).body.runs)).toEqual([run.id]);
    expect((await bob.get('/v1/loops/runs')).body.runs).toEqual([]);
    expect(ids((await bob.get('/v1/loops/runs?scope=org')).body.runs)).toEqual([run.id]);
    expect((await eve.get('/v1/loops/runs?scope=org')).body.runs).toEqual([]);
  });

  it('go with a reset: the new store starts empty', async () => {
    server = await startTestServer();
    const api = client(server);
    await newRun(api);
    expect((await api.get('/v1/loops/runs')).body.runs).toHaveLength(1);
    await server.core.reset();
    expect((await api.get('/v1/loops/runs')).body.runs).toEqual([]);
  });

  it('are sent as the same JSON a fresh answer has, and journaled with their body', async () => {
    server = await startTestServer({ journalDetail: 'full' });
    const api = client(server);
    await newRun(api);
    // Over a real connection: the journal takes an entry when the socket is done with it.
    const get = () => fetch(`${server.url}/v1/loops/runs`, { headers: { authorization: `Bearer ${server.apiKey}` } });
    const fresh = await get();
    const freshBody = await fresh.text();
    const kept = await get();
    expect(kept.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(await kept.text()).toBe(freshBody);
    expect(Number(kept.headers.get('content-length'))).toBe(Buffer.byteLength(freshBody));
    await expect.poll(() => server.core.journal.query({ surface: 'control' }).filter((e) => e.path === '/v1/loops/runs' && e.method === 'GET').length).toBe(2);
    const entries = server.core.journal.query({ surface: 'control' }).filter((e) => e.path === '/v1/loops/runs' && e.method === 'GET');
    for (const entry of entries) expect(entry.response_body).toEqual(JSON.parse(freshBody));
  });
});

describe('AnswerCache', () => {
  it('builds again after any write, and never keeps an answer whose building wrote', async () => {
    server = await startTestServer();
    const cache = new AnswerCache(server.core);
    let builds = 0;
    const build = () => ({ n: ++builds });
    expect(cache.get('k', build)).toEqual({ n: 1 });
    expect(cache.get('k', build)).toEqual({ n: 1 });
    expect(cache.get('other', build)).toEqual({ n: 2 });
    server.core.store.setMeta('touched', 'yes');
    expect(cache.get('k', build)).toEqual({ n: 3 });
    const writing = () => {
      server.core.store.setMeta('touched', String(++builds));
      return { n: builds };
    };
    expect(cache.get('w', writing)).toEqual({ n: 4 });
    expect(cache.get('w', writing)).toEqual({ n: 5 });
    expect(() =>
      cache.get('x', () => {
        throw new Error('not found');
      }),
    ).toThrow('not found');
    expect(cache.get('x', build)).toEqual({ n: 6 });
  });
});

describe('kept answers stay bounded', () => {
  it('keys on the route and its validated parameters: junk or reordered query text is the same answer', () => {
    const request = (url: string, query: Record<string, unknown>) =>
      ({ principal: { org_id: 'o', team_id: 't', user_id: 'u' }, routeOptions: { url }, params: {}, query }) as unknown as Parameters<typeof answerKey>[0];
    // `GET /v1/loops/runs?&&&` and `?scope=org&base_model=M` vs `?base_model=M&scope=org` parse to these.
    expect(answerKey(request('/v1/loops/runs', {}))).toBe(answerKey(request('/v1/loops/runs', {})));
    expect(answerKey(request('/v1/loops/runs', { scope: 'org', base_model: 'M' }))).toBe(
      answerKey(request('/v1/loops/runs', { base_model: 'M', scope: 'org' })),
    );
    expect(answerKey(request('/v1/loops/runs', { scope: 'org' }))).not.toBe(answerKey(request('/v1/loops/runs', {})));
  });

  it('counts keys and entries toward the budget and keeps at most MAX_ANSWERS', async () => {
    server = await startTestServer();
    const cache = new AnswerCache(server.core);
    for (let i = 0; i < MAX_ANSWERS * 3; i++) cache.get(`key ${'&'.repeat(i % 2000)} ${i}`, () => ({ i }));
    expect(cache.size.answers).toBeLessThanOrEqual(MAX_ANSWERS);
    expect(cache.size.bytes).toBeLessThanOrEqual(8 * 2 ** 20);
    // Keys (up to 2,000 characters) and entries count, not only the answers' few bytes each.
    expect(cache.size.bytes).toBeGreaterThan(cache.size.answers * 512);
  });
});
