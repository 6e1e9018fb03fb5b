/**
 * The sdk-fixtures format: a flow is an ordered list of exchanges (request
 * template, expected status and response shape, values to capture). Written
 * by `loops-mock record`, replayed by `loops-conformance replay` and the tests.
 */

/** The type structure of a JSON value: field names and types, not values. */
export type Shape = 'string' | 'number' | 'boolean' | 'null' | 'binary' | Shape[] | { [field: string]: Shape };

export interface FixtureRequest {
  method: string;
  /** `{name}` placeholders: an absolute URL captured earlier (`{base_url_1}/forward`), or a path on the server. */
  url: string;
  /** Only headers that carry protocol meaning; `{key:N}` in Idempotency-Key is a fresh key per replay, the same for the same N. */
  headers?: Record<string, string>;
  body?: unknown;
}

export interface FixtureExchange {
  request: FixtureRequest;
  /** A long poll: repeated while it answers 408, as a client would. */
  poll?: boolean;
  response: { status: number; shape: Shape };
  /** Placeholder name → JSON pointer into the response body. */
  capture?: Record<string, string>;
}

export interface Fixture {
  name: string;
  description?: string;
  exchanges: FixtureExchange[];
}

export function shapeOf(value: unknown): Shape {
  if (value === null) return 'null';
  if (Array.isArray(value)) return value.length ? [shapeOf(value[0])] : [];
  if (typeof value === 'object') return Object.fromEntries(Object.entries(value as Record<string, unknown>).map(([k, v]) => [k, shapeOf(v)]));
  if (typeof value === 'number') return 'number';
  if (typeof value === 'boolean') return 'boolean';
  return 'string';
}

const describe = (s: Shape): string => (typeof s === 'string' ? s : Array.isArray(s) ? 'array' : 'object');

/** Every difference between an expected and an actual shape, each with its JSON path. */
export function diffShapes(expected: Shape, actual: Shape, path = ''): string[] {
  if (typeof expected === 'string' || typeof actual === 'string' || Array.isArray(expected) !== Array.isArray(actual)) {
    return describe(expected) === describe(actual) && typeof expected === 'string'
      ? []
      : [`${path || '(body)'}: expected ${describe(expected)}, got ${describe(actual)}`];
  }
  if (Array.isArray(expected) && Array.isArray(actual)) {
    // An empty array says nothing about its items.
    if (!expected.length || !actual.length) return [];
    return diffShapes(expected[0]!, actual[0]!, `${path}[0]`);
  }
  const e = expected as Record<string, Shape>;
  const a = actual as Record<string, Shape>;
  const out: string[] = [];
  for (const k of Object.keys(e)) {
    if (!(k in a)) out.push(`${path}.${k}: missing`);
    else out.push(...diffShapes(e[k]!, a[k]!, `${path}.${k}`));
  }
  for (const k of Object.keys(a)) if (!(k in e)) out.push(`${path}.${k}: not in the fixture (new field)`);
  return out;
}

/** The value at a JSON pointer (`/run/sampler/base_url`), or undefined. */
export function pointer(value: unknown, ptr: string): unknown {
  let cur = value;
  for (const raw of ptr.split('/').slice(1)) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<string, unknown>)[key];
  }
  return cur;
}

/** A copy of a JSON value with `fn` applied to every string in it. */
export function mapStrings<T>(value: T, fn: (s: string) => string): T {
  const walk = (v: unknown): unknown => {
    if (typeof v === 'string') return fn(v);
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    return v;
  };
  return walk(value) as T;
}

/** Replaces `{name}` placeholders in every string of a template. */
export function fill<T>(template: T, vars: Map<string, string>, fresh: (name: string) => string): T {
  return mapStrings(template, (s) =>
    s.replace(/\{(key:[A-Za-z0-9_]+|[A-Za-z0-9_]+)\}/g, (whole, name: string) => {
      if (name.startsWith('key:')) return fresh(name);
      return vars.get(name) ?? whole;
    }),
  );
}
