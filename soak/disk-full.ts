import { openDatabase } from '../server/core/sqlite.js';
import { execFileSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { keepAliveClient, startServerProcess, type KeepAliveClient, type ServerProcess } from '../bench/server-process.js';
import { MODEL } from './fuzz.js';

/**
 * A rank-32 run saving in a loop on a 20 MB disk until it is full, with a
 * journal file beside: every refused save must be an error naming the disk,
 * every other answer a 2xx or a 507 (never another 5xx, never a reset), the
 * server must stay up and answer reads, a save must go through again once a
 * filler file is deleted (no restart), and after a restart the database must
 * pass integrity_check with every acknowledged checkpoint as it was.
 *
 * On a real tmpfs where this machine may mount one; elsewhere the server
 * runs with soak/full-disk-preload.mjs, whose writes fill a disk of the same
 * size (`how` says which).
 */

export interface DiskFullFigures {
  how: string;
  acknowledged: number;
  /** Saves refused with InsufficientStorage naming the data dir; each full spell ends in one. */
  refusedSaves: number;
  /** Times the disk filled and then had room again. */
  spells: number;
  /** The server process ending while it should have served. */
  serverExits: number;
  /** 5xx answers other than 507 insufficient_storage, and connections reset. */
  fiveXx: number;
  /** Requests answered 507 insufficient_storage (control-plane writes while full). */
  answered507: number;
  /** 507s whose body lacks the shape or does not name the data dir. */
  unclear507: number;
  /** Reads (GET) that did not answer 200 while the disk was full. */
  readsFailed: number;
  /** Acknowledged checkpoints missing or changed after the restart. */
  lost: number;
  /** Every spell ended with a save that went through once there was room, without a restart. */
  recovered: boolean;
  integrity: string;
  finalExit: number | null;
  failures: string[];
}

interface SmallDisk {
  dir: string;
  how: string;
  /** Server arguments and environment this disk needs. */
  env: Record<string, string>;
  close(): void;
}

const DISK_BYTES = 20 * 2 ** 20;
const FILLER_BYTES = 7 * 2 ** 20;

function smallDisk(): SmallDisk {
  const dir = mkdtempSync(join(tmpdir(), 'loops-mock-soak-disk-'));
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${DISK_BYTES}`, 'tmpfs', dir], { stdio: 'pipe' });
    return {
      dir,
      how: 'tmpfs',
      env: {},
      close: () => {
        execFileSync('umount', ['-l', dir], { stdio: 'pipe' });
        rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch {
    const preload = new URL('./full-disk-preload.mjs', import.meta.url).pathname;
    return {
      dir,
      how: 'injected (mount refused: soak/full-disk-preload.mjs fills a 20 MB budget)',
      env: {
        NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${preload}`.trim(),
        LOOPS_MOCK_SOAK_DISK_BYTES: String(DISK_BYTES),
        LOOPS_MOCK_SOAK_DISK_FILLER: join(dir, 'filler.bin'),
      },
      close: () => rmSync(dir, { recursive: true, force: true }),
    };
  }
}

/** A filler file of FILLER_BYTES, or as much of it as fits (a later spell finds the disk fuller). */
function fill(file: string): void {
  writeFileSync(file, '');
  const chunk = Buffer.alloc(2 ** 20, 1);
  try {
    for (let at = 0; at < FILLER_BYTES; at += chunk.length) appendFileSync(file, chunk);
  } catch (e) {
    if ((e as { code?: string }).code !== 'ENOSPC') throw e;
  }
}

