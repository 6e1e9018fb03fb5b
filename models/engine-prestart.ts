/**
 * The first engine's worker thread, started by the command line as the process starts (bin/loops-mock.js),
 * before the server's modules load: the thread's own start and its modules (onnxruntime's among them) then
 * overlap the server's load from ~60 ms sooner instead of following it. The worker waits for its engine's config
 * (engine-worker.ts); the first WorkerRunner to start takes it. One never taken (a start refused, a command
 * that runs no engine) is ended a moment later, and never keeps a process alive.
 */
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { RunnerConfig } from './runner-protocol.js';

/** The worker's file beside this module: TypeScript through tsx's loader from source, plain JavaScript built. */
export function engineWorkerFile(): string {
  const fromSource = import.meta.url.endsWith('.ts');
  return fileURLToPath(new URL(fromSource ? './engine-worker-source.mjs' : './engine-worker.js', import.meta.url));
}

/** How long a started worker waits to be taken before it is ended. */
const UNTAKEN_MS = 10_000;

interface Started {
  worker: Worker;
  file: string;
  failed: boolean;
}

let started: Started | null = null;

/** The started worker's state: none (never started, taken or ended), waiting to be taken, or failed to start. */
export function prestartedWorker(): 'none' | 'waiting' | 'failed' {
  return started === null ? 'none' : started.failed ? 'failed' : 'waiting';
}

/** How many started workers engines took (tests count the hand-over). */
let taken = 0;
export function engineWorkersTaken(): number {
  return taken;
}

/** Starts a worker that waits for an engine's config; at most one at a time. */
export function prestartEngineWorker(file = engineWorkerFile(), untakenMs = UNTAKEN_MS): void {
  if (started) return;
  const worker = new Worker(file, { workerData: null });
  worker.unref();
  const entry: Started = { worker, file, failed: false };
  // A worker that failed to start is never handed over: the runner starts its own, which reports why.
  const failed = () => {
    entry.failed = true;
  };
  worker.once('error', failed);
  worker.once('exit', failed);
  started = entry;
  setTimeout(() => {
    if (started !== entry) return;
    started = null;
    void worker.terminate();
  }, untakenMs).unref();
}

/** The started worker, sent `config`, if one waits for `file`; null otherwise (the caller starts its own). */
export function takeEngineWorker(file: string, config: RunnerConfig): Worker | null {
  const entry = started;
  started = null;
  if (!entry) return null;
  if (entry.failed || entry.file !== file) {
    void entry.worker.terminate();
    return null;
  }
  try {
    entry.worker.postMessage({ config });
  } catch {
    // A config that cannot be sent (it could not be cloned): the runner's own worker will say why.
    void entry.worker.terminate();
    return null;
  }
  taken++;
  return entry.worker;
}
