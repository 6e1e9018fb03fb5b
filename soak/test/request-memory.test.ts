import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { requestMemoryTargets, runRequestMemory } from '../request-memory.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('the request-memory soak case (tiny limits; npm run soak runs it at the defaults)', () => {
  it('carries out each reproducer at its limit, refuses it one over with a 400 naming the flag, and reads each peak', async () => {
    const limits = { sampledTokens: 64, batchTokens: 64, bodyBytes: 256 * 1024, concurrency: 4 };
    const f = await runRequestMemory(root, {
      limits,
      maxSeqLen: 32,
      settleMs: 200,
      serverArgs: [
        '--max-sampled-tokens',
        '64',
        '--max-batch-tokens',
        '64',
        '--body-limit',
        String(limits.bodyBytes),
        '--body-bytes-in-flight',
        String(limits.bodyBytes * 2),
        '--max-seq-len-limit',
        '32',
      ],
    });
    expect(f.failures).toEqual([]);
    expect(f.cases.map((c) => [c.case, c.expect])).toEqual([
      ['sample at max_sampled_tokens', 'accepted'],
      ['sample one sample over', 'refused'],
      ['completions at max_sampled_tokens', 'accepted'],
      ['completions one over', 'refused'],
      ['forward_backward at max_batch_tokens, rank 128', 'accepted'],
      ['forward_backward one token over', 'refused'],
      ['forward_backward of one-token datums at max_batch_tokens', 'accepted'],
      ['forward_backward one datum over', 'refused'],
      ['4 concurrent bodies at the body limit', 'refused'],
    ]);
    for (const c of f.cases) expect(c.peakMb, c.case).toBeGreaterThan(c.beforeMb * 0.5);
    // Refusals name their flag; the burst is 400s (too long for the run), or 503s where the bodies held at once pass the budget.
    expect(f.cases[1]!.outcome).toContain('--max-sampled-tokens');
    expect(f.cases[5]!.outcome).toContain('--max-batch-tokens');
    expect(f.cases[8]!.outcome).toMatch(/^(\d x (400|503)(, )?)+$/);
    const rows = requestMemoryTargets(f);
    expect(rows).toHaveLength(2 * f.cases.length);
    expect(rows.filter((r) => !r.met)).toEqual([]);
  }, 300_000);
});