/** Starts the server with extra environment (the injected disk's preload). */
async function start(root: string, args: string[], env: Record<string, string>): Promise<ServerProcess> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  try {
    return await startServerProcess(root, args);
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

export async function runDiskFull(root: string, options: { spells?: number } = {}): Promise<DiskFullFigures> {
  const spells = options.spells ?? 2;
  const disk = smallDisk();
  const f: DiskFullFigures = {
    how: disk.how,
    acknowledged: 0,
    refusedSaves: 0,
    spells: 0,
    serverExits: 0,
    fiveXx: 0,
    answered507: 0,
    unclear507: 0,
    readsFailed: 0,
    lost: 0,
    recovered: false,
    integrity: 'not checked',
    finalExit: null,
    failures: [],
  };
  const dataDir = join(disk.dir, 'data');
  const filler = join(disk.dir, 'filler.bin');
  const args = ['--data-dir', dataDir, '--journal', join(disk.dir, 'journal.ndjson'), '--log-level', 'silent'];
  const acked = new Map<string, Map<string, string>>();
  let server: ServerProcess | undefined;
  let client: KeepAliveClient | undefined;
  let alive = true;
  try {
    server = await start(root, args, disk.env);
    void server.exited.then(() => {
      if (alive) f.serverExits++;
    });
    client = keepAliveClient(server.base, 2);
    const c = client;
    /** One request, judged: a 5xx other than a well-formed 507, or a reset, counts. */
    const send = async (method: string, path: string, body?: unknown, headers?: Record<string, string>) => {
      let res: { status: number; json: any };
      try {
        res = await c.send(method, path, body, headers);
      } catch (e) {
        f.fiveXx++;
        f.failures.push(`${method} ${path}: ${(e as Error).message}`);
        return { status: 0, json: null };
      }
      if (res.status === 507) {
        f.answered507++;
        const e = res.json?.error;
        if (e?.type !== 'insufficient_storage' || e?.data_dir !== dataDir || !String(e?.message).includes(dataDir)) {
          f.unclear507++;
          f.failures.push(`${method} ${path}: 507 ${JSON.stringify(res.json).slice(0, 200)}`);
        }
      } else if (res.status >= 500) {
        f.fiveXx++;
        f.failures.push(`${method} ${path}: ${res.status} ${JSON.stringify(res.json).slice(0, 200)}`);
      }
      return res;
    };
    const operation = async (trainer: string, op: string, body: unknown) => {
      const submitted = await send('POST', `${trainer}/${op}`, body, { 'idempotency-key': randomUUID() });
      if (submitted.status !== 200) throw new Error(`${op}: ${submitted.status} ${JSON.stringify(submitted.json).slice(0, 200)}`);
      for (;;) {
        const polled = await send('GET', `${trainer}/operations/${submitted.json.operation_id}`);
        if (polled.status === 408) continue;
        if (polled.status !== 200) throw new Error(`${op} poll: ${polled.status}`);
        if (polled.json.status === 'done' || polled.json.status === 'error') return polled.json;
      }
    };
    const session = (await send('POST', '/v1/loops/sessions')).json.session.id;
    const run = (await send('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 32, max_seq_len: 64 })).json.run;
    const trainer = `/trainer/${run.id}`;
    const reads = [
      `/v1/loops/runs/${run.id}`,
      `/v1/loops/checkpoints?run_id=${run.id}`,
      `/v1/loops/deployments/${run.deployment_id}/logs`,
      '/v1/loops/runs',
      '/healthz',
    ];
    let recoveredEvery = true;
    for (let spell = 0, step = 0; spell < spells; spell++) {
      fill(filler);
      // Save until the disk refuses one.
      for (let tries = 0; ; tries++, step++) {
        if (tries > 40) throw new Error(`spell ${spell}: 40 saves and the disk never filled`);
        const name = `spell${spell}-step${step}`;
        const answer = await operation(trainer, 'save_state', { name });
        if (answer.status === 'done') {
          acked.set(name, await filesOf(server.base, c, run.id, name));
          f.acknowledged++;
          continue;
        }
        if (answer.error?.error_class === 'InsufficientStorage' && String(answer.error.message).includes(dataDir)) f.refusedSaves++;
        else f.failures.push(`spell ${spell}: ${name} failed otherwise: ${JSON.stringify(answer.error)}`);
        break;
      }
      // Full: reads answer, a control-plane write is refused cleanly (or fits), nothing crashes.
      for (let i = 0; i < 3; i++) {
        for (const path of reads) if ((await send('GET', path)).status !== 200) f.readsFailed++;
        await send('POST', '/v1/loops/sessions');
      }
      // Room again: the next save goes through, with no restart.
      rmSync(filler);
      const name = `spell${spell}-after`;
      const again = await operation(trainer, 'save_state', { name });
      if (again.status === 'done') {
        acked.set(name, await filesOf(server.base, c, run.id, name));
        f.acknowledged++;
      } else {
        recoveredEvery = false;
        f.failures.push(`spell ${spell}: the save after freeing space failed: ${JSON.stringify(again.error)}`);
      }
      f.spells++;
      step++;
    }
    f.recovered = recoveredEvery && f.spells === spells;
    alive = false;
    client.close();
    server.stop();
    f.finalExit = await server.exited;
    const db = openDatabase(join(dataDir, 'loops-mock.sqlite'), { readonly: true });
    f.integrity = String((db.prepare('PRAGMA integrity_check').get() as { integrity_check: string }).integrity_check);
    db.close();

    // A restart brings every acknowledged checkpoint back, byte for byte.
    alive = true;
    server = await start(root, args, disk.env);
    void server.exited.then(() => {
      if (alive) f.serverExits++;
    });
    client = keepAliveClient(server.base, 2);
    for (const [name, files] of acked) {
      let now: Map<string, string> | undefined;
      try {
        now = await filesOf(server.base, client, run.id, name);
      } catch (e) {
        f.failures.push(`after the restart: ${(e as Error).message}`);
      }
      if (!now || [...files].some(([file, hash]) => now.get(file) !== hash)) f.lost++;
    }
    alive = false;
    client.close();
    server.stop();
    await server.exited;
  } catch (e) {
    f.failures.push((e as Error).message);
  } finally {
    alive = false;
    client?.close();
    server?.stop();
    await server?.exited;
    disk.close();
  }
  return f;
}

/** SHA-256 of each file of a run's checkpoint, downloaded through its presigned URLs. */
async function filesOf(base: string, client: KeepAliveClient, runId: string, name: string): Promise<Map<string, string>> {
  const listed = await client.send('GET', `/v1/loops/checkpoints?run_id=${runId}`);
  const c = (listed.json?.checkpoints ?? []).find((x: any) => x.checkpoint_id === name);
  if (!c) throw new Error(`checkpoint ${name} is not listed`);
  const files = await client.send('GET', `/v1/loops/checkpoints/${c.id}/files`);
  const out = new Map<string, string>();
  for (const file of files.json.presigned_urls) {
    const res = await fetch(file.url.replace(/^https?:\/\/[^/]+/, base));
    if (res.status !== 200) throw new Error(`${name}/${file.relative_file_name}: ${res.status}`);
    out.set(
      file.relative_file_name,
      createHash('sha256')
        .update(Buffer.from(await res.arrayBuffer()))
        .digest('hex'),
    );
  }
  return out;
}

export function diskFullTargets(f: DiskFullFigures): { figure: string; value: string; target: string; met: boolean }[] {
  const zero = (figure: string, value: number) => ({ figure, value: String(value), target: '0', met: value === 0 });
  return [
    { figure: `disk-full spells (${f.how})`, value: String(f.spells), target: '> 0', met: f.spells > 0 },
    {
      figure: 'disk-full saves refused naming the disk',
      value: String(f.refusedSaves),
      target: `${f.spells}`,
      met: f.refusedSaves === f.spells && f.spells > 0,
    },
    zero('disk-full server exits', f.serverExits),
    zero('disk-full 5xx other than 507, or resets', f.fiveXx),
    zero('disk-full unclear 507 answers', f.unclear507),
    zero('disk-full reads failing', f.readsFailed),
    zero('disk-full acknowledged checkpoints lost', f.lost),
    { figure: 'disk-full recovered without restart', value: f.recovered ? 'yes' : 'no', target: 'yes', met: f.recovered },
    { figure: 'disk-full database integrity_check', value: f.integrity, target: 'ok', met: f.integrity === 'ok' },
    { figure: 'disk-full graceful stop exit status', value: String(f.finalExit), target: '0', met: f.finalExit === 0 },
  ];
}
