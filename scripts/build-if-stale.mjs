#!/usr/bin/env node
// `npm start` builds only when a source is newer than the last build: a built checkout starts at once.
// `npm run build` passes --always. Either way the build ends the same: the stamp written, the commands executable.
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const stamp = join(root, 'dist', '.build-stamp');
const SOURCES = ['server', 'models', 'conformance'];
const CONFIGS = ['tsconfig.json', 'tsconfig.build.json', 'package.json'];

/** The newest modification time of the files the build reads (what tsconfig.build.json includes). */
function newest(path) {
  const s = statSync(path);
  if (!s.isDirectory()) return s.mtimeMs;
  let latest = 0;
  for (const entry of readdirSync(path)) {
    if (entry === 'test' || entry === 'node_modules' || entry === '__pycache__') continue;
    latest = Math.max(latest, newest(join(path, entry)));
  }
  return latest;
}

const sources = Math.max(...SOURCES.map((d) => newest(join(root, d))), ...CONFIGS.map((f) => statSync(join(root, f)).mtimeMs));
const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
const always = process.argv.includes('--always');
if (always || sources > built || !existsSync(join(root, 'dist', 'server', 'cli.js'))) {
  if (!always) process.stderr.write('loops-mock: building (sources changed since the last build)...\n');
  execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit' });
  writeFileSync(stamp, `${new Date().toISOString()}\n`);
}
// `npm start` runs the command through its shebang (bin/loops-mock.js says why), as npm's links do.
for (const file of [join('bin', 'loops-mock.js'), join('dist', 'server', 'cli.js'), join('dist', 'conformance', 'cli.js')]) chmodSync(join(root, file), 0o755);
