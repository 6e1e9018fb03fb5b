import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { REPO_ROOT } from './helpers.js';

/**
 * No stray server (issue 28): however the process that started loops-mock goes (kill of npx, SIGTERM or
 * SIGKILL of pytest, SIGKILL of a node parent), the server goes too, with --exit-with-parent, which the
 * README's CI pattern and the pytest plugin use. Real processes, the built server (dist/).
 */
const BIN = join(REPO_ROOT, 'bin', 'loops-mock.js');
const PYTHON = join(REPO_ROOT, '.venv', 'bin', 'python');
const dir = mkdtempSync(join(tmpdir(), 'stray-server-'));
const started: ChildProcess[] = [];
const leftovers: number[] = [];
afterEach(() => {
  for (const c of started.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  // A server a failed test left behind: by its own id, never by name.
  for (const pid of leftovers.splice(0)) if (alive(pid)) process.kill(pid, 'SIGKILL');
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Whether a process runs (a zombie waiting for its reaper does not). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

const refused = (port: number) =>
  new Promise<boolean>((resolve) => {
    const probe = connect(port, '127.0.0.1');
    probe.once('connect', () => {
      probe.destroy();
      resolve(false);
    });
    probe.once('error', () => resolve(true));
  });

/** Polls until `done` holds; the deadline only bounds a failing test, nothing is asserted about time. */
async function eventually(what: string, done: () => boolean | Promise<boolean>, deadlineMs = 30_000): Promise<void> {
  const end = Date.now() + deadlineMs;
  while (!(await done())) {
    if (Date.now() > end) throw new Error(`still not: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function fileWith(path: string, pattern: RegExp): Promise<RegExpExecArray> {
  let match: RegExpExecArray | null = null;
  await eventually(`${path} matching ${pattern}`, () => {
    if (!existsSync(path)) return false;
    match = pattern.exec(readFileSync(path, 'utf8'));
    return match !== null;
  });
  return match!;
}

/** The server is gone: its process ended and its port refuses. */
async function expectGone(pid: number, port: number): Promise<void> {
  leftovers.push(pid);
  await eventually(`server ${pid} gone`, () => !alive(pid));
  expect(await refused(port)).toBe(true);
}

describe('a server never outlives what started it', () => {
  it("the README's CI pattern: `npx loops-mock serve --exit-with-parent ... &` then `kill $!` stops the server, not just npx", async () => {
    // A consumer project with loops-mock installed (linked to this checkout), so npx runs its bin offline.
    const project = join(dir, 'consumer');
    mkdirSync(join(project, 'node_modules', '.bin'), { recursive: true });
    writeFileSync(
      join(project, 'package.json'),
      JSON.stringify({ name: 'consumer', version: '1.0.0', private: true, devDependencies: { 'loops-mock': `file:${REPO_ROOT}` } }),
    );
    symlinkSync(REPO_ROOT, join(project, 'node_modules', 'loops-mock'));
    symlinkSync('../loops-mock/bin/loops-mock.js', join(project, 'node_modules', '.bin', 'loops-mock'));
    const script = [
      'npx loops-mock serve --exit-with-parent --port 0 --warm none --log-level warn --write-env loops.env > loops-mock.log 2>&1 &',
      'for i in $(seq 1 600); do [ -s loops.env ] && break; sleep 0.1; done',
      'echo "npx=$!" > pids',
      'kill $!',
      'wait $!; echo "npx exit $?" >> pids',
    ].join('\n');
    const shell = spawn('sh', ['-c', script], { cwd: project, stdio: 'ignore' });
    started.push(shell);
    const [, base, port] = await fileWith(join(project, 'loops.env'), /LOOPS_BASE_URL=(http:\/\/127\.0\.0\.1:(\d+))\n/);
    await fileWith(join(project, 'pids'), /npx exit (\d+)/);
    // npx itself is gone (SIGTERM: 143); what matters is the server behind it.
    await eventually('the server stops answering', async () => refused(Number(port)));
    await expect(fetch(`${base}/healthz`)).rejects.toThrow();
    expect(readFileSync(join(project, 'loops-mock.log'), 'utf8')).toContain('the parent process is gone (--exit-with-parent): stopping');
  }, 120_000);

  it('a node parent killed with SIGKILL takes `loops-mock serve --exit-with-parent` with it', async () => {
    const info = join(dir, 'node-parent.txt');
    const parentCode = `
      const { spawn } = require('node:child_process');
      const child = spawn(${JSON.stringify(BIN)}, ['serve', '--exit-with-parent', '--port', '0', '--warm', 'none', '--log-level', 'silent'], { stdio: ['ignore', 'pipe', 'ignore'] });
      let out = '';
      child.stdout.on('data', (d) => { out += d; const m = /listening on http:\\/\\/127\\.0\\.0\\.1:(\\d+)/.exec(out); if (m) require('node:fs').writeFileSync(${JSON.stringify(info)}, 'pid=' + child.pid + ' port=' + m[1] + '\\n'); });
      setInterval(() => {}, 1000);`;
    const parent = spawn(process.execPath, ['-e', parentCode], { stdio: 'ignore' });
    started.push(parent);
    const [, pid, port] = await fileWith(info, /pid=(\d+) port=(\d+)\n/);
    expect(alive(Number(pid))).toBe(true);
    parent.kill('SIGKILL');
    await expectGone(Number(pid), Number(port));
  }, 60_000);

  it('startServer({ exitWithParent: true }) in a process whose parent is killed with SIGKILL closes, and that process ends', async () => {
    const info = join(dir, 'start-server.txt');
    const script = join(dir, 'start-server.mjs');
    writeFileSync(
      script,
      `
      import { writeFileSync } from 'node:fs';
      import { startServer } from ${JSON.stringify(join(REPO_ROOT, 'dist', 'server', 'index.js'))};
      const server = await startServer({ port: 0, warm: 'none', logLevel: 'silent', exitWithParent: true });
      writeFileSync(${JSON.stringify(info)}, 'pid=' + process.pid + ' port=' + new URL(server.url).port + '\\n');`,
    );
    const parentCode = `require('node:child_process').spawn(process.execPath, [${JSON.stringify(script)}], { stdio: 'ignore' }); setInterval(() => {}, 1000);`;
    const parent = spawn(process.execPath, ['-e', parentCode], { stdio: 'ignore' });
    started.push(parent);
    const [, pid, port] = await fileWith(info, /pid=(\d+) port=(\d+)\n/);
    expect(await refused(Number(port))).toBe(false);
    parent.kill('SIGKILL');
    // Nothing but the server held that process: closed, it ends by itself.
    await expectGone(Number(pid), Number(port));
  }, 60_000);

  for (const signal of ['SIGTERM', 'SIGKILL'] as const) {
    it(`a pytest run killed with ${signal} leaves no server of the plugin's behind`, async () => {
      if (!existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run 'bash scripts/python-venv.sh' (npm test runs it before the tests)`);
      const folder = join(dir, `pytest-${signal}`);
      mkdirSync(folder);
      const info = join(folder, 'server.txt');
      writeFileSync(
        join(folder, 'test_hold.py'),
        [
          'import time',
          '',
          'def test_hold(loops_mock):',
          `    with open(${JSON.stringify(info)}, "w") as f:`,
          '        f.write(f"pid={loops_mock.process.pid} port={loops_mock.port}\\n")',
          '    time.sleep(120)',
          '',
        ].join('\n'),
      );
      const pytest = spawn(PYTHON, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', '--loops-mock-args=--warm none', 'test_hold.py'], {
        cwd: folder,
        stdio: 'ignore',
        env: { PATH: process.env.PATH ?? '', HOME: folder, LOOPS_MOCK_BIN: BIN },
      });
      started.push(pytest);
      const [, pid, port] = await fileWith(info, /pid=(\d+) port=(\d+)\n/);
      expect(alive(Number(pid))).toBe(true);
      pytest.kill(signal);
      await expectGone(Number(pid), Number(port));
    }, 90_000);
  }
});
