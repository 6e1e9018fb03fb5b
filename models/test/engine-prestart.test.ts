import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { engineWorkerFile, engineWorkersTaken, prestartedWorker, prestartEngineWorker, takeEngineWorker } from '../engine-prestart.js';
import { WorkerRunner } from '../engine-runner.js';
import { ModelEngine } from '../engine.js';
import { freshAdapter } from '../lora.js';
import type { RunnerConfig } from '../runner-protocol.js';
import { DEFAULT_DIMS } from '../transformer.js';

const dir = mkdtempSync(join(tmpdir(), 'engine-prestart-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const dims = { dModel: 16, heads: 2, ffn: 32, layers: 1 };
const until = async (done: () => boolean) => {
  for (let i = 0; i < 500 && !done(); i++) await new Promise((r) => setTimeout(r, 10));
};

describe("the command line's engine worker, started before its engine", () => {
  it('is taken by the first engine, which computes with it exactly what an engine with a worker of its own does', async () => {
    prestartEngineWorker();
    expect(prestartedWorker()).toBe('waiting');
    const taken = engineWorkersTaken();
    const early = new ModelEngine('prestart-test', 64, { dims });
    const own = new ModelEngine('prestart-test', 64, { dims });
    try {
      const adapter = freshAdapter(early.sites, 4, 8, 'prestart');
      const seqs = [{ tokens: [1, 5, 9, 3], targets: [5, 9, 3, 7] }];
      const first = await early.forward(seqs, adapter);
      // Taken by the first engine, sent its config; the second engine starts its own.
      expect(engineWorkersTaken()).toBe(taken + 1);
      expect(prestartedWorker()).toBe('none');
      const second = await own.forward(seqs, adapter);
      expect(first).toEqual(second);
      expect(first[0]!.some((x) => x !== 0)).toBe(true);
    } finally {
      await early.close();
      await own.close();
    }
  });

  it('fails each call with the reason when its config cannot make a runner, and still closes', async () => {
    prestartEngineWorker();
    // A width no weights can be made of: the runner's construction throws inside the worker.
    const runner = new WorkerRunner({ modelName: 'broken', dims: { vocab: 16, ...DEFAULT_DIMS, dModel: -1 }, device: 'cpu' });
    const taken = engineWorkersTaken();
    await expect(runner.prebuild(['forward'])).rejects.toThrow(/length/i);
    expect(engineWorkersTaken()).toBe(taken + 1);
    await runner.close();
  });

  it('is never handed over once it failed to start: the engine starts its own', async () => {
    const broken = join(dir, 'broken-worker.mjs');
    writeFileSync(broken, "throw new Error('this worker cannot start');\n");
    prestartEngineWorker(broken);
    await until(() => prestartedWorker() === 'failed');
    expect(prestartedWorker()).toBe('failed');
    const config: RunnerConfig = { modelName: 'x', dims: { vocab: 16, ...DEFAULT_DIMS }, device: 'cpu' };
    expect(takeEngineWorker(broken, config)).toBeNull();
    // One started for another file is not taken either (and is ended).
    prestartEngineWorker(broken);
    expect(takeEngineWorker(engineWorkerFile(), config)).toBeNull();
    expect(prestartedWorker()).toBe('none');
  });

  it('is ended when no engine takes it', async () => {
    prestartEngineWorker(engineWorkerFile(), 50);
    expect(prestartedWorker()).toBe('waiting');
    await until(() => prestartedWorker() === 'none');
    expect(prestartedWorker()).toBe('none');
  });
});
