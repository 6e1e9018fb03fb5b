#!/usr/bin/env node
// `npm start` builds only when a source is newer than the last build: a built checkout starts at once.
// `npm run build` passes --always. Either way the build ends the same: the stamp written, the commands executable.
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
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

/**
 * The command's server as two files, dist/bundle/cli.js and the engine's worker dist/bundle/engine-worker.js, made
 * from the compiled modules: loading ~500 modules one by one took about a third of a second of a start on two
 * cores (docs/engine.md, "Cold start"). The library (dist/server/index.js) stays as compiled. Left outside: the
 * native packages, and what the server loads only when asked (graphql, yaml, node-forge).
 */
async function bundleCommand() {
  const { build } = await import('esbuild');
  // The graphs' digests, written into the bundle beside the code that builds the graphs (models/graph-digests.ts).
  const { builtInGraphSpecs, graphDigests } = await import(join(root, 'dist', 'models', 'graph-digests.js'));
  const out = join(root, 'dist', 'bundle');
  const { metafile } = await build({
    entryPoints: {
      cli: join(root, 'dist', 'server', 'cli.js'),
      'engine-worker': join(root, 'dist', 'models', 'engine-worker.js'),
      // The launcher starts the engine's worker before loading the server (models/engine-prestart.ts).
      'engine-prestart': join(root, 'dist', 'models', 'engine-prestart.js'),
    },
    outdir: out,
    bundle: true,
    // What the server imports only when asked (the GraphQL schema and graphql-js) stays in files of its own,
    // loaded then; every file lands in dist/bundle, where the command finds the worker beside it.
    splitting: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    external: ['onnxruntime-node', 'better-sqlite3', 'graphql', 'yaml', 'node-forge'],
    // The CommonJS packages inside (fastify, pino, ajv) call require for Node's own modules.
    banner: { js: "import { createRequire as loopsMockRequire } from 'node:module'; const require = loopsMockRequire(import.meta.url);" },
    // As JSON text: an object would be a module of its own, initialized by every module of the bundle.
    define: { LOOPS_MOCK_GRAPH_DIGESTS: JSON.stringify(JSON.stringify(graphDigests(builtInGraphSpecs()))) },
    logLevel: 'warning',
    metafile: true,
    // The metafile's paths are relative to this.
    absWorkingDir: root,
  });
  // Chunks are named by their content: without this, every build would leave the last one's beside it (and in a
  // pack). Only files this build did not write go, after it: a server running from here keeps the chunks it loads.
  const written = new Set(Object.keys(metafile.outputs).map((f) => join(root, f)));
  for (const name of readdirSync(out)) if (!written.has(join(out, name))) rmSync(join(out, name), { force: true });
}

const sources = Math.max(...SOURCES.map((d) => newest(join(root, d))), ...CONFIGS.map((f) => statSync(join(root, f)).mtimeMs));
const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
const always = process.argv.includes('--always');
if (always || sources > built || !existsSync(join(root, 'dist', 'server', 'cli.js')) || !existsSync(join(root, 'dist', 'bundle', 'cli.js'))) {
  if (!always) process.stderr.write('loops-mock: building (sources changed since the last build)...\n');
  execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit' });
  await bundleCommand();
  // The routes' request validators compiled ahead (server/http/route-validators.ts), from the compiled modules.
  const { writeRouteValidators } = await import(join(root, 'dist', 'server', 'build-route-validators.js'));
  await writeRouteValidators();
  // The package's own cache entries, read by a first process: the built-in tokenizer families' stop-string decoder
  // tables (instead of scanning, models/token-decoder.ts) and the warm-up's optimized graphs (models/shipped-graphs.ts).
  const { shippedCacheDir } = await import(join(root, 'dist', 'models', 'package-root.js'));
  const { shipDecoderTables } = await import(join(root, 'dist', 'models', 'tokenizers.js'));
  const { shipOptimizedGraphs } = await import(join(root, 'dist', 'models', 'shipped-graphs.js'));
  rmSync(shippedCacheDir(), { recursive: true, force: true });
  shipDecoderTables(shippedCacheDir());
  await shipOptimizedGraphs(shippedCacheDir());
  writeFileSync(stamp, `${new Date().toISOString()}\n`);
}
// `npm start` runs the command through its shebang (bin/loops-mock.js says why), as npm's links do.
for (const file of [join('bin', 'loops-mock.js'), join('dist', 'server', 'cli.js'), join('dist', 'conformance', 'cli.js')]) chmodSync(join(root, file), 0o755);
