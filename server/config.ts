import type { ApiKeySpec } from './core/accounts.js';
import { DEFAULT_UNEMBEDDING_RANK } from '../models/transformer.js';
import { MAX_LORA_RANK } from './core/fleet.js';

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevelName = (typeof LOG_LEVELS)[number];

/** Everything the server can be told, by flag, environment variable or the programmatic API. */
export interface ServerOptions {
  port: number;
  host: string;
  /** The URL put into `base_url` fields; defaults to where the server listens. */
  publicUrl?: string;
  /** Durable state lives here; without it, in memory. */
  dataDir?: string;
  /** When non-empty, only these keys are accepted. */
  apiKeys: ApiKeySpec[];
  logLevel: LogLevelName;
  /** Largest request body, in bytes. */
  bodyLimit: number;
  /** How long new trainers and samplers take to become ready. */
  coldStartMs: number;
  /** How long a sampler stays DEACTIVATING. */
  deactivationMs: number;
  /** Replicas of each new sampler. */
  samplerReplicas: number;
  /** Lifetime of presigned checkpoint-file URLs. */
  presignTtlSeconds: number;
  /** Per-replica delay before a published adapter goes live (the last value repeats). */
  weightSyncDelayMs: number[];
  /** How long a sampling request below its version floor waits before 408. */
  floorWaitMs: number;
  /** Long-poll window of operation polls (under the clients' 30 s). */
  longPollMs: number;
  /** How long a finished operation's result stays retrievable. */
  operationTtlMs: number;
  /** Where the model engine computes: cpu, or cuda where onnxruntime-node has its CUDA provider. */
  device: 'cpu' | 'cuda';
  /** Largest LoRA rank on the unembedding; a run's rank above it is capped there (see DEFAULT_UNEMBEDDING_RANK). */
  unembeddingRank: number;
  /** Model name → a tokenizer.json (or its folder) to use instead of the built-in one. */
  tokenizers: Record<string, string>;
  /** Serve the admin API under /_mock/. */
  admin: boolean;
  /** When set, the admin API needs `Authorization: Bearer <token>`. */
  adminToken?: string;
  /** real: the wall clock; virtual: time stands still until POST /_mock/clock/advance moves it. */
  clockMode: 'real' | 'virtual';
  /** Requests the journal keeps in memory, and a file it also appends them to (NDJSON). */
  journalSize: number;
  journalFile?: string;
  /** summary: bodies cut to a few items; full: whole request and response bodies. */
  journalDetail: 'summary' | 'full';
  /** A scenario file (JSON or YAML) or the name of a shipped one, applied at start. */
  scenario?: string;
  /** Seed of fault rules that give none. */
  faultSeed: number;
}

export const DEFAULTS: ServerOptions = {
  port: 8787,
  host: '127.0.0.1',
  apiKeys: [],
  logLevel: 'warn',
  bodyLimit: 32 * 1024 * 1024,
  coldStartMs: 0,
  deactivationMs: 0,
  samplerReplicas: 1,
  presignTtlSeconds: 3600,
  device: 'cpu',
  unembeddingRank: DEFAULT_UNEMBEDDING_RANK,
  tokenizers: {},
  weightSyncDelayMs: [0],
  floorWaitMs: 2000,
  longPollMs: 25_000,
  operationTtlMs: 600_000,
  admin: false,
  clockMode: 'real',
  journalSize: 10_000,
  journalDetail: 'summary',
  faultSeed: 1,
};

export class ConfigError extends Error {}

type Setter = (options: ServerOptions, value: string) => void;

interface FlagSpec {
  help: string;
  set: Setter;
  repeatable?: boolean;
  /** A switch: `--flag` alone means true; `--flag=false` (or env 0/false) turns it off. */
  boolean?: boolean;
}

function truth(flag: string, value: string): boolean {
  if (/^(1|true|yes|on)$/i.test(value)) return true;
  if (/^(0|false|no|off)$/i.test(value)) return false;
  throw new ConfigError(`--${flag} is a switch: give it alone, or as --${flag}=true / --${flag}=false, got '${value}'`);
}

function integer(flag: string, min: number, max: number): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(n) || n < min || n > max) throw new ConfigError(`--${flag} must be a whole number from ${min} to ${max}, got '${value}'`);
    return n;
  };
}

