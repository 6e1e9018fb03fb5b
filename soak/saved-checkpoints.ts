import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { keepAliveClient, ok, runOperation, startServerProcess, type KeepAliveClient } from '../bench/server-process.js';
import { MODEL } from './fuzz.js';

/** What the corrupt-database and corrupt-checkpoint cases start from: checkpoints a real trainer saved, as their files downloaded. */

export interface SavedCheckpoint {
  id: string;
  path: string;
  target: 'trainer' | 'sampler';
  /** SHA-256 of each file as downloaded once the save was done. */
  files: Map<string, string>;
}

export interface SavedState {
  runId: string;
  sessionId: string;
  checkpoints: SavedCheckpoint[];
}

export const SERVER_ARGS = ['--log-level', 'silent', '--warm', 'none'];

const sha256 = (data: Uint8Array) => createHash('sha256').update(data).digest('hex');

/** The bytes of one checkpoint file through its presigned URL: the status, and the body (JSON when it is an error). */
export async function downloadFile(base: string, client: KeepAliveClient, id: string, name: string): Promise<{ status: number; bytes: Buffer; json: any }> {
  const listed = await ok(client, 'GET', `/v1/loops/checkpoints/${id}/files`);
  const url = listed.presigned_urls.find((f: any) => f.relative_file_name === name)?.url as string | undefined;
  if (!url) throw new Error(`checkpoint ${id} lists no file ${name}`);
  const res = await fetch(`${base}${url.replace(/^https?:\/\/[^/]+/, '')}`);
  const bytes = Buffer.from(await res.arrayBuffer());
  let json: any = null;
  if (res.status !== 200)
    try {
      json = JSON.parse(bytes.toString());
    } catch {
      /* judged by the caller */
    }
  return { status: res.status, bytes, json };
}

/** SHA-256 of every file of a checkpoint, downloaded; undefined for a file that did not download with 200. */
export async function downloadedHashes(base: string, client: KeepAliveClient, id: string): Promise<Map<string, string | undefined>> {
  const listed = await ok(client, 'GET', `/v1/loops/checkpoints/${id}/files`);
  const out = new Map<string, string | undefined>();
  for (const f of listed.presigned_urls) {
    const got = await downloadFile(base, client, id, f.relative_file_name);
    out.set(f.relative_file_name, got.status === 200 ? sha256(got.bytes) : undefined);
  }
  return out;
}

/** One run of a server on `dataDir`: a trainer checkpoint (save_state) and a sampler one (save_weights_for_sampler), then a graceful stop. */
export async function saveCheckpoints(root: string, dataDir: string): Promise<SavedState> {
  const server = await startServerProcess(root, ['--data-dir', dataDir, ...SERVER_ARGS]);
  const client = keepAliveClient(server.base, 2);
  try {
    const sessionId = (await ok(client, 'POST', '/v1/loops/sessions')).session.id as string;
    const run = (await ok(client, 'POST', '/v1/loops/runs', { session_id: sessionId, base_model: MODEL, lora_rank: 4 })).run;
    const trainer = `/trainer/${run.id}`;
    await runOperation(client, trainer, 'save_state', { name: 'state' });
    await runOperation(client, trainer, 'save_weights_for_sampler', { name: 'weights' });
    const listed = (await ok(client, 'GET', `/v1/loops/checkpoints?run_id=${run.id}`)).checkpoints as any[];
    const checkpoints: SavedCheckpoint[] = [];
    for (const c of listed) {
      const target = c.target as 'trainer' | 'sampler';
      const files = new Map<string, string>();
      for (const [name, hash] of await downloadedHashes(server.base, client, c.id)) {
        if (!hash) throw new Error(`checkpoint ${c.id}: ${name} did not download after its save`);
        files.set(name, hash);
      }
      checkpoints.push({ id: c.id, path: `bt://loops:${run.id}/${target === 'trainer' ? 'weights' : 'sampler_weights'}/${c.checkpoint_id}`, target, files });
    }
    return { runId: run.id, sessionId, checkpoints };
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
}

/** Every file under `folder` (relative path → SHA-256), to tell whether anything was removed or changed. */
export function treeHashes(folder: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (dir: string, prefix: string) => {
    for (const name of readdirSync(dir)) {
      const full = join(dir, name);
      if (statSync(full).isDirectory()) walk(full, `${prefix}${name}/`);
      else out.set(`${prefix}${name}`, sha256(readFileSync(full)));
    }
  };
  if (existsSync(folder)) walk(folder, '');
  return out;
}

/** Files of `before` that `after` lacks or holds changed, by name. */
export function changedFiles(before: Map<string, string>, after: Map<string, string>): string[] {
  return [...before].filter(([name, hash]) => after.get(name) !== hash).map(([name]) => name);
}
