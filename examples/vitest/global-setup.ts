// vitest.config.ts: test.globalSetup = ['./global-setup.ts']
import type { TestProject } from 'vitest/node';
import { startServer } from 'loops-mock';

declare module 'vitest' {
  export interface ProvidedContext {
    loopsEnv: Record<string, string>;
  }
}

export default async function setup(project: TestProject) {
  const server = await startServer({ port: 0, logLevel: 'warn' }); // options are the flags in camelCase
  project.provide('loopsEnv', server.env); // LOOPS_BASE_URL, BASETEN_API_KEY, ...
  return () => server.close();
}
