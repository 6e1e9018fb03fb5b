import { describe, expect, it } from 'vitest';
import { WorkerRunner } from '../engine-runner.js';
import { DEFAULT_DIMS } from '../transformer.js';

describe('the worker transport', () => {
  it('fails a call it cannot hand to the worker, leaving nothing pending: close() still ends', async () => {
    const runner = new WorkerRunner({
      modelName: 'transport-test',
      dims: { vocab: 16, ...DEFAULT_DIMS, dModel: 8, heads: 2, ffn: 8, layers: 1 },
      device: 'cpu',
    });
    // A function cannot be cloned into the worker: postMessage throws.
    const unclonable = {
      kind: 'forward',
      merged: false,
      feeds: { tokens: { type: 'int64', data: (() => 0) as never, dims: [1, 1] } },
      outputs: ['logprobs'],
      adapters: [{ id: 'a', version: 0 }],
    } as never;
    await expect(runner.run(unclonable)).rejects.toThrow(/could not take this work/);
    const closed = await Promise.race([runner.close().then(() => 'closed'), new Promise((r) => setTimeout(() => r('hung'), 5000))]);
    expect(closed).toBe('closed');
  });
});
