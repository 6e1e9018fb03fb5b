import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { readFixtures, replayFixture } from '../../conformance/replay.js';
import { EnginePool } from '../../models/index.js';
import { startServer, type RunningServer } from '../../server/index.js';
import type { Fixture } from '../../server/record/fixture-format.js';
import { ERROR_FLOWS } from '../error-flows.js';
import { FIXTURES_DIR, recordErrorFlow, recordTask } from '../record.js';

const engines = new EnginePool();
const servers: RunningServer[] = [];
afterAll(async () => {
  for (const s of servers) await s.close();
  await engines.close();
});
async function mock() {
  const s = await startServer({ port: 0, logLevel: 'silent', engines });
  servers.push(s);
  return s;
}

describe('sdk-fixtures', () => {
  const fixtures = readFixtures(FIXTURES_DIR);

  it("hold the guides' flows and every error flow", () => {
    expect(fixtures.map((f) => f.name).sort()).toEqual(['task-cleanup', 'task-resume', 'task-rl-step', 'task-sft-round', ...Object.keys(ERROR_FLOWS)].sort());
    const text = fixtures.map((f) => JSON.stringify(f)).join('\n');
    expect(text).not.toMatch(/127\.0\.0\.1|localhost|fixtures-key|Bearer/);
    expect(text).toContain('{key:1}');
  });

  it.each(fixtures.map((f) => [f.name, f] as [string, Fixture]))(
    '%s replays against loops-mock with no difference',
    async (_name, fixture) => {
      const server = await mock();
      const result = await replayFixture(fixture, { server: server.url, key: 'replay-key' });
      expect(result.differences.join('\n')).toBe('');
    },
    60_000,
  );

  it('replay reports a changed status, a missing field, a new field and a changed type', async () => {
    const server = await mock();
    const fixture = structuredClone(fixtures.find((f) => f.name === 'errors-sampler-floor')!);
    const run = fixture.exchanges[1]!.response.shape as Record<string, Record<string, unknown>>;
    run.run!.renamed_field = 'string';
    delete run.run!.status;
    run.run!.name = 'number';
    fixture.exchanges[2]!.response.status = 200;
    const { differences } = await replayFixture(fixture, { server: server.url, key: 'replay-key' });
    expect(differences).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/#2 POST \/v1\/loops\/runs: \.run\.renamed_field: missing/),
        expect.stringMatching(/#2 .*\.run\.status: not in the fixture/),
        expect.stringMatching(/#2 .*\.run\.name: expected number, got string/),
        expect.stringMatching(/#3 POST \{base_url_2\}\/sample: status 408, the fixture has 200/),
      ]),
    );
  }, 60_000);

  it('record then replay round-trips: a flow recorded in front of one mock replays on another', async () => {
    const upstream = await mock();
    const out = mkdtempSync(join(tmpdir(), 'recorded-'));
    const file = await recordTask(upstream.url, 'recorded-key', out, 'sft-round');
    const scripted = await recordErrorFlow(upstream.url, 'recorded-key', out, 'errors-sampler-floor');
    const text = readFileSync(file, 'utf8');
    expect(text).not.toContain('recorded-key');
    const recorded = JSON.parse(text) as Fixture;
    expect(recorded.exchanges.some((e) => e.poll)).toBe(true);
    // What went through the recorder really happened upstream.
    expect(upstream.core.journal.size).toBeGreaterThan(recorded.exchanges.length);
    const other = await mock();
    for (const f of [recorded, JSON.parse(readFileSync(scripted, 'utf8')) as Fixture]) {
      expect((await replayFixture(f, { server: other.url, key: 'someone-else' })).differences.join('\n')).toBe('');
    }
    const runs = await (await fetch(`${other.url}/v1/loops/runs`, { headers: { authorization: 'Bearer someone-else' } })).json();
    expect(runs.runs.length).toBeGreaterThan(0);
  }, 120_000);
});

