/** The flags' value readers: each takes one flag or environment value and throws a ConfigError naming the flag. */
import { BASE_MODELS, findBaseModel } from '../models/registry.js';
import type { ApiKeySpec } from './core/accounts.js';

export class ConfigError extends Error {}

export const envName = (flag: string) => `LOOPS_MOCK_${flag.toUpperCase().replace(/-/g, '_')}`;

export function truth(flag: string, value: string): boolean {
  if (/^(1|true|yes|on)$/i.test(value)) return true;
  if (/^(0|false|no|off)$/i.test(value)) return false;
  throw new ConfigError(`--${flag} is a switch: give it alone, or as --${flag}=true / --${flag}=false, got '${value}'`);
}

export function wholeNumber(flag: string, [min, max]: readonly [number, number]): (value: string) => number {
  return (value) => {
    const n = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(n) || n < min || n > max)
      throw new ConfigError(`--${flag} must be a whole number from ${min} to ${max}, got '${value}'`);
    return n;
  };
}

export const notEmpty = (flag: string) => (value: string) => {
  if (!value) throw new ConfigError(`--${flag} must not be empty`);
  return value;
};

export function oneOf<const T extends string>(flag: string, choices: readonly T[], say: string): (value: string) => T {
  return (value) => {
    if (!(choices as readonly string[]).includes(value)) throw new ConfigError(`--${flag} must be ${say}, got '${value}'`);
    return value as T;
  };
}

/** `--port` of `loops-mock serve` and of `loops-mock record`. */
export const parsePort = wholeNumber('port', [0, 65535]);

export function parseApiKey(value: string): ApiKeySpec {
  const [key, org, team, ...rest] = value.split(':');
  if (!key || rest.length || org === '' || team === '')
    throw new ConfigError(`--api-key must be KEY, KEY:ORG or KEY:ORG:TEAM with no empty part, got '${value}'`);
  return { key, org, team };
}

/** A host name or IP address, as `--proxy-passthrough` and `--allowed-host` take them (no port: every port of the host counts). */
export const parseHostName =
  (flag: string) =>
  (value: string): string => {
    const host = value
      .trim()
      .toLowerCase()
      .replace(/^\[|\]$/g, '');
    if (!/^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$/.test(host) && !/^[0-9a-f:.]+$/.test(host)) {
      throw new ConfigError(`--${flag} takes host names or IP addresses without a port, e.g. example.com,127.0.0.1, got '${value}'`);
    }
    return host;
  };

/** A --proxy-passthrough target: HOST (its port 443 only) or HOST:PORT ([V6]:PORT); lower-cased, the port kept only when given. */
export function parsePassthrough(value: string): string {
  const text = value.trim().toLowerCase();
  const withPort = /^(\[[0-9a-f:.]+\]|[^:[\]]+):(\d+)$/.exec(text);
  const port = withPort ? Number(withPort[2]) : undefined;
  const problem = `--proxy-passthrough takes HOST (its port 443) or HOST:PORT, e.g. example.com,127.0.0.1:8080,[::1]:8443, got '${value}'`;
  if (port !== undefined && (port < 1 || port > 65535)) throw new ConfigError(`${problem}: the port must be 1-65535`);
  let host: string;
  try {
    host = parseHostName('proxy-passthrough')(withPort ? withPort[1]! : text);
  } catch {
    throw new ConfigError(problem);
  }
  return port === undefined ? host : `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/** --public-url: an absolute http(s) URL, without trailing slashes. */
export function parsePublicUrl(v: string): string {
  let url: URL;
  try {
    url = new URL(v);
  } catch {
    throw new ConfigError(`--public-url must be an absolute http(s) URL, got '${v}'`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigError(`--public-url must use http or https, got '${v}'`);
  return v.replace(/\/+$/, '');
}

/** --tokenizer NAME=PATH[,NAME=PATH...], added to the ones given before. */
export function addTokenizers(v: string, tokenizers: Record<string, string>): Record<string, string> {
  const next = { ...tokenizers };
  for (const pair of v.split(',')) {
    const eq = pair.indexOf('=');
    if (eq <= 0 || eq === pair.length - 1) throw new ConfigError(`--tokenizer must be NAME=PATH, e.g. Qwen/Qwen3-8B=./tokenizer.json, got '${pair}'`);
    next[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return next;
}

/** --warm MODEL[,MODEL...]: supported base models, or none. */
export function parseWarmModels(v: string): string[] {
  if (v === 'none') return [];
  return v.split(',').map((name) => {
    if (!findBaseModel(name))
      throw new ConfigError(`--warm: '${name}' is not a supported base model (${BASE_MODELS.map((m) => m.name).join(', ')}), or 'none'`);
    return name;
  });
}
