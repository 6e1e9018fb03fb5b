import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { corruptCheckpointTargets, runCorruptCheckpoint } from '../corrupt-checkpoint.js';
import { corruptDatabaseTargets, runCorruptDatabase } from '../corrupt-database.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('the corrupt-state soak cases (reduced: npm run soak runs every damage)', () => {
  it('a damaged database: every start refused with one line, no checkpoint file touched, both ways out work', async () => {
    const f = await runCorruptDatabase(root, { damages: ['deleted', 'scrambled pages', 'a record that is not JSON'] });
    expect({ missed: corruptDatabaseTargets(f).filter((r) => !r.met), failures: f.failures }).toEqual({ missed: [], failures: [] });
    expect(f.cases).toBe(3);
  }, 240_000);

  it('a damaged checkpoint file: every use a 409 naming checkpoint and file, and whole again once put back', async () => {
    const f = await runCorruptCheckpoint(root, { damages: ['bytes flipped'] });
    expect({ missed: corruptCheckpointTargets(f).filter((r) => !r.met), failures: f.failures }).toEqual({ missed: [], failures: [] });
    // Both checkpoints, each of their files (a trainer state holds its optimizer file too).
    expect(f.cases).toBeGreaterThanOrEqual(4);
  }, 240_000);
});
