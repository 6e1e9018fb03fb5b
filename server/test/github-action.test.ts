import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { REPO_ROOT } from './helpers.js';

/**
 * The repository's GitHub Action (action.yml, composite): its steps run here as a runner runs them, each
 * `run` under bash with its `env`, `${{ inputs.* }}` and `${{ github.action_path }}` filled in, and
 * temporary GITHUB_ENV, GITHUB_STATE and GITHUB_OUTPUT files. The built server (dist/) is the command.
 */
interface Step {
  id: string;
  if?: string;
  shell: string;
  env?: Record<string, string>;
  run: string;
}
interface Action {
  inputs: Record<string, { default: string }>;
  runs: { using: string; steps: Step[] };
}
const action = parse(readFileSync(join(REPO_ROOT, 'action.yml'), 'utf8')) as Action;
const dir = mkdtempSync(join(tmpdir(), 'github-action-'));
const pids: number[] = [];
afterEach(() => {
  for (const pid of pids.splice(0)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone already */
    }
  }
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A GitHub expression of the two shapes action.yml uses: inputs.X == 'v' and inputs.X != 'v'. */
function holds(condition: string | undefined, inputs: Record<string, string>): boolean {
  if (condition === undefined) return true;
  const m = /^inputs\.([\w-]+) (==|!=) '([^']*)'$/.exec(condition.trim());
  if (!m) throw new Error(`the test does not read the condition '${condition}'`);
  return (inputs[m[1]!] === m[3]) === (m[2] === '==');
}

const fill = (text: string, inputs: Record<string, string>) =>
  text
    .replace(/\$\{\{\s*inputs\.([\w-]+)\s*\}\}/g, (_, name: string) => {
      if (!(name in inputs)) throw new Error(`action.yml uses an input it does not declare: ${name}`);
      return inputs[name]!;
    })
    .replace(/\$\{\{\s*github\.action_path\s*\}\}/g, REPO_ROOT);

/** Parses KEY=value lines (what GITHUB_ENV, GITHUB_STATE and GITHUB_OUTPUT hold). */
const lines = (path: string) =>
  Object.fromEntries(
    readFileSync(path, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );

/** Runs the action once, as `uses: ./` with `with`, in a job whose environment so far is `jobEnv`. */
function runAction(name: string, given: Record<string, string>, jobEnv: Record<string, string> = {}) {
  const inputs = Object.fromEntries(Object.entries(action.inputs).map(([k, v]) => [k, given[k] ?? v.default]));
  for (const k of Object.keys(given)) if (!(k in action.inputs)) throw new Error(`no input ${k}`);
  mkdirSync(join(dir, name), { recursive: true });
  const files = { GITHUB_ENV: join(dir, `${name}.env`), GITHUB_STATE: join(dir, `${name}.state`), GITHUB_OUTPUT: join(dir, `${name}.output`) };
  for (const f of Object.values(files)) writeFileSync(f, '');
  const ran: string[] = [];
  for (const step of action.runs.steps) {
    if (!holds(step.if, inputs)) continue;
    expect(step.shell).toBe('bash');
    const env = Object.fromEntries(Object.entries(step.env ?? {}).map(([k, v]) => [k, fill(String(v), inputs)]));
    const result = spawnSync('bash', ['-e', '-c', fill(step.run, inputs)], {
      cwd: dir,
      encoding: 'utf8',
      timeout: 120_000,
      env: { PATH: process.env.PATH ?? '', HOME: dir, RUNNER_TEMP: join(dir, name), ...jobEnv, ...files, GITHUB_ACTION_PATH: REPO_ROOT, ...env },
    });
    expect(result.status, `${step.id}: ${result.stdout}${result.stderr}`).toBe(0);
    ran.push(step.id);
  }
  return { ran, env: lines(files.GITHUB_ENV), state: lines(files.GITHUB_STATE), output: lines(files.GITHUB_OUTPUT) };
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z');
  } catch {
    return false;
  }
};
const COMMAND = join(REPO_ROOT, 'bin', 'loops-mock.js');

