import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO_ROOT } from './helpers.js';

/** The README's vitest recipe is examples/vitest/, word for word; it type-checks under strict (npm test's tsc) and passes. */
const EXAMPLE = join(REPO_ROOT, 'examples', 'vitest');

describe('the vitest recipe', () => {
  it('is in the README as it is in examples/vitest/', () => {
    const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
    for (const file of ['global-setup.ts', 'client.test.ts', 'idle-timeout.test.ts']) {
      expect(readme, file).toContain(readFileSync(join(EXAMPLE, file), 'utf8').trim());
    }
  });

  it('runs: the global setup serves a test, and a ManualClock passes an hour at once', () => {
    const done = spawnSync(process.execPath, [join(REPO_ROOT, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '--config', join(EXAMPLE, 'vitest.config.ts')], {
      cwd: REPO_ROOT,
      encoding: 'utf8',
      timeout: 120_000,
    });
    expect(done.status, done.stdout + done.stderr).toBe(0);
    expect(done.stdout).toMatch(/Tests\s+.*2 passed/);
  }, 150_000);
});
