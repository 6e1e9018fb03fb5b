import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BENCH_KEY, startServerProcess } from '../bench/server-process.js';
import { runFuzz, type FuzzFigures } from './fuzz.js';
import { runKillRestart, type KillFigures } from './kill-restart.js';
import { runLoadWaves, type LoadFigures } from './load-waves.js';
import { runMalformedHttp, type RawFigures } from './malformed-http.js';
import { corruptCheckpointTargets, runCorruptCheckpoint, type CorruptCheckpointFigures } from './corrupt-checkpoint.js';
import { corruptDatabaseTargets, runCorruptDatabase, type CorruptDatabaseFigures } from './corrupt-database.js';
import { diskFullTargets, runDiskFull, type DiskFullFigures } from './disk-full.js';
import { proxyStressTargets, runProxyStress, type ProxyStressFigures } from './proxy-stress.js';
import { REQUEST_MEMORY_DEFAULTS, requestMemoryTargets, runRequestMemory, type RequestMemoryFigures } from './request-memory.js';

/**
 * The reliability suite: fuzz, malformed HTTP, kill -9 restarts, load waves, and the cases of a damaged
 * machine (a full disk, a corrupt database or checkpoint, a proxy flooded with new names and aborted
 * handshakes, each request's memory at its limit); each against real server processes.
 */

export interface SoakOptions {
  root: string;
  seed: string;
  cases: number;
  rawCases: number;
  kills: number;
  waves: number[];
  /**
   * The damaged-machine cases too. npm test runs each of them at a reduced size in a test file of its
   * own (soak/test/), so its reduced soak leaves them out.
   */
  machineCases: boolean;
  /** Proxy stress: concurrent new names per round, and CONNECTs closed at once. */
  proxyNames: number;
  proxyAborted: number;
}

/** The damaged-machine cases' figures; absent where machineCases was off. */
export interface MachineFigures {
  diskFull: DiskFullFigures;
  corruptDatabase: CorruptDatabaseFigures;
  corruptCheckpoint: CorruptCheckpointFigures;
  proxy: ProxyStressFigures;
  requestMemory: RequestMemoryFigures;
}

export interface SoakReport {
  options: Omit<SoakOptions, 'root'>;
  fuzz: FuzzFigures;
  raw: RawFigures;
  kills: KillFigures;
  load: LoadFigures;
  machine: MachineFigures | null;
  seconds: number;
}

/** Short timeouts, so that a request the server leaves waiting shows as a 408 well within the 30 s hang bound. */
const SERVER_FLAGS = ['--long-poll-ms', '2000', '--floor-wait-ms', '500', '--headers-timeout-ms', '2000', '--body-timeout-ms', '5000', '--log-level', 'silent'];
export async function runSoak(options: SoakOptions): Promise<SoakReport> {
  const started = performance.now();
  // The main server accepts the key startServerProcess polls with.
  const main = await startServerProcess(options.root, [...SERVER_FLAGS, '--api-key', `${BENCH_KEY}:soak-org`, '--api-key', 'soak-other:other-org']);
  const admin = await startServerProcess(options.root, [...SERVER_FLAGS, '--admin', '--admin-token', 'soak-admin']);
  let fuzz: FuzzFigures;
  let raw: RawFigures;
  try {
    const openapi = await (await fetch(`${admin.base}/openapi.json`)).json();
    fuzz = await runFuzz(openapi, {
      cases: options.cases,
      seed: options.seed,
      main: { base: main.base, auth: { authorization: `Bearer ${BENCH_KEY}` }, other: { authorization: 'Bearer soak-other' } },
      // The admin API refuses a change without X-Loops-Mock-Admin (CSRF): the fuzz's valid admin cases carry it.
      admin: {
        base: admin.base,
        auth: { authorization: 'Bearer soak-admin', 'x-loops-mock-admin': '1' },
        other: { authorization: 'Bearer not-the-admin-token' },
      },
    });
    raw = await runMalformedHttp(Number(new URL(main.base).port), BENCH_KEY, options.rawCases, options.seed);
  } finally {
    main.stop();
    admin.stop();
    await Promise.all([main.exited, admin.exited]);
  }
  const killDir = mkdtempSync(join(tmpdir(), 'loops-mock-soak-kills-'));
  const waveDir = mkdtempSync(join(tmpdir(), 'loops-mock-soak-waves-'));
  try {
    const kills = await runKillRestart(options.root, killDir, options.kills, options.seed);
    const load = await runLoadWaves(options.root, options.waves, waveDir);
    const machine = options.machineCases ? await runMachineCases(options) : null;
    const { root: _root, ...rest } = options;
    return { options: rest, fuzz, raw, kills, load, machine, seconds: (performance.now() - started) / 1000 };
  } finally {
    rmSync(killDir, { recursive: true, force: true });
    rmSync(waveDir, { recursive: true, force: true });
  }
}

