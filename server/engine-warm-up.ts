/** The model engines a server starts with, and their warm-up (--warm), begun before the HTTP side is even loaded. */
import { defaultHfCache, EnginePool, findBaseModel, probeDevice, Tokenizers, warmTrainerCode, type GraphBuildEvent } from '../models/index.js';
import { cacheDirOption } from './cache-dir.js';
import { ConfigError, type ServerOptions } from './config.js';

/** The log line of a graph kind's first build, for a person waiting on it. */
export function graphBuildLine(e: GraphBuildEvent): string {
  const rows = e.mixed ? ' for rows of several runs' : '';
  const seconds = ((e.ms ?? 0) / 1000).toFixed(1);
  if (e.ahead)
    return e.phase === 'start'
      ? `${e.model}: building the '${e.kind}' graph (warm-up)`
      : `${e.model}: '${e.kind}' graph ready (${seconds} s to build, ahead of its first use)`;
  return e.phase === 'start'
    ? `${e.model}: building the '${e.kind}' graph${rows} (first use; a moment)`
    : `${e.model}: '${e.kind}' graph${rows} ready (${seconds} s with its first run)`;
}

/** Where the warm-up's lines go: the server's log once it exists, held until then. */
interface WarmUpLog {
  info(message: string): void;
  warn(message: string): void;
}

/** Engines being warmed: started by the command line before the server's modules load, or by startWithOptions. */
export interface EnginesWarming {
  engines: EnginePool;
  /** Settles when every model's warm-up is over, however it ended. */
  done: Promise<void>;
  /** Settles when the first model's warm-up is over (the default model's, as the command line starts it), or at once with none. */
  firstDone: Promise<void>;
  /** Stops the warm-up at its next step, and the graph builds' lines (the server closing). */
  stop(): void;
  /** From now on the warm-up's lines, and each graph kind's first build, go to `log`; lines said before are handed to it first. */
  logTo(log: WarmUpLog): void;
}

/**
 * The engine pool, its tokenizer overrides and device checked up front, so a
 * bad --tokenizer or an unusable --device fails the start, not a later request.
 */
export async function prepareEngines(
  options: Pick<ServerOptions, 'tokenizers' | 'device' | 'unembeddingRank' | 'batchRuns' | 'cacheDir'>,
): Promise<EnginePool> {
  const overrides = new Map<string, string>();
  for (const [model, path] of Object.entries(options.tokenizers)) {
    if (!findBaseModel(model)) throw new ConfigError(`--tokenizer ${model}=${path}: '${model}' is not a supported base model (see GET /v1/loops/capabilities)`);
    overrides.set(model, path);
  }
  const cacheDir = cacheDirOption(options.cacheDir);
  let tokenizers: Tokenizers;
  try {
    tokenizers = new Tokenizers(overrides, defaultHfCache(), cacheDir);
    for (const model of overrides.keys()) tokenizers.get(model);
  } catch (err) {
    throw new ConfigError(`${(err as Error).message}`);
  }
  try {
    await probeDevice(options.device);
  } catch (err) {
    throw new ConfigError(`--device ${options.device}: ${(err as Error).message}`);
  }
  return new EnginePool(tokenizers, {
    device: options.device,
    unembeddingRank: options.unembeddingRank,
    batchRuns: options.batchRuns,
    cacheDir,
  });
}

/**
 * Starts building each model's graphs (ModelEngine.warmUp, on the engine's worker thread, so they build while
 * this thread loads and starts the server), then, once the server listens, loads the stop-string decoder and
 * runs the trainer's code that needs no graph (warmTrainerCode) on this thread meanwhile. A failure is logged,
 * never fatal: the first request would build them again.
 */
export function warmEngines(engines: EnginePool, models: string[]): EnginesWarming {
  const held: [keyof WarmUpLog, string][] = [];
  let log: WarmUpLog = { info: (m) => held.push(['info', m]), warn: (m) => held.push(['warn', m]) };
  const stopping = new AbortController();
  // Told from the start: the first builds happen before the server's log exists.
  const unlisten = engines.onGraphBuild((e) => log.info(graphBuildLine(e)));
  let firstOver = () => {};
  const firstDone = new Promise<void>((resolve) => {
    firstOver = resolve;
  });
  // This thread's part of the warm-up waits until the server listens (logTo): until then it loads the server.
  let listening = () => {};
  const listened = new Promise<void>((resolve) => {
    listening = resolve;
  });
  const done = (async () => {
    for (const model of models) {
      const started = performance.now();
      try {
        const engine = engines.get(model);
        await Promise.all([
          engine.warmUp(stopping.signal),
          (async () => {
            await listened;
            if (stopping.signal.aborted) return;
            // Stop strings are matched on decoded text: the decoder is loaded now too, not in a client's first sample.
            engines.sampleCodec(model).decode([0]);
            warmTrainerCode(engine);
          })(),
        ]);
        if (stopping.signal.aborted) return;
        log.info(`${model}: engine warm (--warm) in ${((performance.now() - started) / 1000).toFixed(1)} s`);
      } catch (err) {
        if (stopping.signal.aborted) return;
        log.warn(`${model}: warming the engine failed (its first request builds it instead): ${(err as Error).message}`);
      } finally {
        firstOver();
      }
    }
  })().finally(firstOver);
  return {
    engines,
    done,
    firstDone,
    stop: () => {
      stopping.abort();
      // A start that fails never listens: this thread's part must still end, or `done` would never settle.
      listening();
      unlisten();
    },
    logTo(next) {
      log = next;
      listening();
      for (const [level, message] of held.splice(0)) next[level](message);
    },
  };
}

/** The engines for `options`, their warm-up begun. */
export async function startEngines(options: ServerOptions): Promise<EnginesWarming> {
  return warmEngines(await prepareEngines(options), options.warmModels);
}
