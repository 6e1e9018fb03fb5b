import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { keepAliveClient, ok, startServerProcess, type KeepAliveClient } from '../bench/server-process.js';
import { MODEL } from './fuzz.js';
import { downloadFile, saveCheckpoints, SERVER_ARGS, type SavedCheckpoint, type SavedState } from './saved-checkpoints.js';

/**
 * Every file of a real trainer checkpoint and a real sampler checkpoint is
 * damaged in turn on a running server's disk (bytes flipped, cut short,
 * removed). Every use of the damaged checkpoint must then be a clear 4xx
 * naming the checkpoint and the file (409 checkpoint_damaged): downloading
 * the file, validating the path, load_state and load_state_with_optimizer,
 * a run or a sampler made from it. Never a 2xx, never a 5xx, never an
 * operation done on damaged weights. With the file put back, each works again.
 */

export interface CorruptCheckpointFigures {
  /** Damages done (checkpoint × file × way). */
  cases: number;
  /** Uses of a damaged checkpoint tried. */
  probes: number;
  /** Those answered 409 naming the checkpoint and the file. */
  refusedClearly: number;
  /** Those answered 2xx (served or loaded as if whole). */
  accepted: number;
  fiveXx: number;
  /** Those answered another 4xx, or a 409 that did not name the checkpoint and the file. */
  unclear: number;
  /** Uses that failed once the file was put back. */
  restoredFailed: number;
  failures: string[];
}

type Damage = (file: string) => void;
const DAMAGES: Record<string, Damage> = {
  // Up to 64 distinct bytes, spread over the file (a small file has all of its bytes flipped).
  'bytes flipped': (file) => {
    const b = readFileSync(file);
    const n = Math.min(64, b.length);
    for (let i = 0; i < n; i++) b[Math.floor((b.length * i) / n)]! ^= 0xa5;
    writeFileSync(file, b);
  },
  'cut short': (file) => {
    const b = readFileSync(file);
    writeFileSync(file, b.subarray(0, Math.floor(b.length / 2)));
  },
  removed: (file) => rmSync(file),
};

interface Probe {
  what: string;
  send: () => Promise<{ status: number; json: any }>;
}

/** The uses of one checkpoint, each a request whose answer is judged. */
function probesOf(base: string, client: KeepAliveClient, state: SavedState, trainer: string, c: SavedCheckpoint, file: string): Probe[] {
  const probes: Probe[] = [
    {
      what: `download ${file}`,
      send: async () => {
        const r = await downloadFile(base, client, c.id, file);
        return { status: r.status, json: r.json };
      },
    },
    { what: 'validate', send: () => client.send('POST', '/v1/loops/checkpoints/validate', { checkpoint_path: c.path }) },
    { what: 'load_state', send: () => client.send('POST', `${trainer}/load_state`, { path: c.path }, { 'idempotency-key': randomUUID() }) },
  ];
  if (c.target === 'trainer') {
    probes.push(
      {
        what: 'load_state_with_optimizer',
        send: () => client.send('POST', `${trainer}/load_state_with_optimizer`, { path: c.path }, { 'idempotency-key': randomUUID() }),
      },
      {
        what: 'a run from it',
        send: () => client.send('POST', '/v1/loops/runs', { session_id: state.sessionId, base_model: MODEL, lora_rank: 4, path: c.path }),
      },
    );
  } else {
    probes.push({
      what: 'a sampler of it',
      send: () => client.send('POST', '/v1/loops/samplers', { session_id: state.sessionId, base_model: MODEL, model_path: c.path }),
    });
  }
  return probes;
}

export async function runCorruptCheckpoint(root: string, options: { damages?: string[] } = {}): Promise<CorruptCheckpointFigures> {
  const f: CorruptCheckpointFigures = { cases: 0, probes: 0, refusedClearly: 0, accepted: 0, fiveXx: 0, unclear: 0, restoredFailed: 0, failures: [] };
  const dataDir = mkdtempSync(join(tmpdir(), 'loops-mock-soak-corrupt-ckpt-'));
  try {
    const state = await saveCheckpoints(root, dataDir);
    const server = await startServerProcess(root, ['--data-dir', dataDir, ...SERVER_ARGS]);
    const client = keepAliveClient(server.base, 2);
    try {
      // The probes' trainer: a fresh run of its own (the saving run came back INACTIVE after the restart).
      const run = (
        await ok(client, 'POST', '/v1/loops/runs', { session_id: (await ok(client, 'POST', '/v1/loops/sessions')).session.id, base_model: MODEL, lora_rank: 4 })
      ).run;
      const trainer = `/trainer/${run.id}`;
      for (const c of state.checkpoints) {
        for (const file of c.files.keys()) {
          for (const name of options.damages ?? Object.keys(DAMAGES)) {
            const damage = DAMAGES[name];
            if (!damage) throw new Error(`no damage '${name}' (the damages: ${Object.keys(DAMAGES).join(', ')})`);
            f.cases++;
            const onDisk = join(dataDir, 'checkpoints', c.id, file);
            const original = readFileSync(onDisk);
            damage(onDisk);
            for (const probe of probesOf(server.base, client, state, trainer, c, file)) {
              f.probes++;
              const res = await probe.send();
              const label = `${c.target} ${file} ${name}, ${probe.what}`;
              const error = res.json?.error;
              if (
                res.status === 409 &&
                error?.type_detail === 'checkpoint_damaged' &&
                error.checkpoint_id === c.id &&
                error.relative_file_name === file &&
                typeof error.message === 'string' &&
                error.message.includes(c.path) &&
                error.message.includes(`'${file}'`)
              )
                f.refusedClearly++;
              else if (res.status < 300) {
                f.accepted++;
                f.failures.push(`${label}: ${res.status}, used as if whole`);
              } else if (res.status >= 500) {
                f.fiveXx++;
                f.failures.push(`${label}: ${res.status} ${JSON.stringify(res.json).slice(0, 200)}`);
              } else {
                f.unclear++;
                f.failures.push(`${label}: ${res.status} ${JSON.stringify(res.json).slice(0, 200)}`);
              }
            }
            writeFileSync(onDisk, original);
            const download = await downloadFile(server.base, client, c.id, file);
            const valid = await client.send('POST', '/v1/loops/checkpoints/validate', { checkpoint_path: c.path });
            if (download.status !== 200 || !download.bytes.equals(original) || valid.status !== 200) {
              f.restoredFailed++;
              f.failures.push(`${c.target} ${file} ${name}: put back, download ${download.status} and validate ${valid.status}`);
            }
          }
        }
      }
    } finally {
      client.close();
      server.stop();
      await server.exited;
    }
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
  return f;
}

export function corruptCheckpointTargets(f: CorruptCheckpointFigures): { figure: string; value: string; target: string; met: boolean }[] {
  const zero = (figure: string, value: number) => ({ figure, value: String(value), target: '0', met: value === 0 });
  return [
    {
      figure: 'corrupt-checkpoint uses refused with a clear 409',
      value: `${f.refusedClearly} of ${f.probes} (${f.cases} damages)`,
      target: `${f.probes}`,
      met: f.probes > 0 && f.refusedClearly === f.probes,
    },
    zero('corrupt-checkpoint uses answered 2xx', f.accepted),
    zero('corrupt-checkpoint 5xx', f.fiveXx),
    zero('corrupt-checkpoint unclear answers', f.unclear),
    zero('corrupt-checkpoint uses failing once the file is back', f.restoredFailed),
  ];
}
