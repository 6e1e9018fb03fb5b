import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EnginePool } from '../models/index.js';
import { parseScenario, readScenarioSource, shippedScenarioNames } from '../server/admin/scenario.js';
import { startServer } from '../server/index.js';
import { CHECKS, type Check, type CheckResult, type ClientOutput, type Evidence } from './checks.js';
import { TASK_NAMES, taskInputs, type TaskName } from './tasks.js';

/** What the checks read: the Loops planes (not the admin API, the Hub mirror or the proxy's CONNECTs). */
const LOOPS_SURFACES: ReadonlySet<string> = new Set(['control', 'trainer', 'sampler']);

/** One conformance case: a task run against a server under a scenario. */
export interface CaseSpec {
  scenario: string;
  task: TaskName;
  /** ok: the task must complete; error: the scenario makes it fail by design. */
  expect: 'ok' | 'error';
}

export interface CaseReport extends CaseSpec {
  durationMs: number;
  exitCode: number | null;
  timedOut: boolean;
  /** What the client wrote to LOOPS_CONFORMANCE_OUTPUT (null when nothing readable). */
  output: ClientOutput | null;
  results: { check: Check; result: CheckResult }[];
}

export interface RunOptions {
  /** The client command, run through the shell. */
  client: string;
  /** Seconds a case's client may run before it is killed. */
  timeoutS: number;
  /** Engines shared by the cases' servers, so graphs are built once; each case still gets its own server and state. */
  engines?: EnginePool;
  /**
   * Proxy mode: each server also intercepts Baseten's hosts, and the client
   * gets no LOOPS_BASE_URL, only HTTPS_PROXY and the CA variables (an
   * unmodified client keeps https://api.baseten.co). The CA folder is shared by the cases.
   */
  proxy?: { caDir: string };
}

/** The cases of the shipped scenarios (their `conformance.tasks`), optionally only some scenarios and tasks. */
export function listCases(scenarios?: string[], tasks?: string[]): CaseSpec[] {
  const names = shippedScenarioNames();
  for (const s of scenarios ?? []) if (!names.includes(s)) throw new Error(`unknown scenario '${s}'; known: ${names.join(', ')}`);
  for (const t of tasks ?? []) if (!(TASK_NAMES as string[]).includes(t)) throw new Error(`unknown task '${t}'; known: ${TASK_NAMES.join(', ')}`);
  const cases: CaseSpec[] = [];
  for (const scenario of names) {
    if (scenarios?.length && !scenarios.includes(scenario)) continue;
    const source = readScenarioSource(scenario);
    const spec = parseScenario(source.text, source.source) as { conformance?: { tasks?: Record<string, string> } };
    for (const [task, expect] of Object.entries(spec.conformance?.tasks ?? {})) {
      if (!(TASK_NAMES as string[]).includes(task) || (expect !== 'ok' && expect !== 'error'))
        throw new Error(`scenario ${scenario}: conformance.tasks.${task}: expected a task (${TASK_NAMES.join(', ')}) mapped to ok or error`);
      if (tasks?.length && !tasks.includes(task)) continue;
      cases.push({ scenario, task: task as TaskName, expect });
    }
  }
  return cases;
}

/**
 * Runs one case: a fresh server (own port, own data folder, admin API with a
 * random token, whole bodies in its journal) under the scenario, the client
 * as a subprocess with the Loops variables, then every check.
 */
export async function runCase(spec: CaseSpec, options: RunOptions): Promise<CaseReport> {
  const started = performance.now();
  const dir = mkdtempSync(join(tmpdir(), `loops-conformance-${spec.scenario}-`));
  const apiKey = `conformance-${randomBytes(6).toString('hex')}`;
  const server = await startServer({
    port: 0,
    logLevel: 'silent',
    dataDir: join(dir, 'state'),
    admin: true,
    adminToken: randomBytes(16).toString('hex'),
    journalDetail: 'full',
    journalSize: 1_000_000,
    scenario: spec.scenario,
    engines: options.engines,
    ...(options.proxy ? { proxy: true, caDir: options.proxy.caDir } : {}),
  });
  try {
    const input = join(dir, 'input.json');
    const output = join(dir, 'output.json');
    writeFileSync(input, JSON.stringify(taskInputs()[spec.task]));
    // The server's own variables (the URLs, or the proxy and its CA), with this case's key.
    const exit = await runClient(
      options.client,
      {
        ...server.env,
        BASETEN_API_KEY: apiKey,
        LOOPS_CONFORMANCE_TASK: spec.task,
        LOOPS_CONFORMANCE_INPUT: input,
        LOOPS_CONFORMANCE_OUTPUT: output,
      },
      options.timeoutS * 1000,
    );
    let out: ClientOutput | null = null;
    try {
      out = JSON.parse(readFileSync(output, 'utf8')) as ClientOutput;
    } catch {
      out = null;
    }
    const principal = server.core.accounts.authenticate(apiKey);
    const evidence: Evidence = {
      ...spec,
      journal: server.core.journal.query({}).filter((e) => LOOPS_SURFACES.has(e.surface)),
      output: out,
      exit,
      runs: server.core.fleet.listRuns(principal, { scope: 'org' }).map((r) => ({ id: r.id, status: r.status, reason: r.inactive_reason })),
    };
    const results = CHECKS.map((check) => ({ check, result: evaluate(check, evidence) }));
    return { ...spec, durationMs: Math.round(performance.now() - started), exitCode: exit.code, timedOut: exit.timedOut, output: out, results };
  } finally {
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A check that throws is a failure of the check, reported, never a crash of the suite. */
function evaluate(check: Check, evidence: Evidence): CheckResult {
  try {
    return check.evaluate(evidence);
  } catch (err) {
    return { verdict: 'FAIL', reason: `the check could not read the evidence: ${(err as Error).message}` };
  }
}

/** Runs the client command in its own process group, killed whole at the timeout. */
function runClient(command: string, env: Record<string, string>, timeoutMs: number): Promise<Evidence['exit']> {
  return new Promise((resolve) => {
    const child = spawn(command, { shell: true, detached: true, env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    let timedOut = false;
    child.stderr!.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }, timeoutMs);
    child.on('error', (err) => {
      stderr += `\ncould not start the client: ${err.message}`;
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, timedOut, stderrTail: stderr.trim().split('\n').slice(-8).join('\n') });
    });
  });
}

/** Runs cases one after another (each client gets the machine to itself). */
export async function runSuite(cases: CaseSpec[], options: RunOptions, onCase?: (r: CaseReport) => void): Promise<CaseReport[]> {
  const reports: CaseReport[] = [];
  for (const spec of cases) {
    const report = await runCase(spec, options);
    reports.push(report);
    onCase?.(report);
  }
  return reports;
}

/** Whether any MUST check failed: the suite's exit status. */
export function mustFailed(reports: CaseReport[]): boolean {
  return reports.some((r) => r.results.some((x) => x.check.level === 'MUST' && x.result.verdict === 'FAIL'));
}
