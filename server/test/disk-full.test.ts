import Database from 'better-sqlite3';
import { execFileSync } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import * as realFs from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ManualClock, type RunningServer } from '../index.js';
import { client, newRun, startTestServer, type Client } from './helpers.js';

/**
 * A full disk under --data-dir: every write that needs room is refused with
 * a clear error (507, or an operation error naming the disk), reads keep
 * answering, background writes are counted without failing anything, and
 * writes resume by themselves once there is room.
 *
 * The scenario runs on a real 20 MB tmpfs where this machine may mount one;
 * elsewhere on an injected disk: ENOSPC from the checkpoint files' writes and
 * SQLITE_FULL from the database's write statements once a byte budget is
 * spent. It says which it used. The other cases always use the injected disk.
 */

// ---- the injected disk ---------------------------------------------------------------

const injected = { on: false, capacity: 0, used: 0, sqliteFull: false };

function spend(bytes: number): boolean {
  if (!injected.on) return true;
  if (injected.used + bytes > injected.capacity) return false;
  injected.used += bytes;
  return true;
}

vi.mock('node:fs', async (importOriginal) => {
  const fs = await importOriginal<typeof import('node:fs')>();
  const writeSync = ((fd: number, data: Uint8Array | string, ...rest: unknown[]) => {
    const length = typeof data === 'string' ? Buffer.byteLength(data) : typeof rest[1] === 'number' ? rest[1] : data.byteLength;
    if (!spend(length)) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
    return (fs.writeSync as (...a: unknown[]) => number)(fd, data, ...rest);
  }) as typeof fs.writeSync;
  return { ...fs, writeSync, default: { ...fs, writeSync } };
});

const statementProto = Object.getPrototypeOf(new Database(':memory:').prepare('SELECT 1')) as { run: (...args: unknown[]) => unknown };
const realRun = statementProto.run;
statementProto.run = function (this: { reader: boolean; source: string }, ...args: unknown[]) {
  // Every write statement, COMMIT included (where a real full disk refuses a transaction); opening one or rolling back writes nothing.
  if (injected.on && !this.reader && !/^(BEGIN|SAVEPOINT|RELEASE|ROLLBACK)/.test(this.source)) {
    const bytes = 64 + args.reduce<number>((n, a) => n + (typeof a === 'string' ? Buffer.byteLength(a) : 8), 0);
    if (injected.sqliteFull || !spend(bytes)) throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
  }
  return realRun.apply(this, args);
};

/** A filesystem of 20 MB holding a filler file: fill() writes it, free() deletes it. */
interface SmallDisk {
  dir: string;
  how: string;
  fill(bytes: number): void;
  free(): void;
  close(): void;
}

function openSmallDisk(): SmallDisk {
  const dir = realFs.mkdtempSync(join(tmpdir(), 'loops-mock-disk-full-'));
  const filler = join(dir, 'filler.bin');
  let fillerBytes = 0;
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=20m', 'tmpfs', dir], { stdio: 'pipe' });
    return {
      dir,
      how: `a real 20 MB tmpfs mounted at ${dir}`,
      fill: (bytes) => realFs.writeFileSync(filler, Buffer.alloc(bytes, 1)),
      free: () => realFs.rmSync(filler),
      close: () => {
        execFileSync('umount', ['-l', dir], { stdio: 'pipe' });
        realFs.rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    Object.assign(injected, { on: true, capacity: 20 * 2 ** 20, used: 0, sqliteFull: false });
    return {
      dir,
      how: `an injected 20 MB disk (ENOSPC / SQLITE_FULL at the writes; mount refused: ${String((err as { stderr?: Buffer }).stderr ?? (err as Error).message).trim()})`,
      fill: (bytes) => {
        fillerBytes = bytes;
        injected.used += bytes;
      },
      free: () => {
        injected.used -= fillerBytes;
      },
      close: () => {
        injected.on = false;
        realFs.rmSync(dir, { recursive: true, force: true });
      },
    };
  }
}

/** The injected disk alone, with room to spare until a test spends it. */
function injectedDisk(): string {
  Object.assign(injected, { on: true, capacity: 2 ** 40, used: 0, sqliteFull: false });
  const dir = realFs.mkdtempSync(join(tmpdir(), 'loops-mock-disk-full-'));
  cleanups.push(() => {
    injected.on = false;
    realFs.rmSync(dir, { recursive: true, force: true });
  });
  return dir;
}

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  injected.on = false;
});

