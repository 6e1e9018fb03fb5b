import type { EnginePool } from '../models/index.js';
import type { ApiKeySpec } from './core/accounts.js';
import type { Clock } from './core/clock.js';
import { ConfigError, DEFAULTS, FLAG_ROWS, type FlagRow, type ServerOptions } from './config.js';

/**
 * startServer()'s options: the flags of `loops-mock serve` in camelCase
 * (`--warm` is `warm`, `--presign-ttl-s` is `presignTtlS`), read through the
 * same settings table as the command line (server/config.ts), so the names,
 * checks and messages are one. A value is what the flag takes (`warm: 'none'`,
 * `port: '0'`) or its typed form (`warm: []`, `port: 0`).
 */

/** ServerOptions fields whose name is not the flag's; their option is the flag's name. */
type RenamedFields = 'apiKeys' | 'tokenizers' | 'warmModels' | 'clockMode' | 'journalFile' | 'presignTtlSeconds';

export interface StartOptions extends Partial<Omit<ServerOptions, RenamedFields>> {
  /** --api-key: KEY[:ORG[:TEAM]] strings, or {key, org, team} objects; when given, only these keys are accepted. */
  apiKey?: string | string[] | ApiKeySpec[];
  /** --tokenizer: base model → tokenizer.json path, or NAME=PATH[,NAME=PATH]. */
  tokenizer?: Record<string, string> | string;
  /** --warm: base models warmed at start; [] or 'none' for none. */
  warm?: string[] | string;
  /** --clock: 'real' or 'virtual' (moved by POST /_mock/clock/advance), or a Clock to drive time by hand (ManualClock). */
  clock?: 'real' | 'virtual' | Clock;
  /** --journal: a file every journal entry is appended to (NDJSON). */
  journal?: string;
  /** --presign-ttl-s: lifetime of checkpoint download URLs, in seconds. */
  presignTtlS?: number;
  /** Model engines to share between servers (graphs built once); the caller closes them. Not a flag. */
  engines?: EnginePool;
  /** @deprecated since 0.2.0: use `apiKey`. */
  apiKeys?: ApiKeySpec[];
  /** @deprecated since 0.2.0: use `tokenizer`. */
  tokenizers?: Record<string, string>;
  /** @deprecated since 0.2.0: use `warm`. */
  warmModels?: string[];
  /** @deprecated since 0.2.0: use `clock`. */
  clockMode?: 'real' | 'virtual';
  /** @deprecated since 0.2.0: use `journal`. */
  journalFile?: string;
  /** @deprecated since 0.2.0: use `presignTtlS`. */
  presignTtlSeconds?: number;
}

/** An option's name: its flag in camelCase. */
export const optionNameOf = (flag: string): string => flag.replace(/-([a-z0-9])/g, (_, c: string) => c.toUpperCase());

/** The names 0.1 used, kept working (README, "Deprecated option names"); each maps to its flag's name. */
export const DEPRECATED_OPTION_NAMES: Readonly<Record<string, string>> = {
  apiKeys: 'apiKey',
  tokenizers: 'tokenizer',
  warmModels: 'warm',
  clockMode: 'clock',
  journalFile: 'journal',
  presignTtlSeconds: 'presignTtlS',
};

const ROW_BY_OPTION = new Map<string, FlagRow>(FLAG_ROWS.map((row) => [optionNameOf(row.flag), row]));
/** Options that are no flag. */
const EXTRA_OPTIONS = ['engines'];

export const START_OPTION_NAMES: readonly string[] = [...ROW_BY_OPTION.keys(), ...EXTRA_OPTIONS];

function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      current[j] = Math.min(previous[j]! + 1, current[j - 1]! + 1, previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    previous = current;
  }
  return previous[b.length]!;
}

/** The known option nearest to a misspelt one (case aside), when it is near enough to be what was meant. */
export function nearestOption(name: string): string | undefined {
  const lower = name.toLowerCase();
  let best: { name: string; distance: number } | undefined;
  for (const candidate of START_OPTION_NAMES) {
    const distance = editDistance(lower, candidate.toLowerCase());
    if (!best || distance < best.distance) best = { name: candidate, distance };
  }
  // A few letters off, or one name inside the other (warmModel for warm).
  const near =
    best && (best.distance <= Math.max(2, Math.floor(name.length / 3)) || lower.includes(best.name.toLowerCase()) || best.name.toLowerCase().includes(lower));
  return near ? best!.name : undefined;
}

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && Object.getPrototypeOf(v) === Object.prototype;

