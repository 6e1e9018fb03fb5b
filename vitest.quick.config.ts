import { defineConfig } from 'vitest/config';
import base from './vitest.config.js';

/**
 * `npm run test:quick`: each surface once, for a change's first check (about a minute on two cores;
 * `npm test` runs everything). One file per surface, the shortest that covers it end to end.
 */
export const QUICK_FILES = [
  'server/test/control-plane.test.ts', // control plane: sessions, runs, samplers, auth
  'server/test/rl-datums.test.ts', // trainer data plane: datums, losses, steps
  'server/test/stop-limits.test.ts', // sampler data plane: sampling, stop strings
  'server/test/inference.test.ts', // checkpoints deployed to inference (OpenAI-compatible)
  'server/test/graphql.test.ts', // Baseten's GraphQL subset
  'server/test/proxy-hub-smoke.test.ts', // proxy mode and the Hugging Face mirror
  'server/test/admin-journal-faults.test.ts', // admin API: journal, faults
  'server/test/dashboard-data.test.ts', // dashboard data routes
  'server/test/validation.test.ts', // errors: every bad input a 4xx naming the field
  'server/test/start-options.test.ts', // startServer(), /healthz, close()
  'server/test/github-action.test.ts', // the built CLI, --write-env, the GitHub Action
  'server/test/stray-server.test.ts', // npx, node parents and the pytest plugin: no stray server
  'server/test/release.test.ts', // docs and package hygiene
  'models/test/engine-runner.test.ts', // the model engine's worker
];

// Not mergeConfig: it would add these to the main include list, not replace it.
export default defineConfig({ ...base, test: { ...base.test, include: QUICK_FILES } });
