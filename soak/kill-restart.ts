import { createHash } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { keepAliveClient, runOperation as op, startServerProcess, type KeepAliveClient, type ServerProcess } from '../bench/server-process.js';
import { Prng } from '../models/prng.js';
import { MODEL } from './fuzz.js';

/**
 * kill -9 while a run trains and saves, over and over on one --data-dir:
 * after each restart every checkpoint a client saw reported done must be
 * listed, with every file's bytes as they were, and no folder may lie on
 * disk that no record names. About half the kills land while a save_state
 * is in flight.
 */

export interface KillFigures {
  kills: number;
  killsDuringSave: number;
  acknowledged: number;
  lost: number;
  corrupt: number;
  /** Checkpoint folders on disk that no record names, after the last restart. */
  orphanFolders: number;
  /** Exit status of the last, graceful stop (SIGTERM): 0 expected. */
  finalExit: number | null;
  /** Requests that failed before the kill came. */
  errors: number;
  failures: string[];
}

interface Acknowledged {
  run: string;
  name: string;
  /** File name to SHA-256 of its bytes, once read after the save was reported done; null where a kill came first. */
  files: Map<string, string> | null;
}

async function filesOf(base: string, client: KeepAliveClient, id: string): Promise<Map<string, string>> {
  const listed = await client.send('GET', `/v1/loops/checkpoints/${id}/files`);
  if (listed.status !== 200) throw new Error(`files of ${id}: ${listed.status} ${JSON.stringify(listed.json)}`);
  const out = new Map<string, string>();
  for (const f of listed.json.presigned_urls) {
    const res = await fetch(f.url.replace(/^https?:\/\/[^/]+/, base));
    if (res.status !== 200) throw new Error(`${f.relative_file_name} of ${id}: ${res.status}`);
    const bytes = Buffer.from(await res.arrayBuffer());
    if (bytes.length !== f.size_bytes) throw new Error(`${f.relative_file_name} of ${id}: ${bytes.length} bytes, listed as ${f.size_bytes}`);
    out.set(f.relative_file_name, createHash('sha256').update(bytes).digest('hex'));
  }
  return out;
}

/** Every acknowledged checkpoint listed and intact: what the restarted server lost or corrupted (each counted once). */
async function verify(server: ServerProcess, acked: Acknowledged[], lost: Set<string>, corrupt: Set<string>, failures: string[]): Promise<void> {
  const client = keepAliveClient(server.base, 1);
  try {
    const listed = new Map<string, string>();
    for (const run of new Set(acked.map((a) => a.run))) {
      const res = await client.send('GET', `/v1/loops/checkpoints?run_id=${run}`);
      // checkpoint_id is the name given at save (the quickstart's listing); each save here has its own name.
      for (const c of res.json.checkpoints ?? []) listed.set(`${run}/${c.checkpoint_id}`, c.id);
    }
    for (const a of acked) {
      const key = `${a.run}/${a.name}`;
      const id = listed.get(key);
      if (!id) {
        if (!lost.has(key)) failures.push(`checkpoint ${key} was reported done and is not listed after a restart`);
        lost.add(key);
        continue;
      }
      let now: Map<string, string>;
      try {
        now = await filesOf(server.base, client, id);
      } catch (e) {
        if (!corrupt.has(key)) failures.push(`checkpoint ${key}: ${(e as Error).message}`);
        corrupt.add(key);
        continue;
      }
      if (a.files && [...a.files].some(([f, h]) => now.get(f) !== h)) {
        if (!corrupt.has(key)) failures.push(`checkpoint ${key}: files differ from those read when it was reported done`);
        corrupt.add(key);
      }
      a.files ??= now;
    }
  } finally {
    client.close();
  }
}

export async function runKillRestart(root: string, dataDir: string, kills: number, seed: string): Promise<KillFigures> {
  const figures: KillFigures = {
    kills: 0,
    killsDuringSave: 0,
    acknowledged: 0,
    lost: 0,
    corrupt: 0,
    orphanFolders: 0,
    finalExit: null,
    errors: 0,
    failures: [],
  };
  const acked: Acknowledged[] = [];
  const lost = new Set<string>();
  const corrupt = new Set<string>();
  const args = ['--data-dir', dataDir, '--log-level', 'silent'];
  let session: string | undefined;
  for (let life = 0; life <= kills; life++) {
    const server = await startServerProcess(root, args);
    await verify(server, acked, lost, corrupt, figures.failures);
    figures.lost = lost.size;
    figures.corrupt = corrupt.size;
    if (life === kills) {
      const client = keepAliveClient(server.base, 1);
      const all = await client.send('GET', `/v1/loops/checkpoints?base_model=${encodeURIComponent(MODEL)}`);
      client.close();
      const ids = new Set<string>((all.json.checkpoints ?? []).map((c: any) => c.id));
      const folder = join(dataDir, 'checkpoints');
      const onDisk = existsSync(folder) ? readdirSync(folder).filter((n) => !n.startsWith('.')) : [];
      figures.orphanFolders = onDisk.filter((n) => !ids.has(n)).length;
      server.stop();
      figures.finalExit = await server.exited;
      break;
    }
    const rng = new Prng(`${seed}:kill:${life}`);
    const duringSave = life % 2 === 1;
    const client = keepAliveClient(server.base, 4);
    let killed = false;
    const kill = () => {
      if (!killed) {
        killed = true;
        process.kill(server.pid, 'SIGKILL');
      }
    };
    const killAfterMs = 150 + Math.floor(rng.next() * 900);
    // Counted from the life's first acknowledged save, so that every life has one to check, however slow the machine.
    let timer: ReturnType<typeof setTimeout> | undefined;
    const work = async () => {
      session ??= (await client.send('POST', '/v1/loops/sessions')).json.session.id;
      const run = (await client.send('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 4, max_seq_len: 64 })).json.run;
      const trainer = `/trainer/${run.id}`;
      const datum = {
        model_input: { chunks: [{ type: 'encoded_text', tokens: [11, 12, 13, 14] }] },
        loss_fn_inputs: { target_tokens: { data: [12, 13, 14, 15], dtype: 'int64', shape: [4] } },
      };
      for (let step = 0; ; step++) {
        await op(client, trainer, 'forward_backward', { data: [datum], loss_fn: 'cross_entropy' });
        await op(client, trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
        const name = `life${life}-step${step}`;
        const kind = step % 3 === 2 ? 'save_weights_for_sampler' : 'save_state';
        const saving = op(client, trainer, kind, { name });
        // A kill while the save is queued or being written: it must then be either wholly there or not at all.
        if (duringSave && step === 1)
          setTimeout(
            () => {
              figures.killsDuringSave++;
              kill();
            },
            Math.floor(rng.next() * 25),
          );
        await saving;
        const a: Acknowledged = { run: run.id, name, files: null };
        acked.push(a);
        figures.acknowledged++;
        if (!duringSave && step === 0) timer = setTimeout(kill, killAfterMs);
        const listed = (await client.send('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).json.checkpoints;
        const c = listed.find((x: any) => x.checkpoint_id === name);
        if (!c) throw new Error(`${name} reported done but not listed`);
        a.files = await filesOf(server.base, client, c.id);
      }
    };
    // Fails once the kill lands (connection refused or reset): that is the point.
    await work().catch((e: Error) => {
      if (killed) return;
      figures.errors++;
      figures.failures.push(`life ${life}: ${e.message}`);
    });
    clearTimeout(timer);
    kill();
    client.close();
    await server.exited;
    figures.kills++;
  }
  return figures;
}
