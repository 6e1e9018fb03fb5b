import { invalid } from './errors.js';

const DAY_MS = 86_400_000;

/** What a live setting holds: one whole number, a list of them (one value per replica), or a whole number or null (off). */
interface SettingShapes {
  whole: number;
  list: number[];
  nullable: number | null;
}

/** One live setting: everything the admin API, scenarios and the loops-mock flags need to know about it. */
export type LiveSettingRow = {
  /** snake_case name in the admin API (`/_mock/settings`) and in scenarios. */
  readonly wire: string;
  /** Smallest and largest value, inclusive; every number of a list must be in it. */
  readonly range: readonly [number, number];
  /**
   * Whether `loops-mock` has a start-up flag for it; the flag is the wire
   * name with dashes (`--cold-start-ms`) and its variable `LOOPS_MOCK_COLD_START_MS`.
   */
  readonly flag: boolean;
  /** Narrower range of the flag than of the admin API, where the two have always differed. */
  readonly flagRange?: readonly [number, number];
  /** What it does, for --help and the docs (the default is added where shown). */
  readonly help: string;
} & (
  | { readonly shape: 'whole'; readonly default: number }
  | { readonly shape: 'list'; readonly default: readonly number[] }
  | { readonly shape: 'nullable'; readonly default: number | null }
);

/**
 * The behaviour knobs every part of the core reads at the moment it needs
 * them, one row each: the one place their names, defaults and ranges are
 * written. `Settings`, the admin schema (server/admin/schemas.ts), the
 * checks of `applySettings` and the start-up flags (server/config.ts) all
 * come from here. The order is that of GET /_mock/settings and of --help.
 */
export const LIVE_SETTINGS = {
  coldStartMs: {
    wire: 'cold_start_ms',
    shape: 'whole',
    default: 0,
    range: [0, DAY_MS],
    flag: true,
    help: 'time for a new trainer or sampler (or a waking one) to become ready; 0 = at once',
  },
  modelColdStartMs: {
    wire: 'model_cold_start_ms',
    shape: 'whole',
    default: 0,
    range: [0, DAY_MS],
    flag: true,
    help: 'time a checkpoint deployed to inference walks BUILDING, DEPLOYING, LOADING_MODEL (a third each) before it is ACTIVE; 0 = at once',
  },
  deactivationMs: {
    wire: 'deactivation_ms',
    shape: 'whole',
    default: 0,
    range: [0, DAY_MS],
    flag: true,
    help: 'time a sampler stays DEACTIVATING before it is INACTIVE; 0 = at once',
  },
  samplerReplicas: { wire: 'sampler_replicas', shape: 'whole', default: 1, range: [1, 64], flag: true, help: 'replicas per new sampler' },
  weightSyncDelayMs: {
    wire: 'weight_sync_delay_ms',
    shape: 'list',
    default: [0],
    range: [0, DAY_MS],
    flag: true,
    help: 'delay before a sampler replica makes published weights live; a comma list gives each replica its own, the last repeating',
  },
  floorWaitMs: {
    wire: 'floor_wait_ms',
    shape: 'whole',
    default: 2000,
    range: [0, DAY_MS],
    flag: true,
    flagRange: [0, 600_000],
    help: 'how long a sampling request below X-Min-Policy-Version waits for a replica before 408',
  },
  maxSeqLenLimit: {
    wire: 'max_seq_len_limit',
    shape: 'whole',
    default: 8192,
    range: [1, 1_048_576],
    flag: true,
    help: "longest sequence, in positions, this server takes: a run's max_seq_len or a sampler's max_seq_length above it is a 400, and so is a longer input; memory per request stays bounded above it (long sequences are computed in blocks), time grows with length",
  },
  maxTokensLimit: {
    wire: 'max_tokens_limit',
    shape: 'whole',
    default: 4096,
    range: [1, 1_000_000],
    flag: false,
    help: 'largest max_tokens a sampling request may ask for',
  },
  // Issue 31 item 13: the work one request may ask for, so that none takes the server past 2 GB (soak/request-memory.ts).
  maxSampledTokens: {
    wire: 'max_sampled_tokens',
    shape: 'whole',
    default: 131_072,
    range: [1, 67_108_864],
    flag: true,
    help: 'most positions one sampling request may hold at once: samples (num_samples, n) × (prompt + max_tokens), each sequence keeping a cache of its positions; over it is a 400 naming this flag',
  },
  maxBatchTokens: {
    wire: 'max_batch_tokens',
    shape: 'whole',
    default: 8192,
    range: [1, 67_108_864],
    flag: true,
    help: 'most positions one forward or forward_backward may carry, all its datums together; over it is a 400 naming this flag',
  },
  bodyBytesInFlight: {
    wire: 'body_bytes_in_flight',
    shape: 'whole',
    default: 268_435_456,
    range: [1024, 17_179_869_184],
    flag: true,
    help: 'most bytes of request bodies the server holds at once (each costs about three times its size parsed); a body that would pass it waits for none: 503 with Retry-After, while a body alone is always taken',
  },
  // Below the 30 s the clients wait for an answer, so a poll always gets one.
  longPollMs: {
    wire: 'long_poll_ms',
    shape: 'whole',
    default: 25_000,
    range: [1, 29_999],
    flag: true,
    help: "long-poll window of GET .../operations/{id}, then 408; below the clients' 30000",
  },
  operationTtlMs: {
    wire: 'operation_ttl_ms',
    shape: 'whole',
    default: 600_000,
    range: [1, 7 * DAY_MS],
    flag: true,
    help: 'how long a finished operation stays retrievable, then 404',
  },
  runIdleTimeoutMs: {
    wire: 'run_idle_timeout_ms',
    shape: 'nullable',
    default: null,
    range: [0, DAY_MS],
    flag: false,
    help: "when set, replaces each run's scale_down_delay_seconds as its idle timeout",
  },
  samplerIdleMs: {
    wire: 'sampler_idle_ms',
    shape: 'nullable',
    default: null,
    range: [0, DAY_MS],
    flag: false,
    help: 'when set, an ACTIVE sampler idle this long is SCALED_TO_ZERO (the next request wakes it)',
  },
} as const satisfies Record<string, LiveSettingRow>;

