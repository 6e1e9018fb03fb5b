/**
 * The first engine's worker thread, started by the command line as the process starts (bin/loops-mock.js),
 * before it loads the server: the thread's own start and onnxruntime's load (~70 ms on two cores) then overlap
 * the server's, rather than begin once the options are read. The worker waits for its engine's config
 * (engine-worker.ts); the first WorkerRunner to start takes it. One never taken (a start that fails, --help)
 * is ended a moment later, and never keeps a process alive.
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

let early: { worker: Worker; file: string; failed: boolean } | null = null;

/** The started worker's state: none started (or it was taken or ended), waiting to be taken, or failed to start. */
export function prestartedWorker(): 'none' | 'waiting' | 'failed' {
  return early === null ? 'none' : early.failed ? 'failed' : 'waiting';
}

/** How many started workers engines took (a test counts the hand-over). */
export let engineWorkersTaken = 0;

/** Starts a worker that waits for an engine's config; at most one at a time. */
export function prestartEngineWorker(file = engineWorkerFile(), untakenMs = UNTAKEN_MS): void {
  if (early) return;
  const worker = new Worker(file, { workerData: null });
  worker.unref();
  const entry = { worker, file, failed: false };
  // A worker that failed to start is never handed over: the runner starts its own, which reports why.
  worker.once('error', () => {
    entry.failed = true;
  });
  worker.once('exit', () => {
    entry.failed = true;
  });
  early = entry;
  setTimeout(() => {
    if (early !== entry) return;
    early = null;
    void worker.terminate();
  }, untakenMs).unref();
}

/** The started worker, given `config`, if one is waiting for `file`; null otherwise (the caller starts one). */
export function takeEngineWorker(file: string, config: RunnerConfig): Worker | null {
  const entry = early;
  early = null;
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
  engineWorkersTaken++;
  return entry.worker;
}
