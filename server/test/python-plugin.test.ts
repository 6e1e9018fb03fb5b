import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO_ROOT } from './helpers.js';

/**
 * Runs python/tests (pytest) of the Python package in python/ (the pytest
 * plugin: loops_mock and loops_env fixtures, the admin client) from the venv
 * that scripts/python-venv.sh makes (npm test makes it first; it installs the
 * package from ./python). The plugin starts the server binary itself: here
 * LOOPS_MOCK_BIN runs server/cli.ts from source through tsx, so no build is needed.
 */
const PYTHON = join(REPO_ROOT, '.venv', 'bin', 'python');
const TSX = pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
const quote = (arg: string) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`);
/** The loops-mock command line, split by the plugin with shlex: node --import tsx server/cli.ts. */
const LOOPS_MOCK_BIN = [process.execPath, '--import', TSX, join(REPO_ROOT, 'server', 'cli.ts')].map(quote).join(' ');

let dir: string;
let pytest: { code: number | null; output: string };

beforeAll(async () => {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run 'bash scripts/python-venv.sh' (npm test runs it before the tests)`);
  dir = mkdtempSync(join(tmpdir(), 'python-plugin-'));
  pytest = await new Promise((resolve) => {
    const child = spawn(PYTHON, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', join(REPO_ROOT, 'python', 'tests')], {
      cwd: dir,
      env: { PATH: process.env.PATH ?? '', HOME: dir, LOOPS_MOCK_BIN },
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => {
      output += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      output += d.toString();
    });
    child.on('close', (code) => resolve({ code, output }));
  });
}, 120_000);

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('the Python package (python/): pytest plugin and admin client', () => {
  it('passes its own tests in python/tests (pytest, against the real server binary)', () => {
    expect(pytest.code, pytest.output).toBe(0);
    expect(pytest.output).toMatch(/\d+ passed/);
    expect(pytest.output).not.toMatch(/skipped|xfail|error/i);
  });
});