// ---- helpers ---------------------------------------------------------------------

async function operation(api: Client, runId: string, op: string, body: unknown): Promise<any> {
  const submitted = await api.post(`/trainer/${runId}/${op}`, body, { 'idempotency-key': randomUUID() });
  expect(submitted.status, JSON.stringify(submitted.body)).toBe(200);
  for (;;) {
    const polled = await api.get(`/trainer/${runId}/operations/${submitted.body.operation_id}`);
    if (polled.status === 408) continue;
    expect(polled.status, JSON.stringify(polled.body)).toBe(200);
    if (polled.body.status === 'done' || polled.body.status === 'error') return polled.body;
  }
}

/** SHA-256 of each file of a checkpoint, downloaded through its presigned URLs. */
async function filesOf(server: RunningServer, api: Client, id: string): Promise<Record<string, string>> {
  const listed = await api.get(`/v1/loops/checkpoints/${id}/files`);
  expect(listed.status).toBe(200);
  const out: Record<string, string> = {};
  for (const f of listed.body.presigned_urls) {
    const res = await server.app.inject({ method: 'GET', url: f.url.replace(/^https?:\/\/[^/]+/, '') });
    expect(res.statusCode, f.relative_file_name).toBe(200);
    out[f.relative_file_name] = createHash('sha256').update(res.rawPayload).digest('hex');
  }
  return out;
}

async function checkpointsOf(api: Client, runId: string): Promise<Map<string, string>> {
  const res = await api.get(`/v1/loops/checkpoints?run_id=${runId}`);
  expect(res.status).toBe(200);
  return new Map(res.body.checkpoints.map((c: any) => [c.checkpoint_id, c.id]));
}

const leftovers = (dataDir: string) => realFs.readdirSync(join(dataDir, 'checkpoints')).filter((n) => n.startsWith('.'));

// ---- the scenario ------------------------------------------------------------------

describe('a full disk under --data-dir', () => {
  it('refuses the save that does not fit with an error naming the disk, keeps answering reads, and saves again once there is room', async () => {
    const disk = openSmallDisk();
    cleanups.push(() => disk.close());
    console.log(`disk-full test: on ${disk.how}`);
    const dataDir = join(disk.dir, 'data');
    let server = await startTestServer({ dataDir });
    cleanups.push(() => server.close());
    let api = client(server);
    const run = await newRun(api, { lora_rank: 32, max_seq_len: 64 });
    // About a third of the disk is the filler to delete later: the saves fill the rest.
    disk.fill(7 * 2 ** 20);

    const acknowledged = new Map<string, Record<string, string>>();
    let refused: any;
    for (let i = 0; !refused; i++) {
      expect(i, 'saves never filled the disk').toBeLessThan(40);
      const name = `step-${i}`;
      const answer = await operation(api, run.id, 'save_state', { name });
      if (answer.status === 'error') refused = { name, ...answer.error };
      else acknowledged.set(name, await filesOf(server, api, (await checkpointsOf(api, run.id)).get(name)!));
    }
    expect(acknowledged.size).toBeGreaterThan(0);
    expect(refused.error_class).toBe('InsufficientStorage');
    expect(refused.message).toContain(`The data dir ${dataDir}`);
    expect(refused.message).toContain('out of space');
    expect(refused.message).toContain(`checkpoint '${refused.name}' was not saved`);
    // Nothing half-written is left to hold space: no scratch folder, no marker.
    expect(leftovers(dataDir)).toEqual([]);

    // Reads keep answering, and say that writes are refused.
    expect((await api.get('/v1/loops/runs')).status).toBe(200);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).status).toBe(200);
    expect((await api.get(`/v1/loops/deployments/${run.deployment_id}/logs`)).status).toBe(200);
    const health = await api.get('/healthz');
    expect(health.status).toBe(200);
    expect(health.body.storage.refused_writes).toBeGreaterThan(0);
    // Every checkpoint reported done is listed, byte for byte, and loads.
    const listed = await checkpointsOf(api, run.id);
    expect([...listed.keys()].sort()).toEqual([...acknowledged.keys()].sort());
    for (const [name, files] of acknowledged) {
      expect(await filesOf(server, api, listed.get(name)!), name).toEqual(files);
      expect((await operation(api, run.id, 'load_state', { path: `bt://loops:${run.id}/weights/${name}` })).status, name).toBe('done');
    }

    // Room again: the next save goes through without a restart.
    disk.free();
    const again = await operation(api, run.id, 'save_state', { name: 'after-room' });
    expect(again.status, JSON.stringify(again.error)).toBe('done');
    acknowledged.set('after-room', await filesOf(server, api, (await checkpointsOf(api, run.id)).get('after-room')!));
    expect((await api.post('/v1/loops/sessions')).status).toBe(200);
    expect((await api.get('/healthz')).body.storage.writable).toBe(true);
    await server.close();

    // The database is whole, and a restart brings every acknowledged checkpoint back as it was.
    const db = new Database(join(dataDir, 'loops-mock.sqlite'), { readonly: true });
    expect(db.pragma('integrity_check', { simple: true })).toBe('ok');
    db.close();
    server = await startTestServer({ dataDir });
    api = client(server);
    const after = await checkpointsOf(api, run.id);
    expect([...after.keys()].sort()).toEqual([...acknowledged.keys()].sort());
    for (const [name, files] of acknowledged) expect(await filesOf(server, api, after.get(name)!), name).toEqual(files);
  }, 300_000);
});