/** Sets one option from a typed value or flag text, through the flag's own check. */
function setOption(options: ServerOptions, row: FlagRow, value: unknown): void {
  const field = row.option as keyof ServerOptions;
  const assign = (v: unknown) => {
    (options as unknown as Record<string, unknown>)[field] = v;
  };
  if (typeof value === 'string') {
    if (row.repeatable) assign(structuredClone(row.default));
    row.set(options, value);
  } else if (typeof value === 'number') {
    row.set(options, String(value));
  } else if (typeof value === 'boolean' && (row.switch || typeof row.default === 'boolean')) {
    if (row.switch) row.set(options, String(value));
    else assign(value);
  } else if (Array.isArray(value) && Array.isArray(row.default)) {
    // The list given is the whole list: [] is none.
    assign([]);
    if (value.every((v) => typeof v === 'string' || typeof v === 'number')) {
      // A list flag takes one comma list; a repeatable one each value in turn.
      if (row.repeatable) for (const v of value) row.set(options, String(v));
      else if (value.length) row.set(options, value.join(','));
    } else if (row.option === 'apiKeys' && value.every((v) => isPlainObject(v) && typeof v.key === 'string' && v.key !== '')) {
      assign(value.map((v) => ({ ...(v as ApiKeySpec) })));
    } else {
      throw new ConfigError(`must be a list of strings as --${row.flag} takes them${row.option === 'apiKeys' ? ', or of {key, org?, team?} objects' : ''}`);
    }
  } else if (isPlainObject(value) && isPlainObject(row.default)) {
    for (const [k, v] of Object.entries(value)) {
      if (typeof v !== 'string' || v === '' || k === '')
        throw new ConfigError(`must map names to non-empty strings, got ${JSON.stringify(k)}: ${JSON.stringify(v)}`);
    }
    assign({ ...value });
  } else {
    const shape = Array.isArray(row.default)
      ? 'a list or a string'
      : typeof row.default === 'number'
        ? 'a number or a string'
        : typeof row.default === 'boolean'
          ? 'true or false'
          : 'a string';
    throw new ConfigError(`must be ${shape} as --${row.flag} takes it, got ${Array.isArray(value) ? 'a list' : typeof value}`);
  }
}

export interface ResolvedStart {
  options: ServerOptions;
  clock?: Clock;
  engines?: EnginePool;
}

/** startServer()'s options as the server's: every name checked (an unknown one names the nearest), every value through its flag's check. */
export function resolveStartOptions(given: StartOptions): ResolvedStart {
  if (!isPlainObject(given)) throw new ConfigError("startServer takes one options object, e.g. startServer({ port: 0, warm: 'none' })");
  const options = structuredClone(DEFAULTS);
  const resolved: ResolvedStart = { options };
  const seen = new Map<string, string>();
  for (const [key, value] of Object.entries(given)) {
    if (value === undefined) continue;
    if (key === 'engines') {
      resolved.engines = value as EnginePool;
      continue;
    }
    if (key === 'clock' && typeof value === 'object' && value !== null && typeof (value as Clock).now === 'function') {
      resolved.clock = value as Clock;
      continue;
    }
    const name = DEPRECATED_OPTION_NAMES[key] ?? key;
    const row = ROW_BY_OPTION.get(name);
    if (!row) {
      const nearest = nearestOption(key);
      throw new ConfigError(
        `startServer: unknown option '${key}'${nearest ? ` (did you mean '${nearest}'?)` : ''}; the options are the flags of loops-mock serve in camelCase (${START_OPTION_NAMES.join(', ')})`,
      );
    }
    const earlier = seen.get(name);
    if (earlier !== undefined) throw new ConfigError(`startServer: '${key}' and '${earlier}' are the same option (--${row.flag}); give one`);
    seen.set(name, key);
    try {
      setOption(options, row, value);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      const named = err.message.startsWith(`--${row.flag}`);
      throw new ConfigError(`startServer option '${key}'${named ? '' : ` (--${row.flag})`}: ${err.message}`);
    }
  }
  return resolved;
}
