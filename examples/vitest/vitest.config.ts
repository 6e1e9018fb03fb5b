import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    root: import.meta.dirname,
    globalSetup: ['./global-setup.ts'],
    include: ['*.test.ts'],
  },
});
