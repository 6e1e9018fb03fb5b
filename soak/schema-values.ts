import type { Prng } from '../models/prng.js';

/** The slice of JSON Schema that the server's TypeBox schemas use, as /openapi.json gives them. */
export interface Schema {
  type?: string;
  properties?: Record<string, Schema>;
  patternProperties?: Record<string, Schema>;
  required?: string[];
  additionalProperties?: boolean | Schema;
  items?: Schema;
  minItems?: number;
  maxItems?: number;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  enum?: unknown[];
  const?: unknown;
  anyOf?: Schema[];
  oneOf?: Schema[];
}

export const pick = <T>(rng: Prng, list: readonly T[]): T => list[Math.floor(rng.next() * list.length)]!;
export const chance = (rng: Prng, p: number): boolean => rng.next() < p;

/**
 * Values the schema's own field names call for (ids that exist, token ids of the vocabulary),
 * so that a generated body gets past the id lookups and reaches the code behind them.
 */
export type Hints = Record<string, () => unknown>;

/** A value the schema accepts, small wherever it has a choice: the work a valid case asks for stays light. */
export function valueOfSchema(schema: Schema, rng: Prng, hints: Hints, key?: string, depth = 0): unknown {
  if (key !== undefined && hints[key]) return hints[key]!();
  if (schema.const !== undefined) return schema.const;
  if (schema.enum) return pick(rng, schema.enum);
  const branches = schema.anyOf ?? schema.oneOf;
  if (branches) {
    const real = branches.filter((b) => b.type !== 'null');
    return valueOfSchema(real.length && chance(rng, 0.85) ? pick(rng, real) : pick(rng, branches), rng, hints, key, depth);
  }
  switch (schema.type) {
    case 'object': {
      const out: Record<string, unknown> = {};
      const required = new Set(schema.required ?? []);
      for (const [name, s] of Object.entries(schema.properties ?? {})) {
        if (required.has(name) || (depth < 4 && chance(rng, 0.4))) out[name] = valueOfSchema(s, rng, hints, name, depth + 1);
      }
      const pattern = Object.values(schema.patternProperties ?? {})[0];
      if (pattern && depth < 4 && chance(rng, 0.5)) out.k = valueOfSchema(pattern, rng, hints, undefined, depth + 1);
      return out;
    }
    case 'array': {
      const min = schema.minItems ?? 0;
      const n = Math.min(schema.maxItems ?? Infinity, min + Math.floor(rng.next() * 3));
      return Array.from({ length: Math.max(min, n) }, () => valueOfSchema(schema.items ?? {}, rng, hints, undefined, depth + 1));
    }
    case 'string': {
      const min = Math.max(schema.minLength ?? 1, 1);
      return `soak${Math.floor(rng.next() * 1000)}`.padEnd(min, 'x').slice(0, schema.maxLength ?? 64);
    }
    case 'integer': {
      const low = schema.minimum ?? (schema.exclusiveMinimum !== undefined ? schema.exclusiveMinimum + 1 : 0);
      return Math.min(schema.maximum ?? Infinity, low + Math.floor(rng.next() * 3));
    }
    case 'number': {
      const low = schema.minimum ?? 0;
      return Math.min(schema.maximum ?? Infinity, low + rng.next());
    }
    case 'boolean':
      return chance(rng, 0.5);
    case 'null':
      return null;
    default:
      return {};
  }
}

/** Where a marker string stands in a body, the case's text has raw JSON that JSON.stringify cannot write (1e400). */
export const RAW = '@@soak-raw@@';

/** JSON text with every RAW marker replaced by the raw text given. */
export function jsonWithRaw(value: unknown, raw: string): string {
  return JSON.stringify(value).split(JSON.stringify(RAW)).join(raw);
}

const LONG = 'x'.repeat(20_000);

/** Values that have broken servers before: wrong types, extremes, odd text, deep and wide structures, huge arrays. */
export function nastyValue(rng: Prng): unknown {
  switch (Math.floor(rng.next() * 24)) {
    case 0:
      return -1;
    case 1:
      return 0;
    case 2:
      return 2 ** 31;
    case 3:
      return 2 ** 53 + 2;
    case 4:
      return -(2 ** 63);
    case 5:
      return 1.5;
    case 6:
      return 1e308;
    case 7:
      return 5e-324;
    case 8:
      return '';
    case 9:
      return LONG;
    case 10:
      return '\u0000\ud800 \u202e';
    case 11:
      return '../../../etc/passwd';
    case 12:
      return 'bt://loops:../weights/../../x';
    case 13:
      return true;
    case 14:
      return null;
    case 15:
      return [];
    case 16:
      return {};
    case 17:
      return JSON.parse('{"__proto__": {"polluted": 1}, "constructor": {"prototype": {}}}');
    case 18:
      return Array.from({ length: 120_000 }, (_, i) => i % 1000);
    case 19:
      return Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`k${i}`, i]));
    case 20:
      return 'NaN';
    case 21:
      return [1e39, -1e39];
    case 22:
      return RAW;
    default:
      return 2 ** 70;
  }
}

/** Raw JSON number texts: beyond float64, beyond float32, many digits. */
export const RAW_NUMBERS = ['1e400', '-1e400', '1e39', '123456789012345678901234567890', '-0', '1E+309'] as const;

/** Paths to every leaf and branch of a JSON value, so a mutation can land anywhere in it. */
export function pathsOf(value: unknown, prefix: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  if (prefix.length) out.push(prefix);
  if (Array.isArray(value))
    value.slice(0, 8).forEach((v, i) => {
      pathsOf(v, [...prefix, i], out);
    });
  else if (value && typeof value === 'object') for (const [k, v] of Object.entries(value)) pathsOf(v, [...prefix, k], out);
  return out;
}

/** A copy of `value` with the value at `path` replaced. */
export function replaceAt(value: unknown, path: (string | number)[], replacement: unknown): unknown {
  if (!path.length) return replacement;
  const [head, ...rest] = path;
  if (Array.isArray(value)) return value.map((v, i) => (i === head ? replaceAt(v, rest, replacement) : v));
  const obj = value as Record<string, unknown>;
  return { ...obj, [head!]: replaceAt(obj[head as string], rest, replacement) };
}
