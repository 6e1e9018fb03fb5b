/**
 * The routes' request validators compiled ahead, when the package is built (server/build-route-validators.ts),
 * into one file of plain functions: ajv compiling the ~140 route schemas held the server's thread for ~100 ms of
 * every start, before a client's first request could be answered. Each function is found by a digest of its
 * schema's JSON and of the kind of check (bodies as sent, or text coerced), so a schema edited since the build
 * misses and is compiled as before: the file can be stale, never wrong. A file built by another ajv or other
 * options (its `about` line) is not read at all.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import type { Options, ValidateFunction } from 'ajv';
import { packageRoot } from '../../models/package-root.js';

const require = createRequire(import.meta.url);

/** The kinds of check: request bodies as sent, and query strings and path parameters coerced from text. */
export type CheckKind = 'body' | 'text';

/** ajv's options for a kind of check: the same whether ajv compiles at start-up or ahead. */
export function ajvOptions(kind: CheckKind): Options {
  // No pass over the generated code to drop unused names: the same checks, and a schema compiled at start-up
  // (one the built file lacks) takes about half the time.
  return {
    coerceTypes: kind === 'text',
    useDefaults: false,
    removeAdditional: false,
    allErrors: false,
    verbose: true,
    strict: false,
    code: { optimize: false },
  };
}

/**
 * How the build's code differs from ajv's at start-up: compiled once, ajv's optimizing pass is worth it there (a
 * smaller file to read at start-up); the formats come from ajv-formats' module.
 */
export const AHEAD_CODE = { optimize: true, formats: 'require("ajv-formats/dist/formats").fullFormats' } as const;

/** What a built file must say it was made with to be read: the ajv and ajv-formats versions and the options. */
export function validatorsAbout(): string {
  const version = (name: string) => (require(`${name}/package.json`) as { version: string }).version;
  return JSON.stringify({
    layout: 1,
    ajv: version('ajv'),
    formats: version('ajv-formats'),
    body: ajvOptions('body'),
    text: ajvOptions('text'),
    ahead: AHEAD_CODE,
  });
}

/** A schema's name in the built file: a digest of the kind of check and the schema as JSON. */
export function validatorKey(kind: CheckKind, schema: object): string {
  return `v${createHash('sha1').update(kind).update('\n').update(JSON.stringify(schema)).digest('hex')}`;
}

/** Where the build writes the file: this package's dist/. */
export function routeValidatorsFile(): string | null {
  const root = packageRoot(import.meta.url);
  return root ? join(root.dir, 'dist', 'route-validators.cjs') : null;
}

/** The built validators by kind and key; empty when the file is missing, unreadable or made by other versions. */
export interface BuiltValidators {
  get(kind: CheckKind, key: string): ValidateFunction | undefined;
  /** Why the file was not used, when it was not; null when it was. */
  refused: string | null;
}

export function loadRouteValidators(file: string | null = routeValidatorsFile()): BuiltValidators {
  const none = (refused: string): BuiltValidators => ({ get: () => undefined, refused });
  if (!file || !existsSync(file)) return none('not built');
  let table: { about?: unknown; body?: Record<string, ValidateFunction>; text?: Record<string, ValidateFunction> };
  try {
    table = require(file) as typeof table;
  } catch (err) {
    return none(`unreadable: ${(err as Error).message}`);
  }
  if (table.about !== validatorsAbout()) return none('built with other versions or options');
  return {
    get: (kind, key) => {
      const fn = table[kind]?.[key];
      return typeof fn === 'function' ? fn : undefined;
    },
    refused: null,
  };
}
