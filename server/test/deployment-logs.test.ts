import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock, type RunningServer } from '../index.js';
import { client, newRun, startTestServer, type Client } from './helpers.js';

// Both log routes as Baseten documents them (loops-api and management-api "get deployment logs" pages) and as
// truss calls them (truss/remote/baseten/api.py): the trainer deployment's GET, and the sampler's model
// deployment, by GET (the Go CLI) and by POST with a JSON body (truss).

let server: RunningServer;
let clock: ManualClock;
let api: Client;
afterEach(() => server?.close());

const MINUTE = 60_000;

async function start() {
  clock = new ManualClock();
  server = await startTestServer({ clock, coldStartMs: 0 });
  api = client(server);
  const run = await newRun(api);
  return {
    run,
    trainerLogs: `/v1/loops/deployments/${run.deployment_id}/logs`,
    samplerLogs: `/v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}/logs`,
    sampler: new URL(run.sampler.base_url).pathname,
    trainer: new URL(run.base_url).pathname,
  };
}

/** A request each replica serves (and logs), refused for its empty body: one line now on each side. */
async function traffic(r: { trainer: string; sampler: string }) {
  await server.app.inject({ method: 'POST', url: `${r.trainer}/forward`, payload: {} });
  await server.app.inject({ method: 'POST', url: `${r.sampler}/sample`, payload: {} });
}

const ms = (line: { timestamp: string }) => Number(BigInt(line.timestamp) / 1_000_000n);

