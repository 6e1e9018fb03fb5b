#!/usr/bin/env node
// Started as `loops-mock` (bin/loops-mock.js), with the runtime settings that return memory after a burst.
import { ConfigError, parsePort } from './config.js';
import { parseOptions, usage } from './parse-options.js';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { EnginePool, findBaseModel, supportedModelNames, Tokenizers } from '../models/index.js';
import { HubRepos } from './core/hub-repos.js';
import { SqliteUnavailableError } from './core/sqlite.js';
import { DataDirError } from './core/store.js';
import { cacheDirOption, flushNodeCompileCache, removeRetiredEntries } from './cache-dir.js';
import { startEngines, type EnginesWarming } from './engine-warm-up.js';
import { defaultCaDir, LocalCa } from './proxy/ca.js';
import { asksForHelp, parseFlags, type FlagDefinition } from './parse-flags.js';
import { startRecorder } from './record/recorder.js';
import { holdSignals } from './signal-handover.js';
import { LOOPS_API_VERSION, VERSION } from './version.js';

const RECORD_USAGE = `Usage: loops-mock record --upstream URL --out DIR [--flow NAME] [--port N] [--host H]
  A recording proxy in front of a Loops endpoint: point a client at the printed URL; every
  exchange is written to DIR/NAME.json (default NAME: recorded) as an sdk-fixtures flow,
  ids as placeholders, API keys never written. Replay with loops-conformance replay.`;

const RECORD_FLAGS: Record<string, FlagDefinition> = {
  upstream: { type: 'string' },
  out: { type: 'string' },
  flow: { type: 'string' },
  port: { type: 'string' },
  host: { type: 'string' },
};