async function runMachineCases(options: SoakOptions): Promise<MachineFigures> {
  // One after another: each measures its own server, and the 2-core machine would blur them.
  const diskFull = await runDiskFull(options.root);
  const corruptDatabase = await runCorruptDatabase(options.root);
  const corruptCheckpoint = await runCorruptCheckpoint(options.root);
  const proxy = await runProxyStress(options.root, { names: options.proxyNames, aborted: options.proxyAborted, fdLimit: 1024 });
  // Each request at its limit and one over, against the defaults: peak memory beside the 2 GB ceiling.
  const requestMemory = await runRequestMemory(options.root, { limits: REQUEST_MEMORY_DEFAULTS });
  return { diskFull, corruptDatabase, corruptCheckpoint, proxy, requestMemory };
}

/** Every failure a case recorded, for the report. */
export function failuresOf(r: SoakReport): string[] {
  const m = r.machine;
  const machine = m
    ? [...m.diskFull.failures, ...m.corruptDatabase.failures, ...m.corruptCheckpoint.failures, ...m.proxy.failures, ...m.requestMemory.failures]
    : [];
  return [...r.fuzz.failures, ...r.raw.failures, ...r.kills.failures, ...r.load.failures, ...machine];
}

/** Each figure the issue sets a target for, its value, and whether it meets it. */
export function targetsOf(r: SoakReport): { figure: string; value: string; target: string; met: boolean }[] {
  const zero = (figure: string, value: number) => ({ figure, value: String(value), target: '0', met: value === 0 });
  const rows = [
    { figure: 'fuzz cases', value: String(r.fuzz.cases), target: `>= ${r.options.cases}`, met: r.fuzz.cases >= r.options.cases },
    zero('fuzz 5xx', r.fuzz.fiveXx),
    zero('fuzz wrongly shaped errors', r.fuzz.wrongShape),
    zero('fuzz hangs over 30 s', r.fuzz.hangs),
    zero('fuzz dropped connections', r.fuzz.transport),
    zero('fuzz invalid input accepted', r.fuzz.invalidAccepted),
    zero('malformed HTTP 5xx', r.raw.fiveXx),
    zero('malformed HTTP wrongly shaped errors', r.raw.wrongShape),
    zero('malformed HTTP hangs over 30 s', r.raw.hangs),
    {
      figure: 'kills',
      value: `${r.kills.kills} (${r.kills.killsDuringSave} during saves)`,
      target: `${r.options.kills}`,
      met: r.kills.kills === r.options.kills,
    },
    { figure: 'checkpoints acknowledged', value: String(r.kills.acknowledged), target: '> 0', met: r.kills.acknowledged > 0 },
    zero('checkpoints lost', r.kills.lost),
    zero('checkpoints corrupt', r.kills.corrupt),
    zero('checkpoint folders without a record', r.kills.orphanFolders),
    zero('requests failing before a kill', r.kills.errors),
    { figure: 'graceful stop exit status', value: String(r.kills.finalExit), target: '0', met: r.kills.finalExit === 0 },
    zero(
      'load client errors',
      r.load.waves.reduce((n, w) => n + w.errors, 0),
    ),
  ];
  if (r.load.waves.length > 1)
    rows.push({ figure: 'RSS after the last wave / after the first', value: r.load.rssGrowth.toFixed(2), target: '<= 1.10', met: r.load.rssGrowth <= 1.1 });
  if (r.machine) {
    const m = r.machine;
    rows.push(
      ...diskFullTargets(m.diskFull),
      ...corruptDatabaseTargets(m.corruptDatabase),
      ...corruptCheckpointTargets(m.corruptCheckpoint),
      ...proxyStressTargets(m.proxy),
      ...requestMemoryTargets(m.requestMemory),
    );
  }
  return rows;
}
