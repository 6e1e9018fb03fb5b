import type { ApiKeySpec } from './core/accounts.js';
import { DEFAULT_UNEMBEDDING_RANK } from '../models/transformer.js';
import { MAX_LORA_RANK } from './core/fleet.js';
import { LIVE_SETTING_ROWS, type Settings, type SettingWithFlag } from './core/settings.js';
import {
  addTokenizers,
  envName,
  notEmpty,
  oneOf,
  parseApiKey,
  parseHostName,
  parsePassthrough,
  parsePort,
  parsePublicUrl,
  parseWarmModels,
  truth,
  wholeNumber,
} from './flag-values.js';

// The value readers and ConfigError are the flags' to share; parseOptions and usage are in parse-options.ts.
export { ConfigError, envName, parseApiKey, parsePort } from './flag-values.js';

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export type LogLevelName = (typeof LOG_LEVELS)[number];

/** The options that only matter when the server starts; the live settings' options come from the core's table. */
interface StartupOptions {
  port: number;
  host: string;
  /** Host names answered beyond localhost, IP addresses and the bound --host (server/http/allowed-hosts.ts). */
  allowedHost: string[];
  /** The URL put into `base_url` fields; defaults to where the server listens. */
  publicUrl?: string;
  /** Durable state lives here; without it, in memory. */
  dataDir?: string;
  /** Set the data dir's database and checkpoints aside (moved, never deleted) and start empty. */
  dataDirFresh: boolean;
  /** Give checkpoint folders no record names their records back from their manifests (an unreadable database is set aside first). */
  rebuildRecords: boolean;
  /** When non-empty, only these keys are accepted. */
  apiKeys: ApiKeySpec[];
  logLevel: LogLevelName;
  /** pretty (a terminal's default) or json (pino's NDJSON, the default elsewhere). */
  logFormat: 'pretty' | 'json';
  /** Largest request body, in bytes. */
  bodyLimit: number;
  /** A request's headers must arrive within this many milliseconds, the whole request within bodyTimeoutMs. */
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
  /** Lifetime of presigned checkpoint-file URLs. */
  presignTtlSeconds: number;
  /** Where the model engine computes: cpu, or cuda where onnxruntime-node has its CUDA provider. */
  device: 'cpu' | 'cuda';
  /** Largest LoRA rank on the unembedding; a run's rank above it is capped there (see DEFAULT_UNEMBEDDING_RANK). */
  unembeddingRank: number;
  /** Whether work of different runs on one base model that reaches the engine together shares graph runs. */
  batchRuns: boolean;
  /** Model name → a tokenizer.json (or its folder) to use instead of the built-in one. */
  tokenizers: Record<string, string>;
  /** Base models whose engine's graphs are built in the background at start. */
  warmModels: string[];
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
  /** Proxy mode: the port is also an HTTP forward proxy that intercepts Baseten's and the Hub's hosts. */
  proxy: boolean;
  /** The local CA of proxy mode; default: a per-user folder (server/proxy/ca.ts defaultCaDir). */
  caDir?: string;
  /** What is kept between processes (server/cache-dir.ts); undefined: the per-user default, null: nothing. */
  cacheDir?: string | null;
  /** Hosts proxy mode tunnels untouched instead of refusing them. */
  proxyPassthrough: string[];
  /** Also write the printed client variables to this file (KEY=value lines). */
  writeEnv?: string;
  /** Stop when the process that started this one is gone (its parent process id changes), however it went. */
  exitWithParent: boolean;
}

/**
 * Everything the server can be told, by flag, environment variable or the
 * programmatic API: the start-up options and the live settings that have a
 * flag (their starting values; see LIVE_SETTINGS in server/core/settings.ts).
 */
export interface ServerOptions extends StartupOptions, Pick<Settings, SettingWithFlag> {}

/**
 * One row of the settings table: a flag of `loops-mock serve`, a live
 * setting, or both. Start-up-only rows (port, journal, ...) have no wire
 * name; live settings that the admin API and scenarios change but no flag
 * sets (max_tokens_limit, ...) have no flag.
 */
