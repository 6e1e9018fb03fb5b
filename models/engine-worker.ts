import { parentPort, workerData } from 'node:worker_threads';
import { GraphRunner } from './graph-runner.js';
import type { RunnerConfig, RunRequest } from './runner-protocol.js';

/**
 * The worker thread of one ModelEngine: builds the base weights and runs graphs off the server's thread. Its
 * config comes as its workerData, or, for a worker started before the engine existed (engine-prestart.ts), as
 * its first message; a config that fails to build fails the thread either way (the runner rejects its calls).
 */
let runner: GraphRunner | null = workerData ? new GraphRunner(workerData as RunnerConfig) : null;

parentPort!.on('message', (msg: { config?: RunnerConfig }) => {
  if (msg.config) {
    runner = new GraphRunner(msg.config);
  }
});

parentPort!.on('message', async (msg: { id?: number; prebuild?: RunRequest['kind'][]; run?: RunRequest }) => {
  if (msg.id === undefined) return;
  try {
    if (!runner) throw new Error('The model engine got a call before its config.');
    if (msg.prebuild) {
      await runner.prebuild(msg.prebuild);
      parentPort!.postMessage({ id: msg.id, outputs: {} });
      return;
    }
    const outputs = await runner.run(msg.run!);
    parentPort!.postMessage(
      { id: msg.id, outputs },
      Object.values(outputs).map((o) => o.data.buffer as ArrayBuffer),
    );
  } catch (err) {
    parentPort!.postMessage({ id: msg.id, error: { name: (err as Error).name, message: (err as Error).message } });
  }
});
