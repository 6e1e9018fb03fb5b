import { execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from './helpers.js';

/**
 * loops-mock as a dependency of someone else's project: the packed tarball,
 * installed with the one command the README gives (onnxruntime-node's
 * download of CUDA binaries skipped by ONNXRUNTIME_NODE_INSTALL=skip, no npm setting), its `loops-mock` binary serving and
 * stopping on SIGTERM. Only the npm registry is reached, as on this machine.
 */
const run = promisify(execFile);
const withoutKey = (env: NodeJS.ProcessEnv, key: string) => Object.fromEntries(Object.entries(env).filter(([k]) => k.toLowerCase() !== key));
const dir = mkdtempSync(join(tmpdir(), 'package-install-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('installed as a dependency', () => {
  it('packs, installs into a fresh project with one command, serves, and stops on SIGTERM with its port free', async () => {
    // --ignore-scripts: dist/ is already built (npm test builds it first), and rebuilding it here would pull files from under the other tests.
    const { stdout: packed } = await run('npm', ['pack', '--ignore-scripts', '--pack-destination', dir, '--silent'], {
      cwd: REPO_ROOT,
      maxBuffer: 16 * 1024 * 1024,
    });
    const tarball = join(dir, packed.trim().split('\n').pop()!);
    const project = join(dir, 'consumer');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'consumer', version: '1.0.0', private: true }));
    // The README's command, word for word but for the tarball's path.
    const { stderr: installLog } = await run('npm', ['install', '--save-dev', tarball, '--no-audit', '--no-fund'], {
      cwd: project,
      maxBuffer: 64 * 1024 * 1024,
      // A consumer's environment: not the setting this checkout's .npmrc hands the npm that runs the tests.
      env: { ...withoutKey(process.env, 'npm_config_onnxruntime_node_install'), ONNXRUNTIME_NODE_INSTALL: 'skip' },
    });
    // Nothing npm 11 calls deprecated: no unknown setting in the package or its install.
    expect(installLog).not.toMatch(/Unknown (project|cli|user|env) config/);

    const child = spawn(join(project, 'node_modules', '.bin', 'loops-mock'), ['serve', '--port', '0', '--log-level', 'warn'], {
      cwd: project,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
    const base = await new Promise<string>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => {
        stdout += d.toString();
        const m = /listening on (http:\/\/[^,\s]+)/.exec(stdout);
        if (m) resolve(m[1]!);
      });
      void exited.then((code) => reject(new Error(`exited ${code}: ${stderr}`)));
    });
    const res = await fetch(`${base}/v1/loops/capabilities`, { headers: { authorization: 'Bearer consumer' } });
    expect(res.status).toBe(200);
    expect(((await (await fetch(`${base}/healthz`)).json()) as { status: string }).status).toBe('ok');
    // The dashboard's files ship in the package, beside dist/.
    const script = await fetch(`${base}/_mock/ui/live.js`);
    expect([script.status, (await script.text()).includes('/_mock/dashboard/overview')]).toEqual([200, true]);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    const port = Number(new URL(base).port);
    const refused = await new Promise<boolean>((resolve) => {
      const probe = connect(port, '127.0.0.1');
      probe.once('connect', () => {
        probe.destroy();
        resolve(false);
      });
      probe.once('error', () => resolve(true));
    });
    expect(refused).toBe(true);
  }, 900_000);
});
