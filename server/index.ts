import { appendFileSync } from 'node:fs';
import type { FastifyBaseLogger, FastifyInstance } from 'fastify';
import { EnginePool, findBaseModel, probeDevice, Tokenizers, warmTrainingLoop } from '../models/index.js';
import { ConfigError, DEFAULTS, liveSettingsOf, type ServerOptions } from './config.js';
import { LoopsCore } from './core/core.js';
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

export { ManualClock, RealClock, type Clock } from './core/clock.js';
export { LoopsCore, type CoreOptions } from './core/core.js';
export { buildApp } from './app.js';
export { parseOptions, ConfigError, DEFAULTS, type ServerOptions } from './config.js';
export { VERSION } from './version.js';
export { MockAdmin, MockAdminError } from './admin/client.js';
export { directUrls, type PublicUrls } from './http/public-urls.js';
export { basetenUrls } from './proxy/baseten-hosts.js';
export { defaultCaDir, LocalCa } from './proxy/ca.js';

/** The key `startServer` and the CLI hand out when no --api-key is configured; any non-empty key works then. */
export const DEFAULT_API_KEY = 'loops-mock-local-key';

export interface StartOptions extends Partial<ServerOptions> {
  /** A clock to drive time by hand in tests (ManualClock). */
  clock?: Clock;
  /** Model engines to share between servers (graphs built once); the caller closes them. */
  engines?: EnginePool;
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
  /** Stops accepting, lets requests in flight finish, then closes storage. */
  close(): Promise<void>;
}

/**
 * The engine pool, its tokenizer overrides and device checked up front, so a
 * bad --tokenizer or an unusable --device fails the start, not a later request.
 */
async function prepareEngines(options: ServerOptions): Promise<EnginePool> {
  const overrides = new Map<string, string>();
  for (const [model, path] of Object.entries(options.tokenizers)) {
    if (!findBaseModel(model)) throw new ConfigError(`--tokenizer ${model}=${path}: '${model}' is not a supported base model (see GET /v1/loops/capabilities)`);
    overrides.set(model, path);
  }
  let tokenizers: Tokenizers;
  try {
    tokenizers = new Tokenizers(overrides);
    for (const model of overrides.keys()) tokenizers.get(model);
  } catch (err) {
    throw new ConfigError(`${(err as Error).message}`);
  }
  try {
    await probeDevice(options.device);
  } catch (err) {
    throw new ConfigError(`--device ${options.device}: ${(err as Error).message}`);
  }
  return new EnginePool(tokenizers, { device: options.device, unembeddingRank: options.unembeddingRank, batchRuns: options.batchRuns });
}

/** Builds and runs each model's graphs once (ModelEngine.warmUp); a failure is logged, never fatal: the first request would build them again. */
async function warmEngines(engines: EnginePool, models: string[], log: FastifyBaseLogger): Promise<void> {
  for (const model of models) {
    const started = performance.now();
    try {
      await engines.get(model).warmUp();
      await warmTrainingLoop(engines.get(model));
      // Stop strings are matched on decoded text: the decoder is loaded now too, not in a client's first sample.
      engines.sampleCodec(model).decode([0]);
      log.info(`${model}: engine warm (--warm) in ${((performance.now() - started) / 1000).toFixed(1)} s`);
    } catch (err) {
      log.warn(`${model}: warming the engine failed (its first request builds it instead): ${(err as Error).message}`);
    }
  }
}

/** Starts a loops-mock server. Options are the CLI flags in camelCase; `port: 0` picks a free port. */
export async function startServer(overrides: StartOptions = {}): Promise<RunningServer> {
  const options: ServerOptions = { ...DEFAULTS, ...overrides, apiKeys: overrides.apiKeys ?? [], tokenizers: overrides.tokenizers ?? {}, weightSyncDelayMs: overrides.weightSyncDelayMs ?? DEFAULTS.weightSyncDelayMs };
  const engines = overrides.engines ?? await prepareEngines(options);
  if (options.journalFile) {
    try {
      appendFileSync(options.journalFile, '');
    } catch (err) {
      throw new ConfigError(`--journal ${options.journalFile}: cannot append to it (${(err as Error).message})`);
    }
  }
  // Without the admin API nothing could move a virtual clock: say so rather than let every timeout hang.
  if (options.clockMode === 'virtual' && !options.admin && !overrides.clock) throw new ConfigError('--clock virtual needs --admin: only POST /_mock/clock/advance moves virtual time');
  // With keys the server is meant to be guarded: an admin API without its own token would let anyone reset it or read the journal.
  if (options.admin && options.apiKeys.length > 0 && options.adminToken === undefined) throw new ConfigError('--admin with --api-key needs --admin-token TOKEN: without it anyone who reaches the port could reset the server or read its journal, with no key at all');
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
  const core = new LoopsCore({
    engines,
    dataDir: options.dataDir,
    apiKeys: options.apiKeys,
    clock: overrides.clock ?? (options.clockMode === 'virtual' ? new ManualClock(Date.now()) : undefined),
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
    if (options.publicUrl) throw new ConfigError('--public-url does not go with --proxy: in proxy mode base_url fields are Baseten\'s own URLs');
    const caDir = options.caDir ?? defaultCaDir();
    let ca: LocalCa;
    try {
      ca = LocalCa.open(caDir);
    } catch (err) {
      throw new ConfigError(`--ca-dir ${caDir}: ${(err as Error).message}`);
    }
    proxy = new ForwardProxy(core, { ca, passthrough: options.proxyPassthrough });
  }
  let app: FastifyInstance;
  try {
    app = await buildApp(core, { ...options, urls: proxy ? basetenUrls() : directUrls(() => publicUrl), front: proxy });
    await app.listen({ port: options.port, host: options.host });
  } catch (err) {
    core.close();
    throw err;
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  const wildcard = options.host === '0.0.0.0' || options.host === '::';
  const host = wildcard ? '127.0.0.1' : options.host.includes(':') ? `[${options.host}]` : options.host;
  const url = `http://${host}:${port}`;
  publicUrl = proxy ? basetenUrls().root() : options.publicUrl ?? url;
  const apiKey = options.apiKeys[0]?.key ?? DEFAULT_API_KEY;
  const ca = proxy?.caFiles;
  // Proxy mode prints no LOOPS_BASE_URL: the clients it is for keep Baseten's URLs (the guide's script refuses to run with it).
  const env: Record<string, string> = ca
    ? { BASETEN_API_KEY: apiKey, HTTPS_PROXY: url, SSL_CERT_FILE: ca.bundle, REQUESTS_CA_BUNDLE: ca.bundle, NODE_EXTRA_CA_CERTS: ca.cert }
    : { LOOPS_BASE_URL: publicUrl, BASETEN_API_KEY: apiKey, BASETEN_MANAGEMENT_API_URL_OVERRIDE: publicUrl, HF_ENDPOINT: `${publicUrl}/hf` };
  // After listening: requests that come meanwhile queue behind the warm-up on the engine, as they would behind any step.
  const warming = warmEngines(engines, options.warmModels, app.log);
  compileSchemasSoon();
  let closed: Promise<void> | undefined;
  return {
    url,
    publicUrl,
    apiKey,
    env,
    ...(ca ? { ca } : {}),
    app,
    core,
    close: () => (closed ??= (async () => {
      proxy?.close();
      await app.close();
      await warming;
      unlistenLong();
      await core.drain();
      core.close();
      if (!overrides.engines) await engines.close();
    })()),
  };
}
