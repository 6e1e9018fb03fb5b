import { parentPort, workerData } from 'node:worker_threads';
import { GraphRunner } from './graph-runner.js';
import type { PrebuildListener, RunnerConfig, RunRequest } from './runner-protocol.js';

/**
 * The worker thread of one ModelEngine: builds the base weights and runs graphs off the server's thread. Its
 * config comes as its workerData or, for the worker the command line starts before the server loads
 * (engine-prestart.ts), as its first message. A config that fails to build fails each call with the reason.
 */
let runner: GraphRunner | Error | null = null;
function startRunner(config: RunnerConfig): void {
  try {
    runner = new GraphRunner(config);
  } catch (err) {
    runner = err as Error;
  }
}
if (workerData) startRunner(workerData as RunnerConfig);

/** Prebuild calls under way and not told to stop (the engine closing, or its warm-up stopped, takes one out). */
const underWay = new Set<number>();

parentPort!.on('message', async (msg: { id: number; config?: RunnerConfig; prebuild?: RunRequest['kind'][]; stopPrebuild?: number; run?: RunRequest }) => {
  if (msg.config) {
    startRunner(msg.config);
    return;
  }
  if (msg.stopPrebuild !== undefined) {
    underWay.delete(msg.stopPrebuild);
    return;
  }
  try {
    if (!runner) throw new Error('The model engine got a call before its config.');
    if (runner instanceof Error) throw runner;
    const graphs = runner;
    if (msg.prebuild) {
      const told: PrebuildListener = (kind, phase, ms) => parentPort!.postMessage({ id: msg.id, building: { kind, phase, ms } });
      underWay.add(msg.id);
      try {
        await graphs.prebuild(msg.prebuild, told, () => !underWay.has(msg.id));
      } finally {
        underWay.delete(msg.id);
      }
      parentPort!.postMessage({ id: msg.id, outputs: {} });
      return;
    }
    const outputs = await graphs.run(msg.run!);
    parentPort!.postMessage(
      { id: msg.id, outputs },
      Object.values(outputs).map((o) => o.data.buffer as ArrayBuffer),
    );
  } catch (err) {
    parentPort!.postMessage({ id: msg.id, error: { name: (err as Error).name, message: (err as Error).message } });
  }
});
