import { invalid } from './errors.js';

/**
 * The behaviour knobs every part of the core reads at the moment it needs
 * them. One mutable object shared by all parts, so a scenario or the admin
 * API can change them while the server runs; a reset puts back the values
 * the server started with.
 */
export interface Settings {
  /** How long a new trainer or sampler (or a waking one) takes to become ready. 0 = at once. */
  coldStartMs: number;
  /** How long a sampler stays DEACTIVATING before it is INACTIVE. 0 = at once. */
  deactivationMs: number;
  /** Replicas of each new sampler. */
  samplerReplicas: number;
  /** Delay before a replica makes a publication live, per replica (the last value repeats). */
  weightSyncDelayMs: number[];
  /** How long a request below its floor waits for a replica to catch up before 408. */
  floorWaitMs: number;
  /** Largest max_tokens a sampling request may ask for. */
  maxTokensLimit: number;
  /** Long-poll window of an operation poll, then 408. */
  longPollMs: number;
  /** How long a finished operation's result stays retrievable. */
  operationTtlMs: number;
  /** When set, replaces each run's scale_down_delay_seconds as its idle timeout. */
  runIdleTimeoutMs: number | null;
  /** When set, an ACTIVE sampler idle this long is SCALED_TO_ZERO (the next request wakes it). */
  samplerIdleMs: number | null;
}

export const DEFAULT_SETTINGS: Settings = {
  coldStartMs: 0,
  deactivationMs: 0,
  samplerReplicas: 1,
  weightSyncDelayMs: [0],
  floorWaitMs: 2000,
  maxTokensLimit: 4096,
  longPollMs: 25_000,
  operationTtlMs: 600_000,
  runIdleTimeoutMs: null,
  samplerIdleMs: null,
};

/** The wire names (snake_case, as in scenarios and the admin API) of each setting. */
export const SETTING_NAMES: Record<keyof Settings, string> = {
  coldStartMs: 'cold_start_ms',
  deactivationMs: 'deactivation_ms',
  samplerReplicas: 'sampler_replicas',
  weightSyncDelayMs: 'weight_sync_delay_ms',
  floorWaitMs: 'floor_wait_ms',
  maxTokensLimit: 'max_tokens_limit',
  longPollMs: 'long_poll_ms',
  operationTtlMs: 'operation_ttl_ms',
  runIdleTimeoutMs: 'run_idle_timeout_ms',
  samplerIdleMs: 'sampler_idle_ms',
};

export type SettingsWire = { [K in keyof Settings as (typeof SETTING_NAMES)[K] & string]?: Settings[K] };

/** Settings in their wire names. */
export function settingsToWire(s: Settings): Record<string, unknown> {
  return Object.fromEntries(Object.entries(SETTING_NAMES).map(([key, wire]) => [wire, s[key as keyof Settings]]));
}

const RANGES: Partial<Record<keyof Settings, [number, number]>> = {
  samplerReplicas: [1, 64],
  longPollMs: [1, 29_999],
  operationTtlMs: [1, 7 * 86_400_000],
  maxTokensLimit: [1, 1_000_000],
};

/**
 * Applies settings given in wire names onto `target`, all or nothing: an
 * unknown name or a value out of range is an error naming it.
 */
export function applySettings(target: Settings, wire: Record<string, unknown>, where = 'settings'): void {
  const byWire = new Map(Object.entries(SETTING_NAMES).map(([k, w]) => [w, k as keyof Settings]));
  const next: Partial<Record<keyof Settings, unknown>> = {};
  for (const [name, value] of Object.entries(wire)) {
    const key = byWire.get(name);
    if (!key) throw invalid(`${where}.${name} is not a setting. Settings: ${[...byWire.keys()].join(', ')}.`, { field: `${where}.${name}` });
    const [min, max] = RANGES[key] ?? [0, 86_400_000];
    const check = (v: unknown, field: string) => {
      if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw invalid(`${field} must be a whole number from ${min} to ${max}, got ${JSON.stringify(v)}.`, { field });
      return v;
    };
    if (key === 'weightSyncDelayMs') {
      const list = Array.isArray(value) ? value : [value];
      if (!list.length) throw invalid(`${where}.${name} needs at least one delay.`, { field: `${where}.${name}` });
      next[key] = list.map((v, i) => check(v, `${where}.${name}[${i}]`));
    } else if ((key === 'runIdleTimeoutMs' || key === 'samplerIdleMs') && value === null) {
      next[key] = null;
    } else {
      next[key] = check(value, `${where}.${name}`);
    }
  }
  Object.assign(target, next);
}
