import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from './helpers.js';

/**
 * loops-mock as a dependency of someone else's project, on a machine with no C/C++ toolchain: the packed
 * tarball, installed with the one command the README gives (onnxruntime-node's download of CUDA binaries
 * skipped by ONNXRUNTIME_NODE_INSTALL=skip, no npm setting), under a PATH that has every program of this
 * machine's PATH but the compilers and make, with the Node under test first. Only the npm registry is reached.
 *
 * What the install gives depends on the Node running this file (vitest.config.ts runs it on 20,
 * vitest.other-node.config.ts on 22 and 24 through scripts/test-on-node.sh):
 * - Node 22.13+ and 24: the store runs on node:sqlite; better-sqlite3 (optional) fails to build and is
 *   skipped; `loops-mock` serves and stops on SIGTERM.
 * - Node 20: the same install succeeds without better-sqlite3, and `loops-mock serve` refuses in one line.
 * The install with a compiler (better-sqlite3 built from source, ~80 s on 2 cores) is not run here: the
 * checkout's own `npm ci` builds the same better-sqlite3 with the same node-gyp, and every other test on
 * Node 20 runs the store on it.
 */
const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), 'package-install-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** What node-gyp needs to build an addon: make, and a C or C++ compiler (by any of its usual names). */
const TOOLCHAIN = /^(.*-)?(gcc|g\+\+|cc|c\+\+|c89-gcc|c99-gcc|clang|clang\+\+|cpp|ld|as|make|gmake)([-.].*)?$/;
const TOOLCHAIN_NAMES = [
  'gcc',
  'g++',
  'cc',
  'c++',
  'clang',
  'clang++',
  'cpp',
  'ld',
  'as',
  'make',
  'gmake',
  `${process.arch === 'x64' ? 'x86_64' : 'aarch64'}-linux-gnu-g++`,
];

/** A PATH of this machine's programs minus the toolchain (links in one folder), with the Node under test first. */
function pathWithoutCompiler(): string {
  const links = join(dir, 'bin-without-compiler');
  mkdirSync(links);
  for (const folder of (process.env.PATH ?? '').split(delimiter)) {
    if (!folder || !existsSync(folder)) continue;
    for (const name of readdirSync(folder)) {
      if (TOOLCHAIN.test(name) || existsSync(join(links, name))) continue;
      symlinkSync(join(folder, name), join(links, name));
    }
  }
  // Node's own folder may hold a compiler too (/usr/bin): a folder of just the Node under test goes first.
  const node = join(dir, 'node-under-test');
  mkdirSync(node);
  symlinkSync(process.execPath, join(node, 'node'));
  return [node, links].join(delimiter);
}

/** A consumer's environment: not the setting this checkout's .npmrc hands the npm that runs the tests. */
function consumerEnv(path: string): NodeJS.ProcessEnv {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !['npm_config_onnxruntime_node_install', 'path'].includes(k.toLowerCase())));
  return { ...env, PATH: path, ONNXRUNTIME_NODE_INSTALL: 'skip' };
}

/** Packs this checkout and installs the tarball into a fresh project with the README's command. */
async function installIntoFreshProject(env: NodeJS.ProcessEnv): Promise<{ project: string; installLog: string }> {
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
  const { stderr } = await run('npm', ['install', '--save-dev', tarball, '--no-audit', '--no-fund'], { cwd: project, env, maxBuffer: 64 * 1024 * 1024 });
  return { project, installLog: stderr };
}

function portRefused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = connect(port, '127.0.0.1');
    probe.once('connect', () => {
      probe.destroy();
      resolve(false);
    });
    probe.once('error', () => resolve(true));
  });
}

const hasNodeSqlite = (process as { getBuiltinModule?: (id: string) => unknown }).getBuiltinModule?.('node:sqlite') !== undefined;

describe(`installed as a dependency, no compiler on PATH, Node ${process.versions.node}`, () => {
  it(hasNodeSqlite
    ? 'installs into a fresh project with one command, serves on node:sqlite, and stops on SIGTERM with its port free'
    : 'installs into a fresh project with one command, and serve refuses in one line naming Node 22.13+ or a toolchain', async () => {
    const path = pathWithoutCompiler();
    const env = consumerEnv(path);
    // The premise: nothing to build an addon with is reachable (else the test would pass on a compiled addon).
    const probe = await run('sh', ['-c', `for t in ${TOOLCHAIN_NAMES.map((t) => `'${t}'`).join(' ')}; do command -v "$t"; done; true`], { env });
    expect(probe.stdout).toBe('');
    expect((await run('node', ['-p', 'process.versions.node'], { env })).stdout.trim()).toBe(process.versions.node);

    const { project, installLog } = await installIntoFreshProject(env);
    // Nothing npm 11 calls deprecated: no unknown setting in the package or its install.
    expect(installLog).not.toMatch(/Unknown (project|cli|user|env) config/);
    // better-sqlite3 is optional: its build failed (no toolchain) and npm left it out.
    expect(existsSync(join(project, 'node_modules', 'better-sqlite3'))).toBe(false);
    const bin = join(project, 'node_modules', '.bin', 'loops-mock');
    expect((await run(bin, ['--version'], { cwd: project, env })).stdout).toMatch(/^loops-mock \d+\.\d+\.\d+ /);

    const child = spawn(bin, ['serve', '--port', '0', '--log-level', 'warn'], { cwd: project, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));

    if (!hasNodeSqlite) {
      expect(await exited).toBe(2);
      // One line, no stack trace, naming both ways out.
      expect(stderr.trimEnd().split('\n')).toHaveLength(1);
      expect(stderr.startsWith('loops-mock: ')).toBe(true);
      expect(stderr).toContain(`needs SQLite: Node ${process.versions.node} has none built in`);
      expect(stderr).toMatch(/Node 22\.13 or later/);
      expect(stderr).toMatch(/better-sqlite3 .*C\/C\+\+ toolchain/);
      expect(stderr).not.toMatch(/\n\s+at /);
      return;
    }

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
    const health = (await (await fetch(`${base}/healthz`)).json()) as { status: string; storage: { writable: boolean } };
    expect([health.status, health.storage.writable]).toEqual(['ok', true]);
    // The dashboard's files ship in the package, beside dist/.
    const script = await fetch(`${base}/_mock/ui/live.js`);
    expect([script.status, (await script.text()).includes('/_mock/dashboard/overview')]).toEqual([200, true]);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(await portRefused(Number(new URL(base).port))).toBe(true);
  }, 900_000);
});
