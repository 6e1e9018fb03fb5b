/**
 * A small language for the shape of a JSON answer, and a comparison that names
 * the path of every field that differs. docs-examples.test.ts writes each
 * example response of Baseten's Loops pages in it.
 *
 * - 'string' | 'integer' | 'number' | 'boolean' | 'null': the JSON value type;
 * - a plain object: an object with exactly those fields (none missing, none extra);
 * - format(name, test): a string of that format (ISO 8601, a 7-character id...);
 * - literal(value): exactly that value (where the example's value must hold);
 * - list(item, count?): an array whose every item has the item's shape;
 * - tiny(shape, why): the example's value cannot hold for the mock's tiny model, so
 *   only the shape is compared; `why` says why in one line;
 * - optional(shape): a field the published schema marks optional: absent, or of that shape;
 * - atLeast({...}): an object with at least those fields (where the page elides the rest with "...").
 */
export type Kind = 'string' | 'integer' | 'number' | 'boolean' | 'null';
export type Shape = Kind | Format | Literal | List | Tiny | Optional | AtLeast | { [field: string]: Shape };

class Format {
  constructor(
    readonly name: string,
    readonly test: (s: string) => boolean,
  ) {}
}
class Literal {
  constructor(readonly value: unknown) {}
}
class List {
  constructor(
    readonly item: Shape,
    readonly count?: number,
  ) {}
}
class Tiny {
  constructor(
    readonly shape: Shape,
    readonly why: string,
  ) {}
}
class Optional {
  constructor(readonly shape: Shape) {}
}
class AtLeast {
  constructor(readonly fields: Record<string, Shape>) {}
}

export const format = (name: string, test: RegExp | ((s: string) => boolean)) => new Format(name, typeof test === 'function' ? test : (s) => test.test(s));
export const literal = (value: unknown) => new Literal(value);
export const list = (item: Shape, count?: number) => new List(item, count);
export const tiny = (shape: Shape, why: string) => new Tiny(shape, why);
export const optional = (shape: Shape) => new Optional(shape);
export const atLeast = (fields: Record<string, Shape>) => new AtLeast(fields);

/** The JSON type of a parsed value, telling integers from other numbers. */
export function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

const show = (v: unknown) => {
  const s = JSON.stringify(v);
  return s === undefined ? String(v) : s.length > 80 ? `${s.slice(0, 77)}...` : s;
};

/** Every difference between `actual` and `shape`, each as "path: what differs". Empty when they agree. */
export function differences(actual: unknown, shape: Shape, path = '$'): string[] {
  if (typeof shape === 'string') {
    const type = jsonType(actual);
    // A documented number may be written without a fraction (`step: 1.0` prints as 1).
    const ok = type === shape || (shape === 'number' && type === 'integer');
    return ok ? [] : [`${path}: expected ${shape}, got ${type} ${show(actual)}`];
  }
  if (shape instanceof Format) {
    if (typeof actual !== 'string') return [`${path}: expected a string (${shape.name}), got ${jsonType(actual)} ${show(actual)}`];
    return shape.test(actual) ? [] : [`${path}: expected ${shape.name}, got ${show(actual)}`];
  }
  if (shape instanceof Literal) {
    return JSON.stringify(actual) === JSON.stringify(shape.value) ? [] : [`${path}: expected ${show(shape.value)}, got ${show(actual)}`];
  }
  if (shape instanceof Tiny) return differences(actual, shape.shape, path);
  if (shape instanceof Optional) return actual === undefined ? [] : differences(actual, shape.shape, path);
  if (shape instanceof List) {
    if (!Array.isArray(actual)) return [`${path}: expected an array, got ${jsonType(actual)} ${show(actual)}`];
    const out: string[] = [];
    if (shape.count !== undefined && actual.length !== shape.count) out.push(`${path}: expected ${shape.count} item(s), got ${actual.length}`);
    if (shape.count === undefined && actual.length === 0) out.push(`${path}: expected at least one item, got none`);
    actual.forEach((item, i) => {
      out.push(...differences(item, shape.item, `${path}[${i}]`));
    });
    return out;
  }
  const fields = shape instanceof AtLeast ? shape.fields : shape;
  if (jsonType(actual) !== 'object') return [`${path}: expected an object, got ${jsonType(actual)} ${show(actual)}`];
  const obj = actual as Record<string, unknown>;
  const out: string[] = [];
  for (const [key, sub] of Object.entries(fields)) {
    if (!(key in obj) && !(sub instanceof Optional)) out.push(`${path}.${key}: missing`);
    else out.push(...differences(obj[key], sub, `${path}.${key}`));
  }
  if (!(shape instanceof AtLeast)) {
    for (const key of Object.keys(obj)) if (!(key in fields)) out.push(`${path}.${key}: not in the documented example (value ${show(obj[key])})`);
  }
  return out;
}
