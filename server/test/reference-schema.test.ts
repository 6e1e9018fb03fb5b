import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { REFERENCE_PATH, referenceAvailable, REPO_ROOT, startTestServer } from './helpers.js';
import { jsonSchema, normalise, operations, referenceFacts, shape, type ReferenceFacts, type Schema } from './reference-shapes.js';

/**
 * Our schemas against Baseten's published management API: every route,
 * query parameter, body field and response field must exist under the same
 * name, with the same required set, types and enums. What the comparison
 * needs of the published document is committed as data
 * (data/reference-facts.json), so it runs in every clone; where the document
 * itself sits beside the checkout (`../shared/reference`, or
 * LOOPS_OPENAPI_REFERENCE), the data is first checked against it, and
 * LOOPS_REFERENCE_FACTS_WRITE=1 writes it afresh.
 */
const FACTS_PATH = join(REPO_ROOT, 'server', 'test', 'data', 'reference-facts.json');

/**
 * Response fields Baseten's pages document that the published schema lacks: `operation → dotted paths`
 * (`items` steps into an array), each with its page. The comparison leaves them out of ours, and checks
 * each is there, so an entry cannot outlive its field.
 */
const DOCUMENTED_ADDITIONS: Record<string, string[]> = {
  // https://docs.baseten.co/loops/availability-modes/serverless: "Each model in the response has a serverless field."
  'get /v1/loops/capabilities': ['supported_models.items.serverless'],
};

/** A shape (reference-shapes.ts) without the field at `path`; throws if the field is not there. */
function withoutField(summary: unknown, path: string): unknown {
  const copy = structuredClone(summary) as Schema;
  const steps = path.split('.');
  const name = steps.pop()!;
  let node = copy;
  for (const step of steps) node = step === 'items' ? node.items : node.properties?.[step];
  if (!node?.properties || !(name in node.properties)) throw new Error(`documented addition ${path} is not in our schema: take it out of DOCUMENTED_ADDITIONS`);
  delete node.properties[name];
  node.required = node.required.filter((r: string) => r !== name);
  return copy;
}

let server: RunningServer;
let ours: Schema;
let facts: ReferenceFacts;

beforeAll(async () => {
  server = await startTestServer();
  ours = (await server.app.inject({ method: 'GET', url: '/openapi.json' })).json();
  if (referenceAvailable && process.env.LOOPS_REFERENCE_FACTS_WRITE === '1') {
    writeFileSync(FACTS_PATH, `${JSON.stringify(referenceFacts(JSON.parse(readFileSync(REFERENCE_PATH, 'utf8')), 'baseten-loops-openapi.json'), null, 1)}\n`);
  }
  if (!existsSync(FACTS_PATH))
    throw new Error(`${FACTS_PATH} is missing: run the test with the reference beside the checkout and LOOPS_REFERENCE_FACTS_WRITE=1`);
  facts = JSON.parse(readFileSync(FACTS_PATH, 'utf8')) as ReferenceFacts;
  // Where the published document is at hand, the committed facts must be what it says, or every test below fails.
  if (referenceAvailable) {
    const derived = referenceFacts(JSON.parse(readFileSync(REFERENCE_PATH, 'utf8')) as Schema, facts.source);
    if (JSON.stringify(derived) !== JSON.stringify(facts))
      throw new Error(`${FACTS_PATH} no longer matches ${REFERENCE_PATH}: write it afresh with LOOPS_REFERENCE_FACTS_WRITE=1`);
  }
});
afterAll(() => server.close());

describe("against Baseten's published schema", () => {
  it('serves every route of the reference', () => {
    const have = new Set(operations(ours).map(([p, m]) => `${m} ${p}`));
    expect(Object.keys(facts.operations).filter((k) => !have.has(k))).toEqual([]);
    expect(Object.keys(facts.operations).length).toBeGreaterThan(25);
  });

  it('names every query parameter as the reference does', () => {
    for (const [key, theirs] of Object.entries(facts.operations)) {
      const [method, path] = key.split(' ') as [string, string];
      const mine = ours.paths[path][method].parameters
        .filter((p: Schema) => p.in === 'query')
        .map((p: Schema) => p.name)
        .sort();
      expect(mine, key).toEqual(theirs.query);
    }
  });

  it('matches request bodies field by field, with the same required fields and defaults', () => {
    for (const [key, theirs] of Object.entries(facts.operations)) {
      if (!theirs.request) continue;
      const [method, path] = key.split(' ') as [string, string];
      let mine = jsonSchema(ours.paths[path][method], ours, 'request')!;
      // Ours also admits an empty body (null) where upstream's body is optional.
      if (mine.anyOf) mine = mine.anyOf.find((s: Schema) => s.type === 'object');
      expect(shape(ours, normalise(mine)), key).toEqual(theirs.request);
      for (const [name, value] of Object.entries(theirs.defaults)) expect(mine.properties[name].default, `${key} ${name}`).toEqual(value);
    }
  });

  it('matches 200 responses field by field, with the same required fields, types and enums', () => {
    for (const [key, theirs] of Object.entries(facts.operations)) {
      const [method, path] = key.split(' ') as [string, string];
      const mine = (DOCUMENTED_ADDITIONS[key] ?? []).reduce(withoutField, shape(ours, normalise(jsonSchema(ours.paths[path][method], ours, 'response'))));
      expect(mine, key).toEqual(theirs.response);
    }
  });
});
