import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import formats from 'ajv-formats';
import type { FastifySchemaCompiler } from 'fastify';
import { ajvOptions, loadRouteValidators, validatorKey, type BuiltValidators, type CheckKind } from './route-validators.js';

/**
 * Request validation. Bodies are checked as sent (no type coercion: "16" is
 * not a rank); query strings and path parameters arrive as text, so they are
 * coerced to the declared types first.
 */
function makeAjv(kind: CheckKind): Ajv {
  const ajv = new Ajv(ajvOptions(kind));
  // ajv-formats is CommonJS: its function sits on `default` under NodeNext.
  (formats as unknown as { default: (a: Ajv) => void }).default(ajv);
  return ajv;
}

const ajvs: Partial<Record<CheckKind, Ajv>> = {};
/** ajv itself only for a schema the built file lacks. */
const ajvFor = (kind: CheckKind): Ajv => (ajvs[kind] ??= makeAjv(kind));

/** The validators compiled when the package was built (route-validators.ts), read at the first schema's compile. */
let built: BuiltValidators | null = null;

// Plain and team-scoped routes share schema objects: compile each once (start-up time).
const compiled = { body: new WeakMap<object, ValidateFunction>(), text: new WeakMap<object, ValidateFunction>() };

/** How the schemas compiled so far came: from the built file, or compiled by ajv here. */
export const validatorSources = { built: 0, compiled: 0 };

/**
 * The schemas handed to the compiler while the build collects them (collectSchemas), once each, for it to compile
 * ahead (server/build-route-validators.ts); a server collects none.
 */
export const schemasSeen: { kind: CheckKind; schema: object }[] = [];
const seen = { body: new WeakSet<object>(), text: new WeakSet<object>() };
let collecting = false;

/** From now on every schema handed to the compiler is listed in schemasSeen. */
export function collectSchemas(): void {
  collecting = true;
}

/** Schemas handed out but not compiled yet (see compileSchemasSoon). */
const uncompiled: (() => void)[] = [];

/** How many schemas are handed out but not compiled yet. */
export function pendingSchemaCount(): number {
  return uncompiled.length;
}

/** A schema's validator: the built one for it, or compiled now. */
function validatorFor(kind: CheckKind, schema: object): ValidateFunction {
  built ??= loadRouteValidators();
  const ahead = built.get(kind, validatorKey(kind, schema));
  if (ahead) {
    validatorSources.built++;
    return ahead;
  }
  validatorSources.compiled++;
  return ajvFor(kind).compile(schema);
}

/**
 * Each schema is compiled at its first use, or in the background once the server listens
 * (compileSchemasSoon), rather than before it listens. The returned function carries the compiled one's
 * `errors` after each call, as Fastify reads them.
 */
export const validatorCompiler: FastifySchemaCompiler<unknown> = ({ schema, httpPart }) => {
  const kind: CheckKind = httpPart === 'body' ? 'body' : 'text';
  const cache = compiled[kind];
  let fn = cache.get(schema as object);
  if (collecting && !seen[kind].has(schema as object)) {
    seen[kind].add(schema as object);
    schemasSeen.push({ kind, schema: schema as object });
  }
  const compile = (): ValidateFunction => {
    fn ??= cache.get(schema as object);
    if (!fn) {
      fn = validatorFor(kind, schema as object);
      cache.set(schema as object, fn);
    }
    return fn;
  };
  const validate = (data: unknown): boolean => {
    const once = fn ?? compile();
    const valid = once(data) as boolean;
    validate.errors = once.errors;
    return valid;
  };
  validate.errors = null as ValidateFunction['errors'];
  if (!fn) uncompiled.push(compile);
  return validate as ReturnType<FastifySchemaCompiler<unknown>>;
};

/**
 * Compiles the schemas not compiled yet, from a moment after the server listens (its first answers come
 * first), a few per turn of the event loop, so that requests meanwhile are not held up. The turns are not
 * unref'd: an unref'd immediate runs only when something else wakes the loop, so most schemas were left to
 * compile in a client's first requests (the list is bounded: at most a few dozen turns keep a process up).
 */
export function compileSchemasSoon(afterMs = 100): void {
  const step = () => {
    for (let n = 0; n < 4 && uncompiled.length; n++) uncompiled.shift()!();
    if (uncompiled.length) setImmediate(step);
  };
  setTimeout(step, afterMs).unref();
}

const PART_NAMES: Record<string, string> = { body: 'body', querystring: 'query', params: 'path', headers: 'header' };

