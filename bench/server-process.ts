import { randomUUID } from 'node:crypto';
import { spawn } from 'node:child_process';
import { Agent, request } from 'node:http';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';

export const BENCH_KEY = 'bench-key';

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export interface ServerProcess {
  base: string;
  /** Milliseconds from spawn to the first 200 answer. */
  startupMs: number;
  pid: number;
  stop(): void;
  /** Settles when the process has exited, with its exit code (null when a signal ended it). */
  exited: Promise<number | null>;
}

/** Starts the built command (dist/) as its own process on a free port and waits for its first 200. */
export async function startServerProcess(root: string, args: string[] = [], env: Record<string, string> = {}): Promise<ServerProcess> {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const started = performance.now();
  // As the loops-mock command (npm's link, npm start) runs: the runtime settings its launcher makes count here.
  const child = spawn(join(root, 'bin', 'loops-mock.js'), ['--port', String(port), ...args], { stdio: 'ignore', env: { ...process.env, ...env } });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  for (;;) {
    try {
      const res = await fetch(`${base}/v1/loops/capabilities`, { headers: { authorization: `Bearer ${BENCH_KEY}` } });
      if (res.status === 200) break;
    } catch {
      /* not listening yet */
    }
    if (child.exitCode !== null) throw new Error(`server exited with status ${child.exitCode} before answering (args: ${args.join(' ')})`);
    if (performance.now() - started > 10_000) {
      child.kill('SIGKILL');
      throw new Error('server did not start within 10 s');
    }
    await new Promise((r) => setTimeout(r, 2));
  }
  return { base, startupMs: performance.now() - started, pid: child.pid!, stop: () => child.kill('SIGTERM'), exited };
}

/**
 * Starts the built command as a CI job does and hands it over the moment its ready line (`LOOPS_BASE_URL=`)
 * is printed: `startupMs` is spawn to that line. `env` adds to (or, with undefined, removes from) the environment.
 */
export async function startAtReadyLine(root: string, args: string[] = [], env: Record<string, string | undefined> = {}): Promise<ServerProcess> {
  const port = await freePort();
  const started = performance.now();
  const merged = { ...process.env, ...env };
  for (const [k, v] of Object.entries(env)) if (v === undefined) delete merged[k];
  const child = spawn(join(root, 'bin', 'loops-mock.js'), ['--port', String(port), ...args], { stdio: ['ignore', 'pipe', 'ignore'], env: merged });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  let printed = '';
  const readyMs = await new Promise<number>((resolve, reject) => {
    child.stdout!.on('data', (d: Buffer) => {
      printed += d.toString();
      if (printed.includes('LOOPS_BASE_URL=')) resolve(performance.now() - started);
    });
    void exited.then((code) => reject(new Error(`server exited with status ${code} before its ready line (args: ${args.join(' ')})`)));
  });
  child.stdout!.resume();
  return { base: `http://127.0.0.1:${port}`, startupMs: readyMs, pid: child.pid!, stop: () => child.kill('SIGTERM'), exited };
}

/** A lean keep-alive HTTP client: figures should be the server's, not fetch's (about 1 ms a request on its own). */
export function keepAliveClient(base: string, sockets = 16) {
  const agent = new Agent({ keepAlive: true, maxSockets: sockets });
  const send = (method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; json: any }> =>
    new Promise((resolve, reject) => {
      const req = request(
        `${base}${path}`,
        { method, agent, headers: { authorization: `Bearer ${BENCH_KEY}`, 'content-type': 'application/json', ...headers } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => resolve({ status: res.statusCode!, json: JSON.parse(Buffer.concat(chunks).toString() || 'null') }));
        },
      );
      req.on('error', reject);
      req.end(body === undefined ? (method === 'POST' ? '{}' : undefined) : JSON.stringify(body));
    });
  return { send, close: () => agent.destroy() };
}

export type KeepAliveClient = ReturnType<typeof keepAliveClient>;

/** A 200's JSON body; any other status is an error naming the request and the answer. */
export async function ok(client: KeepAliveClient, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<any> {
  const res = await client.send(method, path, body, headers);
  if (res.status !== 200) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.json).slice(0, 300)}`);
  return res.json;
}

/** Submits a trainer operation and long-polls it (408 is a window that passed) until done: its result, else an error. */
export async function runOperation(client: KeepAliveClient, trainer: string, name: string, body: unknown): Promise<any> {
  const { operation_id } = await ok(client, 'POST', `${trainer}/${name}`, body, { 'idempotency-key': randomUUID() });
  for (;;) {
    const res = await client.send('GET', `${trainer}/operations/${operation_id}`);
    if (res.status === 408) continue;
    if (res.status !== 200 || res.json.status !== 'done') throw new Error(`${name}: ${res.status} ${JSON.stringify(res.json).slice(0, 300)}`);
    return res.json.result;
  }
}

/** The server's resident memory now (VmRSS), or its peak since the last resetPeak (VmHWM), from /proc (Linux). */
export function residentBytes(pid: number, which: 'VmRSS' | 'VmHWM' = 'VmRSS'): number {
  const m = new RegExp(`${which}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no ${which} for process ${pid}`);
  return Number(m[1]) * 1024;
}