/** `loops-mock record ...`: the recording proxy. */
async function record(argv: string[]): Promise<void> {
  if (asksForHelp(argv)) {
    process.stdout.write(`${RECORD_USAGE}\n`);
    return;
  }
  const opts: { upstream?: string; out?: string; flow: string; port: number; host: string } = { flow: 'recorded', port: 0, host: '127.0.0.1' };
  const { flags } = parseFlags(argv, RECORD_FLAGS, { error: (message) => new ConfigError(message), unknownFlagSuffix: ' for record' });
  for (const { name, value } of flags) {
    if (value === '') throw new ConfigError(`--${name} needs a value`);
    if (name === 'upstream') opts.upstream = value;
    else if (name === 'out') opts.out = value;
    else if (name === 'flow') {
      if (!/^[A-Za-z0-9._-]+$/.test(value)) throw new ConfigError(`--flow must be a file name (letters, digits, . _ -), got '${value}'`);
      opts.flow = value;
    } else if (name === 'port') opts.port = parsePort(value);
    else opts.host = value;
  }
  if (!opts.upstream || !/^https?:\/\//.test(opts.upstream)) throw new ConfigError('record needs --upstream URL: the Loops endpoint to record (http or https)');
  if (!opts.out) throw new ConfigError('record needs --out DIR: where the fixture is written');
  const recorder = await startRecorder({ upstream: opts.upstream, out: opts.out, flow: opts.flow, port: opts.port, host: opts.host });
  process.stdout.write(
    `LOOPS_BASE_URL=${recorder.url}\nBASETEN_MANAGEMENT_API_URL_OVERRIDE=${recorder.url}\n# loops-mock ${VERSION} recording ${opts.upstream} into ${recorder.file}\n`,
  );
  const stop = () => {
    void recorder.close().then(() => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

const CA_USAGE = `Usage: loops-mock ca [--ca-dir DIR]
  Prints where proxy mode's local CA lives and its certificate (PEM), making it first if the
  folder has none (default ${defaultCaDir()}, or $LOOPS_MOCK_CA_DIR).
  Trust that certificate in a client to let it through loops-mock serve --proxy.`;

/** `loops-mock ca`: the CA's paths and PEM, for trusting it by hand. */
function ca(argv: string[]): void {
  if (asksForHelp(argv)) {
    process.stdout.write(`${CA_USAGE}\n`);
    return;
  }
  const { flags } = parseFlags(argv, { 'ca-dir': { type: 'string' } }, { error: (message) => new ConfigError(message), unknownFlagSuffix: ' for ca' });
  const given = flags.find((f) => f.name === 'ca-dir')?.value ?? process.env.LOOPS_MOCK_CA_DIR;
  if (given === '') throw new ConfigError('--ca-dir needs a value');
  const dir = given ?? defaultCaDir();
  let authority: LocalCa;
  try {
    authority = LocalCa.open(dir);
  } catch (err) {
    throw new ConfigError(`--ca-dir ${dir}: ${(err as Error).message}`);
  }
  const { cert, bundle } = authority.files;
  process.stdout.write(`# loops-mock CA in ${dir}\nCA_CERT=${cert}\nCA_BUNDLE=${bundle}\n${authority.pem}`);
}

const EXPORT_USAGE = `Usage: loops-mock export-model BASE_MODEL DIR [--tokenizer NAME=PATH]
  Writes the tiny base model behind BASE_MODEL as a Hugging Face model folder: config.json
  (LlamaForCausalLM), generation_config.json, model.safetensors (the engine's own seeded
  weights) and the tokenizer files; the same files the Hub mirror serves in BASE_MODEL's repo.
  AutoModelForCausalLM.from_pretrained(DIR) then computes the mock's logprobs.`;

/** `loops-mock export-model`: the Hub mirror's files of one repo, written to a folder. */
async function exportModel(argv: string[]): Promise<void> {
  if (asksForHelp(argv)) {
    process.stdout.write(`${EXPORT_USAGE}\n`);
    return;
  }
  const { flags, positionals } = parseFlags(
    argv,
    { tokenizer: { type: 'string', multiple: true } },
    { error: (message) => new ConfigError(message), allowPositionals: true, unknownFlagSuffix: ' for export-model' },
  );
  const [model, dir, ...extra] = positionals;
  if (!model || !dir || extra.length) throw new ConfigError('export-model needs BASE_MODEL and DIR, e.g. loops-mock export-model Qwen/Qwen3.5-2B ./tiny-qwen');
  if (!findBaseModel(model)) throw new ConfigError(`'${model}' is not a supported base model; supported: ${supportedModelNames().join(', ')}`);
  const overrides = new Map<string, string>();
  for (const { value } of flags) {
    const eq = value.indexOf('=');
    if (eq <= 0 || eq === value.length - 1) throw new ConfigError(`--tokenizer must be NAME=PATH, got '${value}'`);
    overrides.set(value.slice(0, eq), value.slice(eq + 1));
  }
  let tokenizers: Tokenizers;
  try {
    tokenizers = new Tokenizers(overrides);
  } catch (err) {
    throw new ConfigError((err as Error).message);
  }
  const engines = new EnginePool(tokenizers);
  try {
    process.stdout.write(`# making ${model}'s files (the weights take a moment)\n`);
    const hub = new HubRepos(engines);
    const repo = hub.repo(model);
    const out = resolve(dir);
    try {
      mkdirSync(out, { recursive: true });
      for (const f of repo.files) {
        writeFileSync(join(out, f.name), hub.content(repo, f));
        process.stdout.write(`${join(out, f.name)}  ${(f.size / 1e6).toFixed(1)} MB\n`);
      }
    } catch (err) {
      throw new ConfigError(`cannot write into ${out}: ${(err as Error).message}`);
    }
    process.stdout.write(`# ${model}: ${repo.files.length} files in ${out} (revision ${repo.sha})\n`);
  } finally {
    await engines.close();
  }
}

/**
 * Says in the server log whether the launcher's memory settings (bin/loops-mock.js: --expose-gc and
 * MALLOC_MMAP_THRESHOLD_) are in effect here; without them memory comes back after a burst late or never.
 */
function logMemorySettings(log: { info(message: string): void; warn(message: string): void }): void {
  const gc = typeof (globalThis as { gc?: unknown }).gc === 'function';
  const threshold = process.env.MALLOC_MMAP_THRESHOLD_;
  if (gc && threshold !== undefined) {
    log.info(`runtime memory settings: --expose-gc, MALLOC_MMAP_THRESHOLD_=${threshold}`);
    return;
  }
  const missing = [gc ? '' : '--expose-gc', threshold === undefined ? 'MALLOC_MMAP_THRESHOLD_' : ''].filter(Boolean).join(' and ');
  log.warn(
    `runtime memory settings missing (${missing}): memory returns to the system slowly after bursts; start the server as loops-mock or node bin/loops-mock.js, which set them`,
  );
}

/**
 * How long after the process started the ready line may wait for the default model's warm-up (about half a second
 * after the server listens on two idle cores): past it, the line is printed and the warm-up goes on behind the first requests.
 */
const WARM_BY_MS = 2000;

/** The engines warming from before the server started: a start that fails stops them before exiting. */
let earlyWarming: EnginesWarming | undefined;

/**
 * Stops the warm-up and the engines' worker threads: exiting while onnxruntime runs a graph on one hangs or aborts
 * the process, so a refused start (a bad flag, a taken port, a damaged data dir) waits for the run in flight.
 * Bounded: a worker that does not stop within 10 s is left to the exit.
 */
async function stopEarlyEngines(): Promise<void> {
  const warming = earlyWarming;
  if (!warming) return;
  warming.stop();
  const stopped = (async () => {
    await warming.done;
    await warming.engines.close();
  })();
  await Promise.race([stopped, new Promise((resolve) => setTimeout(resolve, 10_000).unref())]);
}

/** `loops-mock [serve] [flags]`: starts the server and prints the variables a Loops client needs. */
async function main(argv: string[]): Promise<void> {
  if (argv[0] === 'record') return record(argv.slice(1));
  if (argv[0] === 'ca') return ca(argv.slice(1));
  if (argv[0] === 'export-model') return exportModel(argv.slice(1));
  const args = argv[0] === 'serve' ? argv.slice(1) : argv;
  if (asksForHelp(args)) {
    process.stdout.write(`${usage()}\n`);
    return;
  }
  if (args.includes('--version')) {
    process.stdout.write(`loops-mock ${VERSION} (tracks the Baseten Loops API ${LOOPS_API_VERSION})\n`);
    return;
  }
  if (args[0] !== undefined && !args[0].startsWith('-'))
    throw new ConfigError(`unknown command '${args[0]}' (the commands are 'serve', 'record', 'ca' and 'export-model')`);
  const options = parseOptions(args, process.env);
  // The engines' warm-up begins before the server's modules load (a third of a second on two cores): the
  // graphs build on the engine's worker thread meanwhile, so that a client sent at the ready line finds them.
  const warming = await startEngines(options);
  earlyWarming = warming;
  const { startWithOptions } = await import('./index.js');
  // --write-env is written by the server once it listens and, with warmBy, is warm (server/index.ts).
  let stopping = false;
  // The server listens before its ready line (which waits for the warm-up): a signal meanwhile stops it gracefully
  // once started, rather than ending the process outright.
  const signals = holdSignals();
  const server = await startWithOptions(options, { warming, warmBy: WARM_BY_MS, onParentGone: () => stop('its parent process gone') });
  logMemorySettings(server.app.log);
  const lines = Object.entries(server.env).map(([k, v]) => `${k}=${v}`);
  const notes = [`# loops-mock ${VERSION} listening on ${server.url}${options.dataDir ? `, state in ${options.dataDir}` : ', state in memory'}`];
  notes.push(...server.notes.map((n) => `# ${n}`));
  if (server.ca)
    notes.push(
      `# proxy mode: HTTPS_PROXY intercepts api.baseten.co, *.api.baseten.co, app.baseten.co and huggingface.co with the CA ${server.ca.cert}${options.proxyPassthrough.length ? `; passes through ${options.proxyPassthrough.join(', ')}` : ''}; other hosts are refused`,
    );
  const dashboardAccess =
    options.apiKeys.length === 0
      ? options.admin
        ? ''
        : ' (read-only: --admin adds controls)'
      : options.adminToken
        ? ' (sign in with the admin token)'
        : ' (refused: with --api-key it needs --admin-token)';
  notes.push(`# dashboard: ${server.url}/_mock/ui${dashboardAccess}`);
  if (options.admin)
    notes.push(
      `# admin API at ${server.url}/_mock/${options.adminToken ? ' (Authorization: Bearer <admin token>)' : ''}; clock ${options.clockMode}${options.scenario ? `; scenario ${options.scenario} applied` : ''}`,
    );
  // Before the variables: a client that reads them and stops the server at once gets a graceful stop.
  signals.handTo(stop);
  const early = signals.early();
  if (early) stop(early);
  process.stdout.write(`${lines.join('\n')}\n${notes.join('\n')}\n`);
  // After the ready line: what the client waits for comes first.
  setImmediate(() => {
    flushNodeCompileCache();
    removeRetiredEntries(cacheDirOption(options.cacheDir));
  });

  // Hoisted: the parent watch may call it. Exits once the engines stopped: never while onnxruntime runs a warm-up graph.
  function stop(signal: string): void {
    if (stopping) {
      process.stderr.write(`loops-mock: ${signal} again, exiting without waiting\n`);
      process.exit(1);
    }
    stopping = true;
    server.enginesClosed().then(
      () => process.exit(0),
      (err: unknown) => {
        process.stderr.write(`loops-mock: error while shutting down: ${String(err)}\n`);
        process.exit(1);
      },
    );
  }
}

main(process.argv.slice(2)).catch(async (err: unknown) => {
  await stopEarlyEngines().catch(() => undefined);
  if (err instanceof ConfigError) {
    process.stderr.write(`loops-mock: ${err.message} (see loops-mock --help)\n`);
    process.exit(2);
  }
  // The data dir's state cannot be used as it is, or this Node has no SQLite: one line naming the fault and the way out.
  if (err instanceof DataDirError || err instanceof SqliteUnavailableError) {
    process.stderr.write(`loops-mock: ${err.message}\n`);
    process.exit(2);
  }
  const code = (err as { code?: string }).code;
  if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
    process.stderr.write(`loops-mock: cannot listen: ${(err as Error).message} (choose another --port or --host)\n`);
    process.exit(2);
  }
  process.stderr.write(`loops-mock: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
