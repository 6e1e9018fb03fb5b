// Starts the engine worker from TypeScript source (tests, tsx): worker threads do not inherit the
// parent's --import loader, so register tsx here first. Built code starts dist/models/engine-worker.js directly.
import { register } from 'tsx/esm/api';

register();
await import('./engine-worker.ts');
