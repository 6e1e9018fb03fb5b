import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchControlPlane } from './control-plane.js';
import { benchEngine } from './engine.js';
import { benchFootprint } from './footprint.js';
import { benchMemory } from './memory.js';
import { benchProxy } from './proxy.js';
import { benchSampler } from './sampler.js';
import { benchTrainer } from './trainer.js';
import { figures } from './figures.js';

/**
 * `npm run bench`: prints every figure the issues set targets for. With --json the lines go to stderr and
 * stdout gets every figure as JSON (value, unit, target, met); the exit status stays 0 (figures, not tests).
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const json = process.argv.slice(2).includes('--json');
const unknown = process.argv.slice(2).filter((a) => a !== '--json');
if (unknown.length) {
  console.error(`bench: unknown argument ${unknown.join(' ')}; usage: npm run bench [-- --json]`);
  process.exit(2);
}
const print = console.log;
if (json) console.log = (...args: unknown[]) => console.error(...args);
await benchControlPlane(root);
await benchProxy(root);
await benchTrainer(root);
await benchSampler(root);
await benchEngine();
await benchMemory(root);
await benchFootprint(root);
if (json) {
  const all = figures();
  print(JSON.stringify({ figures: all, missed: all.filter((f) => f.met === false).map((f) => f.name) }, null, 2));
}