export interface SettingRow {
  /** camelCase: the ServerOptions field, and for a live setting also its Settings field. */
  option: string;
  /** The flag without its dashes, when it has one. */
  flag?: string;
  /** The LOOPS_MOCK_* variable that sets what the flag does. */
  env?: string;
  /** Live settings only: the snake_case name in the admin API and scenarios. */
  wire?: string;
  /** Changes while the server runs (admin API, scenarios); otherwise read once at start. */
  live: boolean;
  default: unknown;
  /** The default as --help and the README's flag table write it. */
  shownDefault: string;
  help: string;
  /** `--flag` alone means true; `--flag=false` (or env 0/false) turns it off. */
  switch: boolean;
  /** May be given more than once; each value adds to the ones before. */
  repeatable: boolean;
  /** Flags replace what the environment gave instead of adding to it. */
  flagsReplaceEnv: boolean;
  /** Reads one flag or environment value into `options`; throws ConfigError naming the flag. */
  set?: (options: ServerOptions, value: string) => void;
}

export type FlagRow = SettingRow & Required<Pick<SettingRow, 'flag' | 'env' | 'set'>>;

type StartupKey = keyof StartupOptions;

/** A start-up-only row as written below; `startupRows` adds what follows from it. */
interface StartupRowSpec<K extends StartupKey> {
  flag: string;
  default: StartupOptions[K];
  /** How --help and README show a default that is not a plain value (none, a description). */
  shown?: string;
  help: string;
  switch?: true;
  /** Repeatable: each value adds to `previous`; with 'flags replace env', flags start again from the default. */
  repeatable?: 'adds to env' | 'flags replace env';
  /** One flag or environment value, given what the option holds so far (for repeatable flags). */
  parse: (value: string, previous: StartupOptions[K]) => StartupOptions[K];
}

type StartupRowSpecs<K extends StartupKey> = { [P in K]: StartupRowSpec<P> };

/** How a plain default is shown: numbers and words as they are, a switch as off/on, a list with commas, null (unset) as none. */
function showDefault(value: unknown, shown: string | undefined, flag: string): string {
  if (shown !== undefined) return shown;
  if (value === null) return 'none';
  if (typeof value === 'number' || typeof value === 'string') return String(value);
  if (typeof value === 'boolean') return value ? 'on' : 'off';
  if (Array.isArray(value) && value.every((v) => typeof v === 'number')) return value.join(',');
  throw new Error(`settings table: --${flag} needs a 'shown' default`);
}

function startupRows<K extends StartupKey>(specs: StartupRowSpecs<K>): FlagRow[] {
  return (Object.keys(specs) as K[]).map((option) => {
    const spec = specs[option] as StartupRowSpec<K>;
    return {
      option,
      flag: spec.flag,
      env: envName(spec.flag),
      live: false,
      default: spec.default,
      shownDefault: showDefault(spec.default, spec.shown, spec.flag),
      help: spec.help,
      switch: spec.switch ?? false,
      repeatable: spec.repeatable !== undefined,
      flagsReplaceEnv: spec.repeatable === 'flags replace env',
      set: (options: StartupOptions, value) => {
        options[option] = spec.parse(value, options[option]);
      },
    };
  });
}

/** The core's live settings as rows: a flag (named after the wire name) for those that have one. */
function liveRows(): SettingRow[] {
  return LIVE_SETTING_ROWS.map((row) => {
    const common = {
      option: row.key,
      wire: row.wire,
      live: true,
      default: row.default,
      help: row.help,
      switch: false,
      repeatable: false,
      flagsReplaceEnv: false,
    };
    if (!row.flag) return { ...common, shownDefault: showDefault(row.default, undefined, row.wire) };
    const flag = row.wire.replace(/_/g, '-');
    const whole = wholeNumber(flag, row.flagRange ?? row.range);
    // A list flag is a comma list; a nullable setting has no flag (nothing to say "off" with), so none reaches here.
    const parse = row.shape === 'list' ? (v: string) => v.split(',').map((x) => whole(x.trim())) : whole;
    return {
      ...common,
      flag,
      env: envName(flag),
      shownDefault: showDefault(row.default, undefined, flag),
      set: (options: ServerOptions, value: string) => {
        (options as unknown as Record<string, unknown>)[row.key] = parse(value);
      },
    };
  });
}