describe('log lines', () => {
  it('come newest first without a direction, on the GET routes and on the POST truss sends', async () => {
    const r = await start();
    for (let i = 0; i < 3; i++) {
      clock.advance(1000);
      await traffic(r);
    }
    const answers = {
      trainerGet: (await api.get(r.trainerLogs)).body.logs,
      samplerGet: (await api.get(r.samplerLogs)).body.logs,
      samplerPostEmpty: (await api.post(r.samplerLogs, {})).body.logs,
      samplerPostNoBody: (await api.post(r.samplerLogs)).body.logs,
    };
    for (const [name, logs] of Object.entries(answers)) {
      expect(logs.length, name).toBeGreaterThan(3);
      const times = logs.map(ms);
      expect(times, name).toEqual([...times].sort((a, b) => b - a));
      expect(times[0], name).toBeGreaterThan(times.at(-1));
    }
    // The same lines either way: the POST is the GET's filters in a body.
    expect(answers.samplerPostEmpty).toEqual(answers.samplerGet);
    expect(answers.samplerPostNoBody).toEqual(answers.samplerGet);
    expect(answers.samplerGet.every((l: { replica: string }) => l.replica.startsWith('sampler'))).toBe(true);

    // direction asc: oldest first, the same lines.
    const asc = (await api.get(`${r.trainerLogs}?direction=asc`)).body.logs;
    expect(asc).toEqual([...answers.trainerGet].reverse());
    expect((await api.post(r.samplerLogs, { direction: 'asc' })).body.logs).toEqual([...answers.samplerGet].reverse());
    expect((await api.post(r.samplerLogs, { direction: 'desc', limit: 2 })).body.logs).toEqual(answers.samplerGet.slice(0, 2));
  });

  it('cover the last 30 minutes when no range is given, and the range asked for otherwise', async () => {
    const r = await start();
    const createdAt = clock.now();
    clock.advance(31 * MINUTE);
    await traffic(r);
    const now = clock.now();
    for (const [name, logs] of [
      ['trainer GET', (await api.get(r.trainerLogs)).body.logs],
      ['sampler GET', (await api.get(r.samplerLogs)).body.logs],
      ['sampler POST', (await api.post(r.samplerLogs, {})).body.logs],
    ] as const) {
      expect(logs.length, name).toBeGreaterThan(0);
      expect(
        logs.every((l: { timestamp: string }) => ms(l) >= now - 30 * MINUTE && ms(l) <= now),
        name,
      ).toBe(true);
      expect(
        logs.some((l: { message: string }) => / created /.test(l.message)),
        name,
      ).toBe(false);
    }
    // Only an end: the 30 minutes before it; only a start: from it to now.
    const early = (await api.post(r.samplerLogs, { end_epoch_millis: createdAt + 1000 })).body.logs;
    expect(early.some((l: { message: string }) => / created /.test(l.message))).toBe(true);
    expect(early.every((l: { timestamp: string }) => ms(l) <= createdAt + 1000)).toBe(true);
    const all = (await api.get(`${r.trainerLogs}?start_epoch_millis=${createdAt}`)).body.logs;
    expect(all.some((l: { message: string }) => / created /.test(l.message))).toBe(true);
    expect(ms(all[0])).toBe(now);
    const both = (await api.post(r.samplerLogs, { start_epoch_millis: createdAt, end_epoch_millis: now })).body.logs;
    expect(both.length).toBeGreaterThan((await api.post(r.samplerLogs, {})).body.logs.length);
  });

  it('carry timestamp as a string of epoch nanoseconds, and replica always (a string or null)', async () => {
    const r = await start();
    await traffic(r);
    for (const logs of [(await api.get(r.trainerLogs)).body.logs, (await api.post(r.samplerLogs, {})).body.logs]) {
      for (const line of logs) {
        expect(line.timestamp).toMatch(/^\d{19}$/);
        expect(BigInt(line.timestamp)).toBe(BigInt(clock.now()) * 1_000_000n);
        expect(Object.hasOwn(line, 'replica')).toBe(true);
        expect(line.replica === null || typeof line.replica === 'string').toBe(true);
      }
    }
  });

  it('refuse bad values with a 400 naming the field, on either route and either method', async () => {
    const r = await start();
    const now = clock.now();
    const day = 24 * 60 * MINUTE;
    const cases: [string, Promise<{ status: number; body: any }>, string][] = [
      ['start after end (GET)', api.get(`${r.trainerLogs}?start_epoch_millis=${now}&end_epoch_millis=${now - 1}`), 'query.start_epoch_millis'],
      ['start after end (POST)', api.post(r.samplerLogs, { start_epoch_millis: now + MINUTE }), 'body.start_epoch_millis'],
      ['a window over 7 days (GET)', api.get(`${r.samplerLogs}?start_epoch_millis=${now - 8 * day}`), 'query.start_epoch_millis'],
      ['a window over 7 days (POST)', api.post(r.samplerLogs, { start_epoch_millis: now - 8 * day, end_epoch_millis: now }), 'body.start_epoch_millis'],
      ['beyond the year 9999', api.post(r.samplerLogs, { end_epoch_millis: 2 ** 52 }), 'body.end_epoch_millis'],
      ['a negative start', api.post(r.samplerLogs, { start_epoch_millis: -5 }), 'body.start_epoch_millis'],
      ['an unknown direction (GET)', api.get(`${r.trainerLogs}?direction=up`), 'query.direction'],
      ['an unknown direction (POST)', api.post(r.samplerLogs, { direction: 'newest' }), 'body.direction'],
      ['limit 0', api.post(r.samplerLogs, { limit: 0 }), 'body.limit'],
      ['limit over 1000', api.post(r.samplerLogs, { limit: 1001 }), 'body.limit'],
      ['limit as text', api.post(r.samplerLogs, { limit: 'ten' }), 'body.limit'],
      ['an unknown field', api.post(r.samplerLogs, { since: '30m' }), 'body.since'],
      ['a body that is no object', api.post(r.samplerLogs, [1]), 'body'],
    ];
    for (const [name, pending, field] of cases) {
      const res = await pending;
      expect(res.status, name).toBe(400);
      expect(res.body.error.type, name).toBe('invalid_request');
      expect(res.body.error.field, name).toBe(field);
      expect(res.body.error.message, name).toContain(field.split('.').pop());
    }
  });

  it("answer truss's exact calls over HTTP: `loops logs --sampler` (POST {}), its tail's POST with a range, and `loops logs`'s GET", async () => {
    clock = new ManualClock(Date.now());
    server = await startTestServer({ clock, coldStartMs: 0 });
    api = client(server);
    const run = await newRun(api);
    clock.advance(1000);
    await server.app.inject({ method: 'POST', url: `${new URL(run.sampler.base_url).pathname}/sample`, payload: {} });
    // What requests.post(url, headers=..., json={}) puts on the wire for truss's RestAPIClient.post.
    const truss = (path: string, body?: string, method = 'POST') =>
      fetch(`${server.url}/${path}`, {
        method,
        headers: {
          authorization: `Api-Key ${server.apiKey ?? 'truss-key'}`,
          'user-agent': 'truss-cli/0.18.36 (Python/3.11.2; Linux)',
          accept: '*/*',
          'accept-encoding': 'gzip, deflate',
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body,
      });
    const modelLogs = `v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}/logs`;
    const plain = await truss(modelLogs, '{}');
    expect(plain.status).toBe(200);
    const lines = ((await plain.json()) as { logs: { timestamp: string; message: string; replica: string | null }[] }).logs;
    // truss parses each line as {timestamp: str, message: str, replica: Optional[str]} and reverses the list to print oldest first.
    const printed = [...lines].reverse();
    expect(printed.map(ms)).toEqual(printed.map(ms).sort((a, b) => a - b));
    expect(printed[0]!.message).toMatch(/^Sampler .* created for /);
    expect(printed.at(-1)!.message).toMatch(/^POST \/sample -> 400/);
    // The tail (ModelDeploymentLogWatcher): end now + 60 s of clock-skew buffer, then a start a minute before its last poll.
    const now = clock.now();
    const tail = await truss(modelLogs, JSON.stringify({ end_epoch_millis: now + 60_000 }));
    expect(((await tail.json()) as { logs: unknown[] }).logs).toEqual(lines);
    const next = await truss(modelLogs, JSON.stringify({ start_epoch_millis: now - 60_000, end_epoch_millis: now + 60_000 }));
    expect(((await next.json()) as { logs: unknown[] }).logs).toEqual(lines);
    // get_loops_deployment_logs: GET with the range as string query parameters (none without one).
    const trainer = await truss(
      `v1/loops/deployments/${run.deployment_id}/logs?start_epoch_millis=${now - 60_000}&end_epoch_millis=${now + 60_000}`,
      undefined,
      'GET',
    );
    expect(trainer.status).toBe(200);
    const trainerLines = ((await trainer.json()) as { logs: { timestamp: string }[] }).logs;
    expect(trainerLines.map(ms)).toEqual(trainerLines.map(ms).sort((a, b) => b - a));
    expect((await truss(`v1/loops/deployments/${run.deployment_id}/logs`, undefined, 'GET')).status).toBe(200);
  });
});
