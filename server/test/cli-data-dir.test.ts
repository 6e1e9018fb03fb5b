import { openDatabase } from '../core/sqlite.js';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { client, fakeCheckpointFiles, newRun, REPO_ROOT, startTestServer } from './helpers.js';

/** The real command line on a data dir it cannot use: one line naming the file, the fault and the way out; exit 2; no stack trace. */

const CLI = join(REPO_ROOT, 'server', 'cli.ts');
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** Runs the CLI from source until it exits, or until it prints its variables (then it is stopped). */
function runCli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, '--port', '0', '--warm', 'none', ...args], {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => {
    stdout += d;
    if (stdout.includes(' listening on ')) child.kill('SIGTERM');
  });
  child.stderr.on('data', (d) => {
    stderr += d;
  });
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, stdout, stderr })));
}

async function dataDirWithCheckpoint(): Promise<{ dataDir: string; id: string }> {
  const dataDir = mkdtempSync(join(tmpdir(), 'loops-mock-cli-datadir-'));
  dirs.push(dataDir);
  const server = await startTestServer({ dataDir });
  const run = await newRun(client(server));
  const c = server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', 'a', fakeCheckpointFiles(), null);
  await server.close();
  return { dataDir, id: c.id };
}

function expectOneLine(result: { code: number | null; stderr: string }, ...parts: string[]): void {
  expect(result.code, result.stderr).toBe(2);
  const lines = result.stderr.trimEnd().split('\n');
  expect(lines, result.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^loops-mock: /);
  expect(lines[0]).not.toMatch(/\bat .*\(|SqliteError|SyntaxError/);
  for (const p of parts) expect(lines[0]).toContain(p);
}

describe('loops-mock on a data dir it cannot use', () => {
  it('a garbled database: one line naming it, what is wrong and both ways out; then --rebuild-records starts', async () => {
    const { dataDir, id } = await dataDirWithCheckpoint();
    for (const f of ['loops-mock.sqlite-wal', 'loops-mock.sqlite-shm']) rmSync(join(dataDir, f), { force: true });
    writeFileSync(join(dataDir, 'loops-mock.sqlite'), Buffer.alloc(4096, 0x41));
    expectOneLine(await runCli(['--data-dir', dataDir]), join(dataDir, 'loops-mock.sqlite'), 'file is not a database', '--rebuild-records', '--data-dir-fresh');
    const started = await runCli(['--data-dir', dataDir, '--rebuild-records']);
    expect(started.stdout).toContain(`# --rebuild-records: 1 checkpoint record rebuilt from ${join(dataDir, 'checkpoints')}: ${id}`);
    expect(existsSync(join(dataDir, 'checkpoints', id, 'adapter_model.safetensors'))).toBe(true);
  });

  it('a record that is not JSON: one line naming the database and the record', async () => {
    const { dataDir, id } = await dataDirWithCheckpoint();
    const db = openDatabase(join(dataDir, 'loops-mock.sqlite'));
    db.prepare("UPDATE records SET data = 'not json' WHERE kind = 'checkpoint' AND id = ?").run(id);
    db.close();
    expectOneLine(await runCli(['--data-dir', dataDir]), `${join(dataDir, 'loops-mock.sqlite')}: the checkpoint record ${id} is not JSON`, '--data-dir-fresh');
  });

  it('a deleted database beside checkpoints: one line naming both; --data-dir-fresh then starts and says where the old state went', async () => {
    const { dataDir, id } = await dataDirWithCheckpoint();
    for (const f of ['loops-mock.sqlite', 'loops-mock.sqlite-wal', 'loops-mock.sqlite-shm']) rmSync(join(dataDir, f), { force: true });
    expectOneLine(
      await runCli(['--data-dir', dataDir]),
      `${join(dataDir, 'loops-mock.sqlite')} is missing`,
      `${join(dataDir, 'checkpoints')} holds 1 checkpoint folder`,
    );
    expect(existsSync(join(dataDir, 'checkpoints', id))).toBe(true);
    const started = await runCli(['--data-dir', dataDir, '--data-dir-fresh']);
    expect(started.stdout).toMatch(new RegExp(`# --data-dir-fresh: the database and checkpoints that were in ${dataDir} are now in ${dataDir}/set-aside-`));
  });
});
