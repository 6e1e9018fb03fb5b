import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { REFERENCE_PATH, referenceAvailable, startTestServer } from './helpers.js';

/**
 * Our schemas against Baseten's published management API: every route, query
 * parameter, body field and response field must exist under the same name,
 * with the same required set, types and enums. Runs wherever the reference
 * sits beside the checkout (as in CI); LOOPS_OPENAPI_REFERENCE may point at it.
 */
type Schema = Record<string, any>;

let server: RunningServer;
let ours: Schema;
let reference: Schema;

beforeAll(async () => {
  server = await startTestServer();
  ours = (await server.app.inject({ method: 'GET', url: '/openapi.json' })).json();
  if (referenceAvailable) reference = JSON.parse(readFileSync(REFERENCE_PATH, 'utf8'));
});
afterAll(() => server.close());

function deref(doc: Schema, s: Schema | undefined): Schema | undefined {
  let out = s;
  while (out?.$ref) out = out.$ref.split('/').slice(1).reduce((node: Schema, key: string) => node[key], doc);
  return out;
}

/** A comparable summary of a schema: types, enums, properties, required, items. */
function shape(doc: Schema, raw: Schema | undefined, depth = 0): unknown {
  const s = deref(doc, raw);
  if (!s || depth > 6) return null;
  if (s.anyOf) return { anyOf: s.anyOf.map((x: Schema) => shape(doc, x, depth + 1)).sort((a: unknown, b: unknown) => JSON.stringify(a).localeCompare(JSON.stringify(b))) };
  const out: Record<string, unknown> = {};
  if (s.enum) out.enum = [...s.enum].sort();
  else if (s.type) out.type = s.type === 'number' ? 'number' : s.type;
  if (s.properties) {
    out.properties = Object.fromEntries(Object.keys(s.properties).sort().map((k) => [k, shape(doc, s.properties[k], depth + 1)]));
    out.required = [...(s.required ?? [])].sort();
  }
  if (s.items) out.items = shape(doc, s.items, depth + 1);
  if (s.additionalProperties && typeof s.additionalProperties === 'object') out.values = shape(doc, s.additionalProperties, depth + 1);
  return out;
}

/** Our Record<string, T> compiles to patternProperties; read it as additionalProperties. */
function normalise(s: Schema | undefined): Schema | undefined {
  if (!s || typeof s !== 'object') return s;
  if (Array.isArray(s)) return s.map(normalise) as unknown as Schema;
  const out: Schema = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === 'patternProperties') { const inner = Object.values(v as Schema)[0] as Schema; out.additionalProperties = Object.keys(inner).length ? normalise(inner) : true; }
    else if (k === 'const' && typeof v === 'string') out.enum = [v];
    else out[k] = normalise(v as Schema);
  }
  return out;
}

function operations(doc: Schema): [string, string, Schema][] {
  return Object.entries<Schema>(doc.paths).flatMap(([path, item]) => Object.entries<Schema>(item).filter(([m]) => m !== 'parameters').map(([m, op]) => [path, m, op] as [string, string, Schema]));
}

const jsonSchema = (op: Schema, doc: Schema, kind: 'request' | 'response') =>
  deref(doc, kind === 'request' ? op.requestBody?.content?.['application/json']?.schema : op.responses?.['200']?.content?.['application/json']?.schema);

describe.skipIf(!referenceAvailable)('against Baseten\'s published schema', () => {
  it('serves every route of the reference', () => {
    const have = new Set(operations(ours).map(([p, m]) => `${m} ${p}`));
    const missing = operations(reference).map(([p, m]) => `${m} ${p}`).filter((k) => !have.has(k));
    expect(missing).toEqual([]);
  });

  it('names every query parameter as the reference does', () => {
    for (const [path, method, op] of operations(reference)) {
      const theirs = (op.parameters ?? []).map((p: Schema) => deref(reference, p)!).filter((p: Schema) => p.in === 'query').map((p: Schema) => p.name).sort();
      const mine = ours.paths[path][method].parameters.filter((p: Schema) => p.in === 'query').map((p: Schema) => p.name).sort();
      expect(mine, `${method} ${path}`).toEqual(theirs);
    }
  });

  it('matches request bodies field by field, with the same required fields and defaults', () => {
    for (const [path, method, op] of operations(reference)) {
      const theirs = jsonSchema(op, reference, 'request');
      if (!theirs) continue;
      let mine = jsonSchema(ours.paths[path][method], ours, 'request')!;
      // Ours also admits an empty body (null) where upstream's body is optional.
      if (mine.anyOf) mine = mine.anyOf.find((s: Schema) => s.type === 'object');
      expect(shape(ours, normalise(mine)), `${method} ${path}`).toEqual(shape(reference, theirs));
      for (const [name, prop] of Object.entries<Schema>(theirs.properties ?? {})) {
        if ('default' in prop && prop.default !== null) expect(mine.properties[name].default, `${path} ${name}`).toEqual(prop.default);
      }
    }
  });

  it('matches 200 responses field by field, with the same required fields, types and enums', () => {
    for (const [path, method, op] of operations(reference)) {
      const theirs = jsonSchema(op, reference, 'response');
      const mine = jsonSchema(ours.paths[path][method], ours, 'response');
      expect(shape(ours, normalise(mine)), `${method} ${path}`).toEqual(shape(reference, theirs));
    }
  });
});