const LISTENING_ROWS: StartupRowSpecs<
  | 'port'
  | 'host'
  | 'allowedHost'
  | 'publicUrl'
  | 'dataDir'
  | 'dataDirFresh'
  | 'rebuildRecords'
  | 'apiKeys'
  | 'logLevel'
  | 'logFormat'
  | 'bodyLimit'
  | 'headersTimeoutMs'
  | 'bodyTimeoutMs'
> = {
  port: { flag: 'port', default: 8787, help: 'port to listen on; 0 picks a free one', parse: parsePort },
  host: { flag: 'host', default: '127.0.0.1', help: 'address to listen on', parse: notEmpty('host') },
  allowedHost: {
    flag: 'allowed-host',
    default: [],
    shown: 'none',
    repeatable: 'adds to env',
    help: "HOST[,HOST...]: more names clients reach the server by (the Host header), e.g. the machine's name with --host 0.0.0.0 or a container's service name; localhost, IP addresses, the --host and --public-url names (and Baseten's hosts with --proxy) are always answered, other names get 403 (a guard against DNS rebinding)",
    parse: (v, hosts) => [...hosts, ...v.split(',').map(parseHostName('allowed-host'))],
  },
  publicUrl: {
    flag: 'public-url',
    default: undefined,
    shown: 'where it listens',
    help: 'URL put into base_url fields',
    parse: parsePublicUrl,
  },
  dataDir: { flag: 'data-dir', default: undefined, shown: 'none: in memory', help: 'folder for durable state', parse: notEmpty('data-dir') },
  dataDirFresh: {
    flag: 'data-dir-fresh',
    default: false,
    switch: true,
    help: 'with --data-dir: move its database and checkpoints into DIR/set-aside-<time>/ (never deleted) and start empty; the way past a database that is missing, empty or unreadable',
    parse: (v) => truth('data-dir-fresh', v),
  },
  rebuildRecords: {
    flag: 'rebuild-records',
    default: false,
    switch: true,
    help: "with --data-dir: give checkpoint folders that no record names their records back from each folder's manifest, so they list, load and download again (runs and samplers are not rebuilt); an unreadable database is moved into DIR/set-aside-<time>/ first",
    parse: (v) => truth('rebuild-records', v),
  },
  apiKeys: {
    flag: 'api-key',
    default: [],
    shown: 'any key',
    repeatable: 'flags replace env',
    help: 'KEY[:ORG[:TEAM]]; repeatable; when given, only these keys are accepted',
    parse: (v, keys) => [...keys, ...v.split(',').map(parseApiKey)],
  },
  logLevel: {
    flag: 'log-level',
    default: 'info',
    help: `server log level on stderr: ${LOG_LEVELS.join(', ')}; info has a line per request and every lifecycle event, warn only problems`,
    parse: oneOf('log-level', LOG_LEVELS, `one of ${LOG_LEVELS.join(', ')}`),
  },
  logFormat: {
    flag: 'log-format',
    default: process.stderr.isTTY ? 'pretty' : 'json',
    shown: 'pretty on a terminal, else json',
    help: 'pretty: one short line per request or event; json: one JSON object per line (pino)',
    parse: oneOf('log-format', ['pretty', 'json'], 'pretty or json'),
  },
  bodyLimit: { flag: 'body-limit', default: 32 * 1024 * 1024, help: 'largest request body in bytes', parse: wholeNumber('body-limit', [1024, 2 ** 31]) },
  headersTimeoutMs: {
    flag: 'headers-timeout-ms',
    default: 10_000,
    help: "a request's headers must arrive within this, else 408 and the connection closes (answers, long polls included, are not limited)",
    parse: wholeNumber('headers-timeout-ms', [100, 600_000]),
  },
  bodyTimeoutMs: {
    flag: 'body-timeout-ms',
    default: 60_000,
    help: 'the whole request, headers and body, must arrive within this, else 408 and the connection closes',
    parse: wholeNumber('body-timeout-ms', [100, 3_600_000]),
  },
};