describe('the GitHub Action (action.yml)', () => {
  it('is a composite action whose inputs are all used', () => {
    expect(action.runs.using).toBe('composite');
    const text = readFileSync(join(REPO_ROOT, 'action.yml'), 'utf8');
    for (const input of Object.keys(action.inputs)) expect(text, input).toMatch(new RegExp(`inputs\\.${input}\\b`));
  });

  it('starts loops-mock in the background, writes its variables to GITHUB_ENV for the later steps, and stop: true stops it', async () => {
    const started = runAction('direct', { command: COMMAND, port: '0', args: '--warm none --log-level warn' });
    expect(started.ran).toEqual(['start']);
    const pid = Number(started.env.LOOPS_MOCK_PID);
    pids.push(pid);
    expect(Object.keys(started.env)).toEqual([
      'LOOPS_BASE_URL',
      'BASETEN_API_KEY',
      'BASETEN_MANAGEMENT_API_URL_OVERRIDE',
      'HF_ENDPOINT',
      'LOOPS_MOCK_PID',
      'LOOPS_MOCK_LOG',
    ]);
    expect(started.state).toEqual({ pid: String(pid) });
    expect(started.output.url).toBe(started.env.LOOPS_BASE_URL);
    // The step is over; the server answers the job's next steps with the key it printed.
    const res = await fetch(`${started.env.LOOPS_BASE_URL}/v1/loops/capabilities`, { headers: { authorization: `Bearer ${started.env.BASETEN_API_KEY}` } });
    expect(res.status).toBe(200);
    expect(readFileSync(started.env.LOOPS_MOCK_LOG!, 'utf8')).not.toContain('"level":50');
    const stopped = runAction('direct-stop', { stop: 'true' }, started.env);
    expect(stopped.ran).toEqual(['stop']);
    expect(alive(pid)).toBe(false);
    await expect(fetch(`${started.env.LOOPS_BASE_URL}/healthz`)).rejects.toThrow();
  }, 120_000);

  it("with proxy: true writes the proxy's five variables instead", async () => {
    const started = runAction('proxy', { command: COMMAND, port: '0', proxy: 'true', args: `--warm none --log-level warn --ca-dir ${join(dir, 'ca')}` });
    pids.push(Number(started.env.LOOPS_MOCK_PID));
    expect(Object.keys(started.env)).toEqual([
      'BASETEN_API_KEY',
      'HTTPS_PROXY',
      'SSL_CERT_FILE',
      'REQUESTS_CA_BUNDLE',
      'NODE_EXTRA_CA_CERTS',
      'LOOPS_MOCK_PID',
      'LOOPS_MOCK_LOG',
    ]);
    expect(started.env.SSL_CERT_FILE).toBe(join(dir, 'ca', 'ca-bundle.pem'));
    runAction('proxy-stop', { stop: 'true' }, started.env);
    expect(alive(Number(started.env.LOOPS_MOCK_PID))).toBe(false);
  }, 120_000);

  it("fails the step with the server's own message when it cannot start", () => {
    const inputs = { command: COMMAND, port: '0', args: '--warm nonsense' };
    const files = { GITHUB_ENV: join(dir, 'bad.env') };
    writeFileSync(files.GITHUB_ENV, '');
    const step = action.runs.steps.find((s) => s.id === 'start')!;
    const all = Object.fromEntries(Object.entries(action.inputs).map(([k, v]) => [k, (inputs as Record<string, string>)[k] ?? v.default]));
    const env = Object.fromEntries(Object.entries(step.env ?? {}).map(([k, v]) => [k, fill(String(v), all)]));
    const result = spawnSync('bash', ['-e', '-c', fill(step.run, all)], {
      cwd: dir,
      encoding: 'utf8',
      env: { PATH: process.env.PATH ?? '', HOME: dir, RUNNER_TEMP: dir, ...files, ...env },
    });
    expect(result.status).toBe(1);
    expect(result.stdout).toContain('::error::loops-mock exited before it was listening');
    expect(result.stdout).toContain("--warm: 'nonsense' is not a supported base model");
    expect(readFileSync(files.GITHUB_ENV, 'utf8')).toBe('');
  });

  it('stop: true with nothing started is a no-op that succeeds', () => {
    expect(runAction('nothing', { stop: 'true' }).ran).toEqual(['stop']);
  });
});