// ---- each write path, on the injected disk -------------------------------------------

describe('each write path on a full disk', () => {
  it('a control-plane write is a 507 naming the data dir and the fix; reads answer; the same write succeeds once there is room', async () => {
    const dataDir = injectedDisk();
    const server = await startTestServer({ dataDir });
    cleanups.push(() => server.close());
    const api = client(server);
    const run = await newRun(api);
    injected.sqliteFull = true;
    const refused = await api.post('/v1/loops/sessions');
    expect(refused.status).toBe(507);
    expect(refused.body.error).toMatchObject({ type: 'insufficient_storage', code: 'SQLITE_FULL', data_dir: dataDir, reason: 'disk_full' });
    expect(refused.body.error.message).toMatch(
      /^The data dir .* is out of space \(SQLITE_FULL\): the session record \S+ was not saved.*Free space on that filesystem/,
    );
    expect((await api.patch('/v1/loops/user_config', { trainer_accelerator_priority: ['H100'] })).status).toBe(507);
    expect((await api.get(`/v1/loops/runs/${run.id}`)).status).toBe(200);
    expect((await api.get('/v1/loops/user_config')).status).toBe(200);
    injected.sqliteFull = false;
    expect((await api.post('/v1/loops/sessions')).status).toBe(200);
    expect((await api.patch('/v1/loops/user_config', { trainer_accelerator_priority: ['H100'] })).status).toBe(200);
  });

  it("a request's log line that cannot be written fails nothing and crashes nothing: counted, told once, and told again when writes work", async () => {
    const dataDir = injectedDisk();
    const server = await startTestServer({ dataDir });
    cleanups.push(() => server.close());
    const notices: string[] = [];
    server.core.onStorageNotice((level, message) => notices.push(`${level}: ${message}`));
    const api = client(server);
    const run = await newRun(api);
    injected.sqliteFull = true;
    // Each answer goes out, then its log line is refused in the response's finish listener.
    for (let i = 0; i < 3; i++) expect((await api.get(`/trainer/${run.id}/operations/${randomUUID()}`)).status).toBe(404);
    const health = (await api.get('/healthz')).body.storage;
    expect(health.background_write_failures).toBe(3);
    expect(health.writable).toBe(false);
    expect(notices).toHaveLength(1);
    expect(notices[0]).toMatch(/^warn: A background write to the data dir .* could not be written \(The data dir .* is out of space \(SQLITE_FULL\)/);
    injected.sqliteFull = false;
    expect((await api.get(`/trainer/${run.id}/operations/${randomUUID()}`)).status).toBe(404);
    expect(notices[1]).toMatch(/^info: A background write .* is written again; 3 line\(s\) failed/);
    expect((await api.get('/healthz')).body.storage).toMatchObject({ writable: true, background_write_failures: 3 });
  });

  it('a timed status change the disk refuses (a cold start ending) is counted, not thrown out of the timer', async () => {
    const dataDir = injectedDisk();
    const clock = new ManualClock();
    const server = await startTestServer({ dataDir, clock, coldStartMs: 1000 });
    cleanups.push(() => server.close());
    const api = client(server);
    const run = await newRun(api);
    injected.sqliteFull = true;
    clock.advance(2000);
    expect(server.core.store.health.background_write_failures).toBeGreaterThan(0);
    injected.sqliteFull = false;
    expect((await api.get(`/v1/loops/runs/${run.id}`)).status).toBe(200);
  });

  it('a restart on a full disk starts and serves reads: stopping the runs left running is held in memory and counted', async () => {
    const dataDir = injectedDisk();
    const first = await startTestServer({ dataDir });
    const run = await newRun(client(first));
    await first.close();
    injected.sqliteFull = true;
    const second = await startTestServer({ dataDir });
    cleanups.push(() => second.close());
    expect(second.notes.join('\n')).toMatch(
      /the data dir refused writes at start \(.*SQLITE_FULL.*\); reads are served, writes answer 507 until there is room/,
    );
    const api = client(second);
    const got = await api.get(`/v1/loops/runs/${run.id}`);
    expect(got.status).toBe(200);
    expect(got.body.run.status.name).toBe('INACTIVE');
    expect((await api.get('/healthz')).body.storage.background_write_failures).toBeGreaterThan(0);
  });

  it('a journal line the disk refuses is cut back off the file (never half a line) and counted', async () => {
    const dir = injectedDisk();
    const journal = join(dir, 'journal.ndjson');
    const server = await startTestServer({ journal });
    cleanups.push(() => server.close());
    const api = client(server);
    expect((await api.get('/v1/loops/runs')).status).toBe(200);
    const whole = realFs.readFileSync(journal, 'utf8');
    // Room for a few bytes: the next line starts, then fails part way.
    injected.capacity = injected.used + 10;
    expect((await api.get('/v1/loops/runs')).status).toBe(200);
    expect(realFs.readFileSync(journal, 'utf8')).toBe(whole);
    expect((await api.get('/healthz')).body.storage.journal_file_failures).toBeGreaterThan(0);
    injected.capacity = 2 ** 40;
    expect((await api.get('/v1/loops/runs')).status).toBe(200);
    const lines = realFs.readFileSync(journal, 'utf8').trimEnd().split('\n');
    for (const line of lines) expect(() => JSON.parse(line)).not.toThrow();
  });

  it('a replacing save that does not fit leaves the version it was replacing whole, and no partial folder', async () => {
    const dataDir = injectedDisk();
    const server = await startTestServer({ dataDir });
    cleanups.push(() => server.close());
    const api = client(server);
    const run = await newRun(api, { lora_rank: 8, max_seq_len: 64 });
    expect((await operation(api, run.id, 'save_state', { name: 'a' })).status).toBe('done');
    const id = (await checkpointsOf(api, run.id)).get('a')!;
    const before = await filesOf(server, api, id);
    // Train a step so that the replacement differs, then leave room for only part of it.
    const datum = {
      model_input: { chunks: [{ type: 'encoded_text', tokens: [11, 12, 13, 14] }] },
      loss_fn_inputs: { target_tokens: { data: [12, 13, 14, 15], dtype: 'int64', shape: [4] } },
    };
    expect((await operation(api, run.id, 'forward_backward', { data: [datum], loss_fn: 'cross_entropy' })).status).toBe('done');
    expect((await operation(api, run.id, 'optim_step', { adam_params: { learning_rate: 1e-2 } })).status).toBe('done');
    injected.capacity = injected.used + 4096;
    const refused = await operation(api, run.id, 'save_state', { name: 'a' });
    expect(refused.error).toMatchObject({ error_class: 'InsufficientStorage' });
    expect(refused.error.message).toContain("the trainer checkpoint 'a' was not saved");
    expect(leftovers(dataDir)).toEqual([]);
    expect(await filesOf(server, api, id)).toEqual(before);
    // The record refused after the files went in: the same, the files come back out.
    injected.capacity = 2 ** 40;
    injected.sqliteFull = true;
    const recordRefused = await operation(api, run.id, 'save_state', { name: 'a' });
    expect(recordRefused.error).toMatchObject({ error_class: 'InsufficientStorage' });
    expect(recordRefused.error.message).toContain("the trainer checkpoint 'a' was not saved");
    expect(leftovers(dataDir)).toEqual([]);
    expect(await filesOf(server, api, id)).toEqual(before);
    injected.sqliteFull = false;
    expect((await operation(api, run.id, 'save_state', { name: 'a' })).status).toBe('done');
    expect(await filesOf(server, api, id)).not.toEqual(before);
  });
});
