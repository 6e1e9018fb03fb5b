import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchControlPlane } from './control-plane.js';
import { benchEngine } from './engine.js';
import { benchFirstRound } from './first-round.js';
import { benchFootprint } from './footprint.js';
import { benchInference } from './inference.js';
import { benchMemory } from './memory.js';
import { benchProxy } from './proxy.js';
import { benchSampler } from './sampler.js';
import { benchTrainer } from './trainer.js';
import { figures } from './figures.js';

/**
 * `npm run bench`: prints every figure the issues set targets for. With --json the lines go to stderr and
 * stdout gets every figure as JSON (value, unit, target, met); the exit status stays 0 (figures, not tests).
 * `--only PART[,PART]` runs just those parts (names below), e.g. `npx tsx bench/run.ts --only inference`.
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const PARTS: Record<string, () => Promise<void>> = {
  'control-plane': () => benchControlPlane(root),
  proxy: () => benchProxy(root),
  trainer: () => benchTrainer(root),
  'first-round': () => benchFirstRound(root),
  sampler: () => benchSampler(root),
  inference: () => benchInference(root),
  engine: () => benchEngine(),
  memory: () => benchMemory(root),
  footprint: () => benchFootprint(root),
};
const usage = `usage: npm run bench [-- --json] [--only ${Object.keys(PARTS).join('|')}[,...]]`;
const args = process.argv.slice(2);
const json = args.includes('--json');
const onlyAt = args.indexOf('--only');
const only = onlyAt >= 0 ? (args[onlyAt + 1] ?? '').split(',').filter(Boolean) : Object.keys(PARTS);
const unknown = args.filter((a, i) => a !== '--json' && i !== onlyAt && i !== onlyAt + 1);
const unknownParts = only.filter((p) => !Object.hasOwn(PARTS, p));
if (args.includes('--help')) {
  console.log(usage);
  process.exit(0);
}
if (unknown.length || unknownParts.length || only.length === 0) {
  console.error(
    `bench: ${unknownParts.length ? `unknown part ${unknownParts.join(', ')}` : only.length === 0 ? '--only needs part names' : `unknown argument ${unknown.join(' ')}`}; ${usage}`,
  );
  process.exit(2);
}
const print = console.log;
if (json) console.log = (...args: unknown[]) => console.error(...args);
for (const part of only) await PARTS[part]!();
if (json) {
  const all = figures();
  print(JSON.stringify({ figures: all, missed: all.filter((f) => f.met === false).map((f) => f.name) }, null, 2));
}
