import { defineConfig } from 'vitest/config';
import base from './vitest.config.js';
import { QUICK_FILES } from './vitest.quick.config.js';

/**
 * scripts/test-on-node.sh: what CI runs on the Node versions besides the one it installs with (22 and 24):
 * every surface once (the quick suite), the store's durability on Node's own SQLite, and an install of the
 * packed tarball into a fresh project with no compiler on PATH.
 */
export default defineConfig({
  ...base,
  test: {
    ...base.test,
    include: [
      ...QUICK_FILES,
      'server/test/sqlite.test.ts',
      'server/test/persistence.test.ts',
      'server/test/data-dir-start.test.ts',
      'server/test/cli-data-dir.test.ts',
      'server/test/checkpoint-integrity.test.ts',
      'server/test/launcher.test.ts',
      'server/test/package-install.test.ts',
    ],
  },
});