export function parseApiKey(value: string): ApiKeySpec {
  const [key, org, team, ...rest] = value.split(':');
  if (!key || rest.length || org === '' || team === '') throw new ConfigError(`--api-key must be KEY, KEY:ORG or KEY:ORG:TEAM with no empty part, got '${value}'`);
  return { key, org, team };
}

export const FLAGS: Record<string, FlagSpec> = {
  port: { help: 'port to listen on; 0 picks a free one (default 8787)', set: (o, v) => { o.port = integer('port', 0, 65535)(v); } },
  host: { help: 'address to listen on (default 127.0.0.1)', set: (o, v) => { if (!v) throw new ConfigError('--host must not be empty'); o.host = v; } },
  'public-url': {
    help: 'URL put into base_url fields (default: where the server listens)',
    set: (o, v) => {
      let url: URL;
      try { url = new URL(v); } catch { throw new ConfigError(`--public-url must be an absolute http(s) URL, got '${v}'`); }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigError(`--public-url must use http or https, got '${v}'`);
      o.publicUrl = v.replace(/\/+$/, '');
    },
  },
  'data-dir': { help: 'folder for durable state (default: state lives in memory)', set: (o, v) => { if (!v) throw new ConfigError('--data-dir must not be empty'); o.dataDir = v; } },
  'api-key': { help: 'KEY[:ORG[:TEAM]]; repeatable; when given, only these keys are accepted', repeatable: true, set: (o, v) => { o.apiKeys.push(...v.split(',').map(parseApiKey)); } },
  'log-level': {
    help: `server log level on stderr: ${LOG_LEVELS.join(', ')} (default warn)`,
    set: (o, v) => { if (!(LOG_LEVELS as readonly string[]).includes(v)) throw new ConfigError(`--log-level must be one of ${LOG_LEVELS.join(', ')}, got '${v}'`); o.logLevel = v as LogLevelName; },
  },
  'body-limit': { help: 'largest request body in bytes (default 33554432)', set: (o, v) => { o.bodyLimit = integer('body-limit', 1024, 2 ** 31)(v); } },
  'cold-start-ms': { help: 'time for a new trainer or sampler to become ready (default 0)', set: (o, v) => { o.coldStartMs = integer('cold-start-ms', 0, 86_400_000)(v); } },
  'deactivation-ms': { help: 'time a sampler stays DEACTIVATING (default 0)', set: (o, v) => { o.deactivationMs = integer('deactivation-ms', 0, 86_400_000)(v); } },
  'sampler-replicas': { help: 'replicas per sampler (default 1)', set: (o, v) => { o.samplerReplicas = integer('sampler-replicas', 1, 64)(v); } },
  'weight-sync-delay-ms': {
    help: 'delay before a sampler replica makes published weights live; a comma list gives each replica its own (default 0)',
    set: (o, v) => { o.weightSyncDelayMs = v.split(',').map((x) => integer('weight-sync-delay-ms', 0, 86_400_000)(x.trim())); },
  },
  'floor-wait-ms': { help: 'how long a sampling request below X-Min-Policy-Version waits for a replica before 408 (default 2000)', set: (o, v) => { o.floorWaitMs = integer('floor-wait-ms', 0, 600_000)(v); } },
  'long-poll-ms': { help: 'long-poll window of GET .../operations/{id}, then 408 (default 25000, below 30000)', set: (o, v) => { o.longPollMs = integer('long-poll-ms', 1, 29_999)(v); } },
  'operation-ttl-ms': { help: 'how long a finished operation stays retrievable, then 404 (default 600000)', set: (o, v) => { o.operationTtlMs = integer('operation-ttl-ms', 1, 7 * 86_400_000)(v); } },
  device: {
    help: 'where the model engine computes: cpu (default) or cuda (needs onnxruntime-node\'s CUDA provider)',
    set: (o, v) => { if (v !== 'cpu' && v !== 'cuda') throw new ConfigError(`--device must be cpu or cuda, got '${v}'`); o.device = v; },
  },
  'unembedding-rank': {
    help: `largest LoRA rank on the unembedding (lm_head), 1..128; a run's lora_rank above it is capped there, as adapter_config.json's rank_pattern says (default ${DEFAULT_UNEMBEDDING_RANK}: rank × vocabulary floats per adapter)`,
    set: (o, v) => { o.unembeddingRank = integer('unembedding-rank', 1, MAX_LORA_RANK)(v); },
  },
  tokenizer: {
    help: 'NAME=PATH: use the tokenizer.json at PATH (a file or its folder) for base model NAME; repeatable',
    repeatable: true,
    set: (o, v) => {
      for (const pair of v.split(',')) {
        const eq = pair.indexOf('=');
        if (eq <= 0 || eq === pair.length - 1) throw new ConfigError(`--tokenizer must be NAME=PATH, e.g. Qwen/Qwen3-8B=./tokenizer.json, got '${pair}'`);
        o.tokenizers = { ...o.tokenizers, [pair.slice(0, eq)]: pair.slice(eq + 1) };
      }
    },
  },
  admin: { help: 'serve the admin API under /_mock/ (faults, journal, scenarios, clock; see docs/admin.md)', boolean: true, set: (o, v) => { o.admin = truth('admin', v); } },
  'admin-token': { help: 'require Authorization: Bearer TOKEN on the admin API', set: (o, v) => { if (!v) throw new ConfigError('--admin-token must not be empty'); o.adminToken = v; } },
  clock: {
    help: 'real (default), or virtual: time stands still until POST /_mock/clock/advance moves it',
    set: (o, v) => { if (v !== 'real' && v !== 'virtual') throw new ConfigError(`--clock must be real or virtual, got '${v}'`); o.clockMode = v; },
  },
  journal: { help: 'also append every journal entry to this file as NDJSON', set: (o, v) => { if (!v) throw new ConfigError('--journal must not be empty'); o.journalFile = v; } },
  'journal-size': { help: 'requests the journal keeps in memory (default 10000)', set: (o, v) => { o.journalSize = integer('journal-size', 1, 10_000_000)(v); } },
  'journal-detail': {
    help: 'summary (default): bodies cut to a few items; full: whole request and response bodies',
    set: (o, v) => { if (v !== 'summary' && v !== 'full') throw new ConfigError(`--journal-detail must be summary or full, got '${v}'`); o.journalDetail = v; },
  },
  scenario: { help: 'a scenario file (JSON or YAML) or a shipped scenario name, applied at start', set: (o, v) => { if (!v) throw new ConfigError('--scenario must not be empty'); o.scenario = v; } },
  'fault-seed': { help: 'seed of fault rules that give none (default 1)', set: (o, v) => { o.faultSeed = integer('fault-seed', 0, 2 ** 32 - 1)(v); } },
  'presign-ttl-s': { help: 'lifetime of checkpoint download URLs in seconds (default 3600)', set: (o, v) => { o.presignTtlSeconds = integer('presign-ttl-s', 1, 7 * 86400)(v); } },
};

