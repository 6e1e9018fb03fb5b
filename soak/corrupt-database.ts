import { openDatabase } from '../server/core/sqlite.js';
import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, keepAliveClient, ok, startServerProcess } from '../bench/server-process.js';
import { changedFiles, downloadedHashes, saveCheckpoints, SERVER_ARGS, treeHashes, type SavedState } from './saved-checkpoints.js';

/**
 * The database of a --data-dir holding real checkpoints is damaged each way a
 * disk or a person damages one (gone, 0 bytes, zero-filled, garbled header,
 * scrambled pages, no tables, a record that is not JSON). Each start on it
 * must be refused with exit 2 and one line naming the database and both ways
 * out, no checkpoint file removed or changed; then --rebuild-records must
 * bring every checkpoint back byte for byte, and --data-dir-fresh must start
 * empty with the old state set aside whole.
 */

export interface CorruptDatabaseFigures {
  /** Damages tried (each refused start, then both ways out on copies of it). */
  cases: number;
  /** Starts refused with exit 2 and one line naming the database, --rebuild-records and --data-dir-fresh. */
  refusedClearly: number;
  /** Starts on damaged state that served requests. */
  startedAnyway: number;
  /** Refusals that were not that one line (a stack trace, several lines, the file or a way out unnamed, another exit status). */
  unclear: number;
  /** Checkpoint files a refused start removed or changed. */
  filesChanged: number;
  /** Checkpoints not listed, or not byte for byte, after --rebuild-records. */
  rebuildLost: number;
  /** --data-dir-fresh starts that were not empty, or whose set-aside copy was not whole. */
  freshFailed: number;
  failures: string[];
}

const DATABASE = 'loops-mock.sqlite';

/** Each damage, done to a stopped server's data dir. */
const DAMAGES: Record<string, (dataDir: string, state: SavedState) => void> = {
  deleted: (d) => removeDatabase(d),
  'empty (0 bytes)': (d) => {
    removeDatabase(d);
    writeFileSync(join(d, DATABASE), '');
  },
  'zero-filled': (d) => {
    const size = statSync(join(d, DATABASE)).size;
    removeDatabase(d);
    writeFileSync(join(d, DATABASE), Buffer.alloc(size));
  },
  'garbled header': (d) => {
    const bytes = readFileSync(join(d, DATABASE));
    for (let i = 0; i < 100; i++) bytes[i] = (i * 131 + 7) & 0xff;
    removeDatabase(d);
    writeFileSync(join(d, DATABASE), bytes);
  },
  'scrambled pages': (d) => {
    const bytes = readFileSync(join(d, DATABASE));
    for (let i = 4096; i < bytes.length; i++) bytes[i] = (bytes[i]! * 7 + 13) & 0xff;
    removeDatabase(d);
    writeFileSync(join(d, DATABASE), bytes);
  },
  'table-less': (d) => {
    removeDatabase(d);
    const db = openDatabase(join(d, DATABASE));
    db.exec('CREATE TABLE unrelated (x); DROP TABLE unrelated;');
    db.close();
  },
  'a record that is not JSON': (d, s) => {
    const db = openDatabase(join(d, DATABASE));
    db.prepare("UPDATE records SET data = '{\"id\":' WHERE kind = 'run' AND id = ?").run(s.runId);
    db.close();
  },
};

function removeDatabase(dataDir: string): void {
  for (const suffix of ['', '-wal', '-shm']) rmSync(join(dataDir, `${DATABASE}${suffix}`), { force: true });
}

