import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { CHECKS } from '../checks.js';
import { jsonReport, textReport, writeReports } from '../report.js';
import { listCases, mustFailed, runCase, type CaseReport, type CaseSpec } from '../runner.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const DRIVER = `python3 ${join(ROOT, 'conformance/drivers/python/driver.py')}`;
// One engine pool for every case: graphs are built once; each case still gets a fresh server.
const engines = new EnginePool();
afterAll(() => engines.close());

const failedChecks = (r: CaseReport) =>
  r.results
    .filter((x) => x.result.verdict === 'FAIL')
    .map((x) => x.check.id)
    .sort();
const explain = (r: CaseReport) => textReport([r]);

describe('the reference Python driver', () => {
  const cases = listCases();

  it('covers every shipped scenario and every task', () => {
    expect(new Set(cases.map((c) => c.task))).toEqual(new Set(['sft-round', 'rl-step', 'rl-guide-step', 'deploy-chat', 'resume', 'cleanup']));
    expect(cases.length).toBeGreaterThanOrEqual(14);
  });

  it.each(cases.map((c) => [`${c.scenario}/${c.task}`, c] as [string, CaseSpec]))(
    'passes %s',
    async (_name, spec) => {
      const report = await runCase(spec, { client: DRIVER, timeoutS: 90, engines });
      expect(failedChecks(report), explain(report)).toEqual([]);
      // Each scenario's hard case is really met, not skipped.
      const verdict = (id: string) => report.results.find((x) => x.check.id === id)!.result.verdict;
      const exercised: Record<string, string[]> = {
        'lagging-replica': ['FLOOR-2', 'FLOOR-3', 'RATIO-1'],
        'lost-operation': ['IDEM-2'],
        'dropped-submit': ['IDEM-2'],
        'long-operations': ['POLL-1'],
        'user-error': ['ERR-1'],
        'sampling-backpressure': ['RATE-1'],
        'shutdown-mid-run': ['SHUT-1'],
        'flaky-network': ['SHUT-1'],
        'slow-model-deploy': ['DEPLOY-1', 'DEPLOY-2', 'DEPLOY-3'],
      };
      for (const id of exercised[spec.scenario] ?? []) expect(verdict(id), `${id} in ${spec.scenario}`).toBe('PASS');
      // The deployed checkpoint answered the chat, with true token counts.
      if (spec.task === 'deploy-chat') {
        expect(typeof report.output!.answer).toBe('string');
        expect((report.output!.usage as { completion_tokens: number }).completion_tokens).toBeGreaterThan(0);
      }
      // The RL guide's datums, built from the sampler's own answers: the trainer sees no divergence from the sampler.
      if (spec.task === 'rl-guide-step') {
        expect(verdict('RATIO-1')).toBe('PASS');
        for (const d of report.output!.divergence as { ratio_mean: number; kl_sampler_trainer: number }[]) {
          expect(Math.abs(d.ratio_mean - 1)).toBeLessThan(1e-3);
          expect(Math.abs(d.kl_sampler_trainer)).toBeLessThan(1e-4);
        }
      }
    },
    120_000,
  );
});

describe('the reference driver behind the proxy (no LOOPS_BASE_URL: https://api.baseten.co, HTTPS_PROXY and the CA)', () => {
  const caDir = mkdtempSync(join(tmpdir(), 'conformance-ca-'));
  const proxied: CaseSpec[] = [
    { scenario: 'baseline', task: 'sft-round', expect: 'ok' },
    { scenario: 'lagging-replica', task: 'rl-step', expect: 'ok' },
    { scenario: 'flaky-network', task: 'sft-round', expect: 'ok' },
  ];
  it.each(proxied.map((c) => [`${c.scenario}/${c.task}`, c] as [string, CaseSpec]))(
    'passes %s with the checks read as in direct mode',
    async (_name, spec) => {
      const report = await runCase(spec, { client: DRIVER, timeoutS: 90, engines, proxy: { caDir } });
      expect(failedChecks(report), explain(report)).toEqual([]);
      expect(report.results.find((x) => x.check.id === 'DONE-1')!.result.verdict).toBe('PASS');
      if (spec.scenario === 'lagging-replica') expect(report.results.find((x) => x.check.id === 'RATIO-1')!.result.verdict).toBe('PASS');
    },
    120_000,
  );
});