const ENGINE_AND_ADMIN_ROWS: StartupRowSpecs<Exclude<StartupKey, keyof typeof LISTENING_ROWS>> = {
  device: {
    flag: 'device',
    default: 'cpu',
    help: "where the model engine computes: cpu, or cuda where onnxruntime-node's CUDA provider is installed",
    parse: oneOf('device', ['cpu', 'cuda'], 'cpu or cuda'),
  },
  unembeddingRank: {
    flag: 'unembedding-rank',
    default: DEFAULT_UNEMBEDDING_RANK,
    help: `largest LoRA rank on the unembedding (lm_head), 1..${MAX_LORA_RANK}; a run's lora_rank above it is capped there, as adapter_config.json's rank_pattern says; it holds rank × vocabulary floats per adapter`,
    parse: wholeNumber('unembedding-rank', [1, MAX_LORA_RANK]),
  },
  batchRuns: {
    flag: 'batch-runs',
    default: true,
    shown: 'on',
    help: "on: training steps, scoring and decode steps of different runs and samplers on one base model that reach the engine together share graph runs, each row with its own adapter (results equal alone to float32 rounding); off: each run's work runs apart, bit-reproducible whatever else runs",
    parse: (v) => oneOf('batch-runs', ['on', 'off'], 'on or off')(v) === 'on',
  },
  tokenizers: {
    flag: 'tokenizer',
    default: {},
    shown: 'built in',
    repeatable: 'adds to env',
    help: 'NAME=PATH: use the tokenizer.json at PATH (a file or its folder) for base model NAME; repeatable',
    parse: addTokenizers,
  },
  warmModels: {
    flag: 'warm',
    default: ['Qwen/Qwen3.5-2B'],
    shown: 'Qwen/Qwen3.5-2B',
    help: "MODEL[,MODEL...]: base models whose engine's graphs are built in the background at start, so that a client's first step costs what its later ones do (about 150 MB resident each); none: no model",
    parse: parseWarmModels,
  },
  admin: {
    flag: 'admin',
    default: false,
    switch: true,
    help: 'serve the admin API under /_mock/ (faults, journal, scenarios, clock; see docs/admin.md)',
    parse: (v) => truth('admin', v),
  },
  adminToken: {
    flag: 'admin-token',
    default: undefined,
    shown: 'none',
    help: 'require Authorization: Bearer TOKEN on the admin API',
    parse: notEmpty('admin-token'),
  },
  clockMode: {
    flag: 'clock',
    default: 'real',
    help: 'real, or virtual: time stands still until POST /_mock/clock/advance moves it',
    parse: oneOf('clock', ['real', 'virtual'], 'real or virtual'),
  },
  journalFile: {
    flag: 'journal',
    default: undefined,
    shown: 'none',
    help: 'also append every journal entry to this file as NDJSON',
    parse: notEmpty('journal'),
  },
  journalSize: { flag: 'journal-size', default: 10_000, help: 'requests the journal keeps in memory', parse: wholeNumber('journal-size', [1, 10_000_000]) },
  journalDetail: {
    flag: 'journal-detail',
    default: 'summary',
    help: 'summary: bodies cut to a few items; full: whole request and response bodies',
    parse: oneOf('journal-detail', ['summary', 'full'], 'summary or full'),
  },
  scenario: {
    flag: 'scenario',
    default: undefined,
    shown: 'none',
    help: 'a scenario file (JSON or YAML) or a shipped scenario name, applied at start',
    parse: notEmpty('scenario'),
  },
  faultSeed: { flag: 'fault-seed', default: 1, help: 'seed of fault rules that give none', parse: wholeNumber('fault-seed', [0, 2 ** 32 - 1]) },
  proxy: {
    flag: 'proxy',
    default: false,
    switch: true,
    help: 'also act as an HTTPS forward proxy: intercept api.baseten.co, *.api.baseten.co, app.baseten.co and huggingface.co with the local CA, refuse other hosts; prints HTTPS_PROXY and the CA variables instead of LOOPS_BASE_URL',
    parse: (v) => truth('proxy', v),
  },
  cacheDir: {
    flag: 'cache-dir',
    default: undefined,
    shown: '~/.cache/loops-mock',
    help: "DIR: what a later server process reuses (onnxruntime's optimized graphs, the stop-string decoder's table; on Node 22.1+ the compiled modules), so that its first requests cost what a warm one's do; none: keep nothing; $XDG_CACHE_HOME moves the default",
    parse: (v) => (v === 'none' ? null : notEmpty('cache-dir')(v)),
  },
  caDir: {
    flag: 'ca-dir',
    default: undefined,
    shown: '~/.local/share/loops-mock/ca',
    help: "the proxy's CA folder (ca.pem, ca-key.pem, ca-bundle.pem), made at first start and reused; $XDG_DATA_HOME moves the default",
    parse: notEmpty('ca-dir'),
  },
  proxyPassthrough: {
    flag: 'proxy-passthrough',
    default: [],
    shown: 'none',
    repeatable: 'adds to env',
    help: 'HOST[:PORT][,...]: what the proxy tunnels untouched instead of refusing (they win over interception); a bare HOST is its port 443 only',
    parse: (v, hosts) => [...hosts, ...v.split(',').map(parsePassthrough)],
  },
  // Not --env-file: Node 20 takes an --env-file anywhere on its command line for itself, even after the script.
  writeEnv: {
    flag: 'write-env',
    default: undefined,
    shown: 'none',
    help: 'also write the printed client variables (KEY=value lines) to this file once listening, for scripts and CI services',
    parse: notEmpty('write-env'),
  },
  exitWithParent: {
    flag: 'exit-with-parent',
    default: false,
    switch: true,
    help: 'stop (gracefully, exit 0) as soon as the process that started this one is gone, even if it was killed with SIGKILL: no stray server after a CI step, npx wrapper or test runner dies',
    parse: (v) => truth('exit-with-parent', v),
  },
  presignTtlSeconds: {
    flag: 'presign-ttl-s',
    default: 3600,
    help: 'lifetime of checkpoint download URLs in seconds',
    parse: wholeNumber('presign-ttl-s', [1, 7 * 86400]),
  },
};

/**
 * The settings table: every flag of `loops-mock serve` and every live
 * setting, in --help order. Flags, variables, defaults, checks and help all
 * come from it; README's flag table is checked against it
 * (server/test/settings-table.test.ts).
 */
export const SETTINGS_TABLE: readonly SettingRow[] = [...startupRows(LISTENING_ROWS), ...liveRows(), ...startupRows(ENGINE_AND_ADMIN_ROWS)];

export const FLAG_ROWS: readonly FlagRow[] = SETTINGS_TABLE.filter((row): row is FlagRow => row.flag !== undefined);
export const DEFAULTS: ServerOptions = Object.fromEntries(
  FLAG_ROWS.filter((row) => row.default !== undefined).map((row) => [row.option, row.default]),
) as unknown as ServerOptions;

/** The live settings' starting values from the options, for LoopsCore; the others keep the core's defaults. */
export function liveSettingsOf(options: ServerOptions): Partial<Settings> {
  return Object.fromEntries(FLAG_ROWS.filter((row) => row.live).map((row) => [row.option, options[row.option as keyof ServerOptions]]));
}