type Rows = typeof LIVE_SETTINGS;
export type SettingKey = keyof Rows;

/**
 * One mutable object of these is shared by all parts of the core, so a
 * scenario or the admin API can change them while the server runs; a reset
 * puts back the values the server started with. See LIVE_SETTINGS for what
 * each one does.
 */
export type Settings = { -readonly [K in SettingKey]: SettingShapes[Rows[K]['shape']] };

/** The live settings `loops-mock` also takes as start-up flags. */
export type SettingWithFlag = { [K in SettingKey]: Rows[K]['flag'] extends true ? K : never }[SettingKey];

/** What the admin API and scenarios accept for each shape: a list may be given as one number (a list of one). */
interface WireShapes extends Omit<SettingShapes, 'list'> {
  list: number | number[];
}

/** Settings in their wire names, as the admin API and scenarios write them. */
export type SettingsWire = { [K in SettingKey as Rows[K]['wire']]?: WireShapes[Rows[K]['shape']] };

/** The rows with their keys, in table order. */
export const LIVE_SETTING_ROWS: readonly (LiveSettingRow & { key: SettingKey })[] = Object.entries(LIVE_SETTINGS).map(([key, row]) => ({
  ...row,
  key: key as SettingKey,
}));

export const DEFAULT_SETTINGS: Settings = Object.fromEntries(
  LIVE_SETTING_ROWS.map((row) => [row.key, Array.isArray(row.default) ? [...row.default] : row.default]),
) as Settings;

/** Settings in their wire names. */
export function settingsToWire(s: Settings): Required<SettingsWire> {
  return Object.fromEntries(LIVE_SETTING_ROWS.map((row) => [row.wire, s[row.key]])) as Required<SettingsWire>;
}

const ROW_BY_WIRE = new Map(LIVE_SETTING_ROWS.map((row) => [row.wire, row]));

/**
 * Applies settings given in wire names onto `target`, all or nothing: an
 * unknown name or a value out of range is an error naming it.
 */
export function applySettings(target: Settings, wire: Record<string, unknown>, where = 'settings'): void {
  const next: Partial<Record<SettingKey, unknown>> = {};
  for (const [name, value] of Object.entries(wire)) {
    const row = ROW_BY_WIRE.get(name);
    if (!row) throw invalid(`${where}.${name} is not a setting. Settings: ${[...ROW_BY_WIRE.keys()].join(', ')}.`, { field: `${where}.${name}` });
    const [min, max] = row.range;
    const check = (v: unknown, field: string) => {
      if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
        throw invalid(`${field} must be a whole number from ${min} to ${max}, got ${JSON.stringify(v)}.`, { field });
      return v;
    };
    if (row.shape === 'list') {
      const list = Array.isArray(value) ? value : [value];
      if (!list.length) throw invalid(`${where}.${name} needs at least one delay.`, { field: `${where}.${name}` });
      next[row.key] = list.map((v, i) => check(v, `${where}.${name}[${i}]`));
    } else if (row.shape === 'nullable' && value === null) {
      next[row.key] = null;
    } else {
      next[row.key] = check(value, `${where}.${name}`);
    }
  }
  Object.assign(target, next);
}
