import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchControlPlane } from './control-plane.js';
import { benchEngine } from './engine.js';
import { benchMemory } from './memory.js';
import { benchProxy } from './proxy.js';
import { benchSampler } from './sampler.js';
import { benchTrainer } from './trainer.js';

/** `npm run bench`: prints every figure the issues set targets for. */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
await benchControlPlane(root);
await benchProxy(root);
await benchTrainer(root);
await benchSampler(root);
await benchEngine();
await benchMemory(root);