/** Each broken variant, the case that exposes it, and exactly the checks it must fail. */
const BROKEN: [string, CaseSpec, string[], number?][] = [
  ['no-408-retry', { scenario: 'lagging-replica', task: 'rl-step', expect: 'ok' }, ['DONE-1', 'FLOOR-2']],
  ['forget-idempotency-key', { scenario: 'dropped-submit', task: 'sft-round', expect: 'ok' }, ['IDEM-2', 'IDEM-3']],
  ['forget-idempotency-key', { scenario: 'lost-operation', task: 'sft-round', expect: 'ok' }, ['IDEM-2', 'IDEM-3']],
  ['no-idempotency-key', { scenario: 'baseline', task: 'sft-round', expect: 'ok' }, ['IDEM-1']],
  ['ignore-floor', { scenario: 'lagging-replica', task: 'rl-step', expect: 'ok' }, ['FLOOR-1', 'FLOOR-3']],
  ['shifted-logprobs', { scenario: 'baseline', task: 'rl-guide-step', expect: 'ok' }, ['RATIO-1']],
  ['deploy-by-name-only', { scenario: 'baseline', task: 'deploy-chat', expect: 'ok' }, ['DEPLOY-1', 'DONE-1']],
  ['chat-before-active', { scenario: 'slow-model-deploy', task: 'deploy-chat', expect: 'ok' }, ['DEPLOY-2', 'DONE-1', 'SHUT-1']],
  ['skip-cleanup-on-failure', { scenario: 'baseline', task: 'cleanup', expect: 'error' }, ['CLEAN-1']],
  ['poll-forever-on-user-error', { scenario: 'user-error', task: 'sft-round', expect: 'error' }, ['CLEAN-1', 'ERR-1', 'EXIT-1'], 8],
];

describe('broken variants of the driver', () => {
  it.each(BROKEN.map(([variant, spec, fails, timeout]) => [`${variant} in ${spec.scenario}/${spec.task}`, variant, spec, fails, timeout] as const))(
    'fail exactly their checks: %s',
    async (_name, variant, spec, fails, timeout) => {
      const report = await runCase(spec, { client: `${DRIVER} --broken ${variant}`, timeoutS: timeout ?? 90, engines });
      expect(failedChecks(report), explain(report)).toEqual([...fails].sort());
      expect(mustFailed([report])).toBe(true);
    },
    120_000,
  );
});

describe('reports', () => {
  const fake = (verdicts: Record<string, 'PASS' | 'FAIL' | 'SKIP'>): CaseReport => ({
    scenario: 'baseline',
    task: 'sft-round',
    expect: 'ok',
    durationMs: 1234,
    exitCode: 0,
    timedOut: false,
    output: null,
    results: CHECKS.map((check) => ({
      check,
      result: {
        verdict: verdicts[check.id] ?? 'PASS',
        reason: verdicts[check.id] === 'FAIL' ? 'because <reasons> & more' : undefined,
        evidence: ['#3 GET /x -> 404'],
      },
    })),
  });

  it('prints a table, writes JUnit XML and JSON, and only MUST failures fail the run', () => {
    const should = fake({ 'POLL-2': 'FAIL' });
    const must = fake({ 'IDEM-1': 'FAIL', 'RATE-1': 'SKIP' });
    expect(mustFailed([should])).toBe(false);
    expect(mustFailed([should, must])).toBe(true);
    const text = textReport([must]);
    expect(text).toMatch(/baseline\/sft-round\s+PASS\s+PASS\s+PASS\s+FAIL/);
    expect(text).toContain('IDEM-1 (MUST): every trainer submission carries an Idempotency-Key');
    const dir = mkdtempSync(join(tmpdir(), 'conformance-report-'));
    const written = writeReports(dir, [must]);
    const junit = readFileSync(written.junit, 'utf8');
    expect(junit).toContain('<testsuite name="baseline/sft-round" tests="20" failures="1" skipped="1"');
    expect(junit).toContain('<failure type="MUST" message="because &lt;reasons&gt; &amp; more">#3 GET /x -&gt; 404</failure>');
    expect(JSON.parse(readFileSync(written.json, 'utf8'))).toEqual(JSON.parse(JSON.stringify(jsonReport([must]))));
  });

  it('the command lists cases and refuses bad flags with exit status 2', () => {
    const cli = join(ROOT, 'conformance/cli.ts');
    const list = spawnSync(process.execPath, ['--import', 'tsx', cli, 'list'], { cwd: ROOT, encoding: 'utf8' });
    expect(list.status).toBe(0);
    expect(list.stdout).toContain('lagging-replica/rl-step: ok');
    const bad = spawnSync(process.execPath, ['--import', 'tsx', cli, 'run', '--client', 'true', '--scenario', 'nope'], { cwd: ROOT, encoding: 'utf8' });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain("unknown scenario 'nope'");
    const missing = spawnSync(process.execPath, ['--import', 'tsx', cli, 'run'], { cwd: ROOT, encoding: 'utf8' });
    expect([missing.status, missing.stderr.includes('--client')]).toEqual([2, true]);
  });
});