describe('the record and replay commands', () => {
  const root = resolve(FIXTURES_DIR, '..');
  const tsx = (script: string, args: string[]) => [process.execPath, ['--import', 'tsx', join(root, script), ...args]] as const;

  it('loops-mock record writes what a client did; loops-conformance replay checks it against another endpoint', async () => {
    const upstream = await mock();
    const out = mkdtempSync(join(tmpdir(), 'cli-record-'));
    const [node, args] = tsx('server/cli.ts', ['record', '--upstream', upstream.url, '--out', out, '--flow', 'by-hand']);
    const child = spawn(node, [...args], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
    const url = await new Promise<string>((done) => {
      let text = '';
      child.stdout!.on('data', (d) => {
        text += d;
        const m = /^LOOPS_BASE_URL=(\S+)$/m.exec(text);
        if (m && text.includes('# loops-mock')) done(m[1]!);
      });
    });
    const headers = { authorization: 'Bearer by-hand-key', 'content-type': 'application/json' };
    const session = await (await fetch(`${url}/v1/loops/sessions`, { method: 'POST', headers })).json();
    await fetch(`${url}/v1/loops/sessions/${session.session.id}`, { headers });
    await fetch(`${url}/v1/loops/runs`, { method: 'POST', headers, body: JSON.stringify({ session_id: session.session.id, base_model: 'nope' }) });
    child.kill('SIGTERM');
    await new Promise((done) => child.on('close', done));
    const file = join(out, 'by-hand.json');
    const fixture = JSON.parse(readFileSync(file, 'utf8')) as Fixture;
    expect(fixture.exchanges.map((e) => [e.request.method, e.request.url, e.response.status])).toEqual([
      ['POST', '/v1/loops/sessions', 200],
      ['GET', '/v1/loops/sessions/{id_1}', 200],
      ['POST', '/v1/loops/runs', 400],
    ]);
    const other = await mock();
    const [rnode, rargs] = tsx('conformance/cli.ts', ['replay', '--server', other.url, '--key', 'k2', '--fixtures', out]);
    // Asynchronously: the endpoint it replays against lives in this process.
    const run = () =>
      new Promise<{ status: number | null; stdout: string }>((done) => {
        const c = spawn(rnode, [...rargs], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
        let stdout = '';
        c.stdout!.on('data', (d) => {
          stdout += d;
        });
        c.on('close', (status) => done({ status, stdout }));
      });
    const ok = await run();
    expect([ok.status, ok.stdout]).toEqual([0, expect.stringContaining('OK   by-hand (3 exchanges)')]);
    fixture.exchanges[2]!.response.status = 404;
    writeFileSync(file, JSON.stringify(fixture));
    const diff = await run();
    expect(diff.status).toBe(1);
    expect(diff.stdout).toContain('#3 POST /v1/loops/runs: status 400, the fixture has 404');
  }, 60_000);

  it('refuse missing or bad arguments with one clear line and exit status 2', async () => {
    const run = (script: string, args: string[]) =>
      new Promise<{ status: number | null; stderr: string }>((done) => {
        const [node, full] = tsx(script, args);
        const c = spawn(node, [...full], { cwd: root, stdio: ['ignore', 'ignore', 'pipe'] });
        let stderr = '';
        c.stderr!.on('data', (d) => {
          stderr += d;
        });
        c.on('close', (status) => done({ status, stderr }));
      });
    for (const [script, args, fragment] of [
      ['server/cli.ts', ['record', '--out', '/tmp/x'], 'record needs --upstream URL'],
      ['server/cli.ts', ['record', '--upstream', 'ftp://x', '--out', '/tmp/x'], 'record needs --upstream URL'],
      ['server/cli.ts', ['record', '--upstream', 'http://127.0.0.1:1'], 'record needs --out DIR'],
      ['server/cli.ts', ['record', '--upstream', 'http://127.0.0.1:1', '--out', '/tmp/x', '--flow', '../evil'], '--flow must be a file name'],
      ['conformance/cli.ts', ['replay', '--server', 'http://127.0.0.1:1'], '--key KEY is required'],
      ['conformance/cli.ts', ['replay', '--key', 'k'], '--server URL is required'],
      ['conformance/cli.ts', ['replay', '--server', 'http://127.0.0.1:1', '--key', 'k', '--flow', 'nope'], 'unknown flow nope'],
    ] as [string, string[], string][]) {
      const { status, stderr } = await run(script, args);
      expect(status, args.join(' ')).toBe(2);
      expect(stderr, args.join(' ')).toContain(fragment);
    }
  }, 60_000);
});
