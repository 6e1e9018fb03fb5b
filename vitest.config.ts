import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['server/**/*.test.ts', 'models/**/*.test.ts', 'conformance/**/*.test.ts', 'sdk-fixtures/**/*.test.ts', 'soak/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
