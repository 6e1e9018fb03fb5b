import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { diskFullTargets, runDiskFull } from '../disk-full.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('the disk-full soak case (one spell; npm run soak runs more)', () => {
  it('a server on a full data dir stays up, refuses saves naming the disk, answers reads, recovers, and loses nothing', async () => {
    const figures = await runDiskFull(root, { spells: 1 });
    console.log(`disk-full soak: on ${figures.how}; ${figures.acknowledged} checkpoints acknowledged`);
    const missed = diskFullTargets(figures).filter((r) => !r.met);
    expect({ missed, failures: figures.failures }).toEqual({ missed: [], failures: [] });
    expect(figures.acknowledged).toBeGreaterThan(0);
  }, 300_000);
});