export interface ValidationProblem {
  message: string;
  field: string;
  expected?: string;
}

/** Turns ajv's errors into one sentence that names the field, what was expected and what came. */
export function describeValidationErrors(errors: ErrorObject[], context: string): ValidationProblem {
  const part = PART_NAMES[context] ?? context;
  const specific = errors.filter((e) => e.keyword !== 'anyOf' && e.keyword !== 'oneOf');
  // In a union, the branch that got furthest into the value is the one meant: its error is the deepest; at one
  // depth, a branch whose type the value has (it broke another rule) is meant rather than one of another type.
  const depth = (e: ErrorObject) => e.instancePath.split('/').length + (e.keyword === 'required' || e.keyword === 'additionalProperties' ? 1 : 0);
  const deepest = Math.max(...specific.map(depth));
  const candidates = specific.filter((e) => depth(e) === deepest);
  // Branches of a `T | null` union fail with one type error each: merged below into "integer or null".
  const first = candidates.find((e) => e.keyword !== 'type') ?? candidates[0] ?? errors[0]!;
  const samePlace = specific.filter((e) => e.instancePath === first.instancePath);
  const at = fieldPath(part, first.instancePath);
  const got = describeValue(first.data);
  if (samePlace.length > 1 && samePlace.every((e) => e.keyword === 'type' || e.keyword === 'const' || e.keyword === 'enum')) {
    const expected = samePlace
      .map((e) =>
        e.keyword === 'type'
          ? String(e.params.type)
          : e.keyword === 'const'
            ? JSON.stringify(e.params.allowedValue)
            : (e.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', '),
      )
      .join(' or ');
    // A wrong type in one branch matters more than the null branch; name the non-null constraint if the type was right.
    const nonType = samePlace.find((e) => e.keyword !== 'type');
    if (!nonType) return { field: at, expected, message: `${at} must be ${expected} (got ${got}).` };
  }
  switch (first.keyword) {
    case 'required': {
      const field = fieldPath(part, `${first.instancePath}/${String(first.params.missingProperty)}`);
      return { field, expected: 'present', message: `${field} is required.` };
    }
    case 'additionalProperties': {
      const extra = String(first.params.additionalProperty);
      const field = fieldPath(part, `${first.instancePath}/${extra}`);
      const allowed = Object.keys((first.parentSchema as { properties?: object } | undefined)?.properties ?? {});
      return { field, message: `${field} is not a known field${allowed.length ? `; allowed fields here: ${allowed.join(', ')}` : ''}.` };
    }
    case 'type':
      return { field: at, expected: String(first.params.type), message: `${at} must be ${String(first.params.type)} (got ${got}).` };
    case 'enum': {
      const allowed = (first.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ');
      return { field: at, expected: `one of ${allowed}`, message: `${at} must be one of ${allowed} (got ${got}).` };
    }
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum': {
      const op = { minimum: '>=', maximum: '<=', exclusiveMinimum: '>', exclusiveMaximum: '<' }[first.keyword];
      const expected = `${op} ${String(first.params.limit)}`;
      return { field: at, expected, message: `${at} must be ${expected} (got ${got}).` };
    }
    case 'minLength':
    case 'maxLength': {
      const expected = `${first.keyword === 'minLength' ? 'at least' : 'at most'} ${String(first.params.limit)} characters`;
      return { field: at, expected, message: `${at} must be ${expected} (got ${got}).` };
    }
    case 'minItems':
    case 'maxItems': {
      const expected = `${first.keyword === 'minItems' ? 'at least' : 'at most'} ${String(first.params.limit)} item${first.params.limit === 1 ? '' : 's'}`;
      return { field: at, expected, message: `${at} must have ${expected} (got ${Array.isArray(first.data) ? first.data.length : got}).` };
    }
    case 'format':
      return { field: at, expected: String(first.params.format), message: `${at} must be a valid ${String(first.params.format)} (got ${got}).` };
    default:
      return { field: at, message: `${at} ${first.message ?? 'is invalid'} (got ${got}).` };
  }
}

function fieldPath(part: string, instancePath: string): string {
  const segments = instancePath
    .split('/')
    .filter(Boolean)
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
  return [part, ...segments].reduce((acc, s) => (/^\d+$/.test(s) ? `${acc}[${s}]` : `${acc}.${s}`));
}

function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'nothing';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'object') return 'an object';
  const text = JSON.stringify(value);
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}