/** Starts the built command on `args` and waits until it exits (or serves: then it is stopped). */
async function attemptStart(root: string, args: string[]): Promise<{ code: number | null; stderr: string; served: boolean }> {
  const port = await freePort();
  const child = spawn(join(root, 'bin', 'loops-mock.js'), ['--port', String(port), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let stdout = '';
  let served = false;
  child.stderr.on('data', (d) => {
    stderr += d;
  });
  child.stdout.on('data', (d) => {
    stdout += d;
    if (!served && stdout.includes(' listening on ')) {
      served = true;
      child.kill('SIGTERM');
    }
  });
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  return { code, stderr, served };
}

export async function runCorruptDatabase(root: string, options: { damages?: string[] } = {}): Promise<CorruptDatabaseFigures> {
  const f: CorruptDatabaseFigures = {
    cases: 0,
    refusedClearly: 0,
    startedAnyway: 0,
    unclear: 0,
    filesChanged: 0,
    rebuildLost: 0,
    freshFailed: 0,
    failures: [],
  };
  const work = mkdtempSync(join(tmpdir(), 'loops-mock-soak-corrupt-db-'));
  try {
    const pristine = join(work, 'pristine');
    const state = await saveCheckpoints(root, pristine);
    const names = options.damages ?? Object.keys(DAMAGES);
    for (const [i, name] of names.entries()) {
      const damage = DAMAGES[name];
      if (!damage) throw new Error(`no damage '${name}' (the damages: ${Object.keys(DAMAGES).join(', ')})`);
      f.cases++;
      const dataDir = join(work, `case-${i}`);
      cpSync(pristine, dataDir, { recursive: true });
      damage(dataDir, state);
      const before = treeHashes(join(dataDir, 'checkpoints'));
      const refused = await attemptStart(root, ['--data-dir', dataDir, ...SERVER_ARGS]);
      const lines = refused.stderr.trimEnd().split('\n');
      if (refused.served) {
        f.startedAnyway++;
        f.failures.push(`${name}: the server started on it`);
      } else if (
        refused.code === 2 &&
        lines.length === 1 &&
        lines[0]!.startsWith('loops-mock: ') &&
        lines[0]!.includes(join(dataDir, DATABASE)) &&
        lines[0]!.includes('--rebuild-records') &&
        lines[0]!.includes('--data-dir-fresh') &&
        !/\n\s+at |SqliteError|SyntaxError/.test(refused.stderr)
      )
        f.refusedClearly++;
      else {
        f.unclear++;
        f.failures.push(`${name}: exit ${refused.code}, stderr ${JSON.stringify(refused.stderr.slice(0, 400))}`);
      }
      const lost = changedFiles(before, treeHashes(join(dataDir, 'checkpoints')));
      if (lost.length) {
        f.filesChanged += lost.length;
        f.failures.push(`${name}: the refused start removed or changed ${lost.join(', ')}`);
      }

      // The ways out, each on its own copy of the damaged dir.
      const rebuildDir = `${dataDir}-rebuild`;
      cpSync(dataDir, rebuildDir, { recursive: true });
      f.rebuildLost += await checkRebuild(root, rebuildDir, state, name, f.failures);
      if (!(await checkFresh(root, dataDir, before, name, f.failures))) f.freshFailed++;
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  return f;
}

/** Checkpoints not back byte for byte after --rebuild-records (all of them when it does not start). */
async function checkRebuild(root: string, dataDir: string, state: SavedState, name: string, failures: string[]): Promise<number> {
  let server: Awaited<ReturnType<typeof startServerProcess>>;
  try {
    server = await startServerProcess(root, ['--data-dir', dataDir, ...SERVER_ARGS, '--rebuild-records']);
  } catch (err) {
    failures.push(`${name}: --rebuild-records did not start: ${(err as Error).message}`);
    return state.checkpoints.length;
  }
  const client = keepAliveClient(server.base, 2);
  let lost = 0;
  try {
    const listed = new Set(((await ok(client, 'GET', `/v1/loops/checkpoints?run_id=${state.runId}`)).checkpoints as any[]).map((c) => c.id));
    for (const c of state.checkpoints) {
      const got = listed.has(c.id) ? await downloadedHashes(server.base, client, c.id) : new Map();
      const whole = [...c.files].every(([file, hash]) => got.get(file) === hash) && got.size === c.files.size;
      const valid = listed.has(c.id) && (await client.send('POST', '/v1/loops/checkpoints/validate', { checkpoint_path: c.path })).status === 200;
      if (!whole || !valid) {
        lost++;
        failures.push(`${name}: after --rebuild-records ${c.path} is ${listed.has(c.id) ? 'not whole' : 'not listed'}`);
      }
    }
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
  return lost;
}

/** Whether --data-dir-fresh started empty with the checkpoints set aside whole. */
async function checkFresh(root: string, dataDir: string, checkpointsBefore: Map<string, string>, name: string, failures: string[]): Promise<boolean> {
  let server: Awaited<ReturnType<typeof startServerProcess>>;
  try {
    server = await startServerProcess(root, ['--data-dir', dataDir, ...SERVER_ARGS, '--data-dir-fresh']);
  } catch (err) {
    failures.push(`${name}: --data-dir-fresh did not start: ${(err as Error).message}`);
    return false;
  }
  const client = keepAliveClient(server.base, 1);
  try {
    const runs = (await ok(client, 'GET', '/v1/loops/runs')).runs as unknown[];
    const aside = readdirSync(dataDir).filter((n) => n.startsWith('set-aside-'));
    const missing =
      aside.length === 1 ? changedFiles(checkpointsBefore, treeHashes(join(dataDir, aside[0]!, 'checkpoints'))) : ['(no single set-aside folder)'];
    if (runs.length || missing.length) {
      failures.push(`${name}: --data-dir-fresh ${runs.length ? `started with ${runs.length} runs` : `set aside without ${missing.join(', ')}`}`);
      return false;
    }
    return true;
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
}

export function corruptDatabaseTargets(f: CorruptDatabaseFigures): { figure: string; value: string; target: string; met: boolean }[] {
  const zero = (figure: string, value: number) => ({ figure, value: String(value), target: '0', met: value === 0 });
  return [
    {
      figure: 'corrupt-database starts refused with one clear line',
      value: `${f.refusedClearly} of ${f.cases}`,
      target: `${f.cases}`,
      met: f.cases > 0 && f.refusedClearly === f.cases,
    },
    zero('corrupt-database starts that served anyway', f.startedAnyway),
    zero('corrupt-database unclear refusals', f.unclear),
    zero('corrupt-database checkpoint files removed or changed', f.filesChanged),
    zero('corrupt-database checkpoints lost after --rebuild-records', f.rebuildLost),
    zero('corrupt-database --data-dir-fresh failures', f.freshFailed),
  ];
}
