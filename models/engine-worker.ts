import { parentPort, workerData } from 'node:worker_threads';
import { GraphRunner } from './graph-runner.js';
import type { PrebuildListener, RunnerConfig, RunRequest } from './runner-protocol.js';

/** The worker thread of one ModelEngine: builds the base weights and runs graphs off the server's thread. */
const runner = new GraphRunner(workerData as RunnerConfig);

/** Prebuild calls under way and not told to stop (the engine closing, or its warm-up stopped, takes one out). */
const underWay = new Set<number>();

parentPort!.on('message', async (msg: { id: number; prebuild?: RunRequest['kind'][]; stopPrebuild?: number; run?: RunRequest }) => {
  if (msg.stopPrebuild !== undefined) {
    underWay.delete(msg.stopPrebuild);
    return;
  }
  try {
    if (msg.prebuild) {
      const told: PrebuildListener = (kind, phase, ms) => parentPort!.postMessage({ id: msg.id, building: { kind, phase, ms } });
      underWay.add(msg.id);
      try {
        await runner.prebuild(msg.prebuild, told, () => !underWay.has(msg.id));
      } finally {
        underWay.delete(msg.id);
      }
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
