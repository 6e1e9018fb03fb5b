import { parentPort, workerData } from 'node:worker_threads';
import { GraphRunner } from './graph-runner.js';
import type { RunnerConfig, RunRequest } from './runner-protocol.js';

/** The worker thread of one ModelEngine: builds the base weights and runs graphs off the server's thread. */
const runner = new GraphRunner(workerData as RunnerConfig);

parentPort!.on('message', async (msg: { id: number; prebuild?: RunRequest['kind'][]; run?: RunRequest }) => {
  try {
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
