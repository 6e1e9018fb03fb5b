import { appendFileSync, chmodSync, writeFileSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import type { EnginePool } from '../models/index.js';
import { ConfigError, liveSettingsOf, type ServerOptions } from './config.js';
import { LoopsCore } from './core/core.js';
import { prepareDataDir, unrecordedNote } from './core/data-dir.js';
import { collectorAfterReleases } from '../models/collect-soon.js';
import type { Clock } from './core/clock.js';
import { applyScenario, parseScenario, readScenarioSource, type ScenarioSpec } from './admin/scenario.js';
import { ManualClock } from './core/clock.js';
import { buildApp } from './app.js';
import { directUrls } from './http/public-urls.js';
import { compileSchemasSoon } from './http/validation.js';
import { basetenUrls } from './proxy/baseten-hosts.js';
import { defaultCaDir, LocalCa } from './proxy/ca.js';
import { ForwardProxy } from './proxy/forward-proxy.js';
import { watchParent } from './parent-watch.js';
import { exposureWarnings } from './http/exposure.js';
import { resolveStartOptions, type StartOptions } from './start-options.js';
import { prepareEngines, warmEngines, type EnginesWarming } from './engine-warm-up.js';

export { ManualClock, RealClock, type Clock } from './core/clock.js';
export { LoopsCore, type CoreOptions } from './core/core.js';
export { buildApp } from './app.js';
export { ConfigError, DEFAULTS, type ServerOptions } from './config.js';
export { parseOptions } from './parse-options.js';
export { LOOPS_API_VERSION, VERSION } from './version.js';
export { MockAdmin, MockAdminError } from './admin/client.js';
export { directUrls, type PublicUrls } from './http/public-urls.js';
export { basetenUrls } from './proxy/baseten-hosts.js';
export { defaultCaDir, LocalCa } from './proxy/ca.js';
export { DEPRECATED_OPTION_NAMES, START_OPTION_NAMES, type StartOptions } from './start-options.js';

/** The key `startServer` and the CLI hand out when no --api-key is configured; any non-empty key works then. */
export const DEFAULT_API_KEY = 'loops-mock-local-key';

/** What the command line passes beside its parsed options. */
export interface StartExtras {
  /** A clock to drive time by hand in tests (ManualClock). */
  clock?: Clock;
  /** Model engines to share between servers (graphs built once); the caller closes them. */
  engines?: EnginePool;
  /** Engines already warming (the command line starts them before loading the server); the server closes them. */
  warming?: EnginesWarming;
  /** With --exit-with-parent: called instead of close() when the parent process is gone (the CLI exits). */
  onParentGone?: () => void;
  /**
   * Resolve (and write --write-env) once the first --warm model is warm, or at this moment (performance.now()) at the
   * latest: the command line's ready line then means a client's first round costs what a later one does.
   */
  warmBy?: number;
}

export interface RunningServer {
  /** Where the server listens, e.g. http://127.0.0.1:8787. */
  url: string;
  /** What base_url fields start with (the public URL). */
  publicUrl: string;
  /** A key that works against this server. */
  apiKey: string;
  /**
   * The variables a client reads, ready to merge into a child process's
   * environment: LOOPS_BASE_URL, BASETEN_API_KEY,
   * BASETEN_MANAGEMENT_API_URL_OVERRIDE and HF_ENDPOINT; in proxy mode
   * BASETEN_API_KEY, HTTPS_PROXY, SSL_CERT_FILE, REQUESTS_CA_BUNDLE and
   * NODE_EXTRA_CA_CERTS instead (a client keeps Baseten's URLs).
   */
  env: Record<string, string>;
  /** Proxy mode's CA files (absent otherwise). */
  ca?: LocalCa['files'];
  app: FastifyInstance;
  core: LoopsCore;
  /** What the start found and did in the data dir (state set aside, records rebuilt, entries kept that no record names), one line each. */
  notes: string[];
  /** Whether the background warm-up (--warm) is still building the engines: /healthz says so. */
  engine(): 'warming' | 'ready';
  /**
   * Stops accepting, lets requests in flight finish, then closes storage. It does not wait for the
   * warm-up: that stops at its next step, and the engines close after it (enginesClosed).
   */
  close(): Promise<void>;
  /**
   * Resolves once close() is done and the engines have stopped too (after a warm-up graph run in
   * flight, which cannot be cut short). A process that exits right after close() waits on this.
   */
  enginesClosed(): Promise<void>;
}

/** A start on a full data dir serves reads; it says so, with the last refusal (writes resume once there is room). */
function fullDiskNote(core: LoopsCore): string[] {
  const b = core.store.background;
  return b.isFailing ? [`the data dir refused writes at start (${b.lastMessage}); reads are served, writes answer 507 until there is room`] : [];
}

/**
 * Starts a loops-mock server. Options are the flags of `loops-mock serve` in camelCase (`warm: 'none'`,
 * `clock: 'virtual'`, `port: 0` for a free port), as flag text or typed; an unknown one is a ConfigError
 * naming the nearest (server/start-options.ts).
 */
export async function startServer(given: StartOptions = {}): Promise<RunningServer> {
  const { options, clock, engines } = resolveStartOptions(given);
  return startWithOptions(options, { clock, engines });
}

/** Starts a server from options as parseOptions gives them (the command line's way in). */
export async function startWithOptions(options: ServerOptions, extras: StartExtras = {}): Promise<RunningServer> {
  const engines = extras.warming?.engines ?? extras.engines ?? (await prepareEngines(options));
  if (options.journalFile) {
    try {
      appendFileSync(options.journalFile, '');
    } catch (err) {
      throw new ConfigError(`--journal ${options.journalFile}: cannot append to it (${(err as Error).message})`);
    }
  }
  // Checked before the server starts, so that a path that cannot be written fails the start with one line.
  if (options.writeEnv) {
    try {
      appendFileSync(options.writeEnv, '');
    } catch (err) {
      throw new ConfigError(`--write-env ${options.writeEnv}: cannot write it (${(err as Error).message})`);
    }
  }
  // Without the admin API nothing could move a virtual clock: say so rather than let every timeout hang.
  if (options.clockMode === 'virtual' && !options.admin && !extras.clock)
    throw new ConfigError('--clock virtual needs --admin: only POST /_mock/clock/advance moves virtual time');
  // With keys the server is meant to be guarded: an admin API without its own token would let anyone reset it or read the journal.
  if (options.admin && options.apiKeys.length > 0 && options.adminToken === undefined)
    throw new ConfigError(
      '--admin with --api-key needs --admin-token TOKEN: without it anyone who reaches the port could reset the server or read its journal, with no key at all',
    );
  // Read before anything starts, so a bad scenario fails the start with its line.
  let scenario: ScenarioSpec | undefined;
  if (options.scenario) {
    try {
      const { text, source } = readScenarioSource(options.scenario);
      scenario = parseScenario(text, source);
    } catch (err) {
      throw new ConfigError(`--scenario ${options.scenario}: ${(err as Error).message}`);
    }
  }
  if ((options.dataDirFresh || options.rebuildRecords) && !options.dataDir)
    throw new ConfigError(`--${options.dataDirFresh ? 'data-dir-fresh' : 'rebuild-records'} needs --data-dir DIR: it acts on that folder's state`);
  if (options.dataDirFresh && options.rebuildRecords)
    throw new ConfigError(
      '--data-dir-fresh and --rebuild-records do not go together: fresh sets every checkpoint aside, rebuild keeps them and gives them their records back',
    );
  // Before the core opens the data dir: a missing or unreadable database beside checkpoint folders stops the start (server/core/data-dir.ts).
  const dataDirNotes = options.dataDir ? prepareDataDir(options.dataDir, { fresh: options.dataDirFresh, rebuildRecords: options.rebuildRecords }).notes : [];
  const core = new LoopsCore({
    engines,
    dataDir: options.dataDir,
    apiKeys: options.apiKeys,
    clock: extras.clock ?? (options.clockMode === 'virtual' ? new ManualClock(Date.now()) : undefined),
    settings: liveSettingsOf(options),
    presignTtlMs: options.presignTtlSeconds * 1000,
    journalSize: options.journalSize,
    journalFile: options.journalFile,
    journalDetail: options.journalDetail,
    faultSeed: options.faultSeed,
  });
  // Deactivated runs and long sequences leave megabytes of garbage: collected soon after (models/collect-soon.ts).
  const collect = collectorAfterReleases();
  core.fleet.onRunStopped(collect);
  const unlistenLong = engines.onLongSequence(collect);
  if (scenario) {
    const startup = scenario;
    applyScenario(core, startup);
    core.onReset(() => applyScenario(core, startup));
  }
  let publicUrl = options.publicUrl ?? '';
  let proxy: ForwardProxy | undefined;
  if (options.proxy) {
    if (options.publicUrl) throw new ConfigError("--public-url does not go with --proxy: in proxy mode base_url fields are Baseten's own URLs");
    const caDir = options.caDir ?? defaultCaDir();
    let ca: LocalCa;
    try {
      ca = LocalCa.open(caDir);
    } catch (err) {
      throw new ConfigError(`--ca-dir ${caDir}: ${(err as Error).message}`);
    }
    proxy = new ForwardProxy(core, { ca, passthrough: options.proxyPassthrough });
  }
  // Set once the background warm-up (--warm) is over, however it ended; /healthz tells it.
  let warm = false;
  // Begun before the app is built (the command line begins it before even loading this module): the engine's
  // graphs build on its worker thread meanwhile. Requests that come early run in between those builds
  // (models/engine-warm-up.ts).
  const warming = extras.warming ?? warmEngines(engines, options.warmModels);
  const warmed = warming.done.finally(() => {
    warm = true;
  });
  let app: FastifyInstance;
  try {
    // The names the server is started under are its own too: a client reaches it by them (server/http/allowed-hosts.ts).
    const allowedHosts = [...options.allowedHost, options.host, ...(options.publicUrl ? [new URL(options.publicUrl).hostname] : [])];
    app = await buildApp(core, {
      ...options,
      allowedHosts,
      urls: proxy ? basetenUrls() : directUrls(() => publicUrl),
      front: proxy,
      engine: () => (warm ? 'ready' : 'warming'),
      graphBuildsLogged: true,
    });
    // The proxy's limits (refused handshakes) are the operator's to see.
    proxy?.onWarning((message) => app.log.warn(message));
    await app.listen({ port: options.port, host: options.host });
  } catch (err) {
    core.close();
    warming.stop();
    if (!extras.engines) void warmed.then(() => engines.close());
    throw err;
  }
  warming.logTo(app.log);
  // Proxy mode or an open admin API on an address other machines reach: said, not refused (a trusted network may want it).
  for (const warning of exposureWarnings({ host: options.host, proxy: options.proxy, admin: options.admin, adminToken: options.adminToken }))
    app.log.warn(warning);
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  const wildcard = options.host === '0.0.0.0' || options.host === '::';
  const host = wildcard ? '127.0.0.1' : options.host.includes(':') ? `[${options.host}]` : options.host;
  const url = `http://${host}:${port}`;
  publicUrl = proxy ? basetenUrls().root() : (options.publicUrl ?? url);
  const apiKey = options.apiKeys[0]?.key ?? DEFAULT_API_KEY;
  const ca = proxy?.caFiles;
  // Proxy mode prints no LOOPS_BASE_URL: the clients it is for keep Baseten's URLs (the guide's script refuses to run with it).
  const env: Record<string, string> = ca
    ? { BASETEN_API_KEY: apiKey, HTTPS_PROXY: url, SSL_CERT_FILE: ca.bundle, REQUESTS_CA_BUNDLE: ca.bundle, NODE_EXTRA_CA_CERTS: ca.cert }
    : { LOOPS_BASE_URL: publicUrl, BASETEN_API_KEY: apiKey, BASETEN_MANAGEMENT_API_URL_OVERRIDE: publicUrl, HF_ENDPOINT: `${publicUrl}/hf` };
  if (extras.warmBy === undefined) compileSchemasSoon();
  else {
    // Waiting on the engine's worker, this thread compiles the routes' schemas, which would otherwise compile in a
    // client's first requests.
    compileSchemasSoon(0);
    await Promise.race([warming.firstDone, new Promise((resolve) => setTimeout(resolve, Math.max(0, extras.warmBy! - performance.now())).unref())]);
  }
  // Owner-only: it holds BASETEN_API_KEY (the mode applies to a new file; an existing one is narrowed too).
  if (options.writeEnv) {
    writeFileSync(
      options.writeEnv,
      `${Object.entries(env)
        .map(([k, v]) => `${k}=${v}`)
        .join('\n')}\n`,
      { mode: 0o600 },
    );
    chmodSync(options.writeEnv, 0o600);
  }
  let closed: Promise<void> | undefined;
  let enginesClosed: Promise<void> | undefined;
  let stopWatching = () => {};
  const close = () =>
    (closed ??= (async () => {
      stopWatching();
      warming.stop();
      proxy?.close();
      await app.close();
      unlistenLong();
      await core.drain();
      core.close();
    })());
  const closeEngines = () =>
    (enginesClosed ??= (async () => {
      await close();
      await warmed;
      if (!extras.engines) await engines.close();
    })());
  if (options.exitWithParent) {
    stopWatching = watchParent(() => {
      app.log.warn('the parent process is gone (--exit-with-parent): stopping');
      if (extras.onParentGone) extras.onParentGone();
      else void closeEngines();
    });
  }
  return {
    url,
    publicUrl,
    apiKey,
    env,
    ...(ca ? { ca } : {}),
    app,
    core,
    notes: options.dataDir ? [...dataDirNotes, ...unrecordedNote(options.dataDir, core.checkpoints.recovery.unrecorded), ...fullDiskNote(core)] : [],
    engine: () => (warm ? 'ready' : 'warming'),
    close,
    enginesClosed: closeEngines,
  };
}