export const envName = (flag: string) => `LOOPS_MOCK_${flag.toUpperCase().replace(/-/g, '_')}`;

/** Options from `LOOPS_MOCK_*` variables, then flags (flags win). Throws ConfigError with a one-line message. */
export function parseOptions(argv: string[], env: NodeJS.ProcessEnv = {}): ServerOptions {
  const options: ServerOptions = { ...DEFAULTS, apiKeys: [], tokenizers: {} };
  for (const [flag, spec] of Object.entries(FLAGS)) {
    const value = env[envName(flag)];
    if (value !== undefined && value !== '') spec.set(options, value);
  }
  let keysFromFlags = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z-]+)(?:=(.*))?$/s.exec(arg);
    if (!m) throw new ConfigError(`unexpected argument '${arg}'`);
    const [, flag, inline] = m as unknown as [string, string, string | undefined];
    const spec = FLAGS[flag];
    if (!spec) throw new ConfigError(`unknown flag --${flag}`);
    const value = spec.boolean ? inline ?? 'true' : inline ?? argv[++i];
    if (value === undefined) throw new ConfigError(`--${flag} needs a value`);
    // Keys given as flags replace those from the environment rather than adding to them.
    if (flag === 'api-key' && !keysFromFlags) { options.apiKeys = []; keysFromFlags = true; }
    spec.set(options, value);
  }
  return options;
}

export function usage(): string {
  const lines = Object.entries(FLAGS).map(([flag, spec]) => `  --${flag.padEnd(18)} ${spec.help}\n  ${''.padEnd(20)} env ${envName(flag)}`);
  return ['Usage: loops-mock [serve] [flags]', '', 'Flags:', ...lines, '  --help              this text', '  --version           print the version'].join('\n');
}
