/**
 * Comparable summaries of OpenAPI schemas (types, enums, properties, required
 * sets, items): what the reference-schema test compares between Baseten's
 * published document and ours, and what reference-facts.json keeps of theirs.
 */
export type Schema = Record<string, any>;

export function deref(doc: Schema, s: Schema | undefined): Schema | undefined {
  let out = s;
  while (out?.$ref)
    out = out.$ref
      .split('/')
      .slice(1)
      .reduce((node: Schema, key: string) => node[key], doc);
  return out;
}

/** A comparable summary of a schema: types, enums, properties, required, items. */
export function shape(doc: Schema, raw: Schema | undefined, depth = 0): unknown {
  const s = deref(doc, raw);
  if (!s || depth > 6) return null;
  if (s.anyOf)
    return { anyOf: s.anyOf.map((x: Schema) => shape(doc, x, depth + 1)).sort((a: unknown, b: unknown) => JSON.stringify(a).localeCompare(JSON.stringify(b))) };
  const out: Record<string, unknown> = {};
  if (s.enum) out.enum = [...s.enum].sort();
  else if (s.type) out.type = s.type === 'number' ? 'number' : s.type;
  if (s.properties) {
    out.properties = Object.fromEntries(
      Object.keys(s.properties)
        .sort()
        .map((k) => [k, shape(doc, s.properties[k], depth + 1)]),
    );
    out.required = [...(s.required ?? [])].sort();
  }
  if (s.items) out.items = shape(doc, s.items, depth + 1);
  if (s.additionalProperties && typeof s.additionalProperties === 'object') out.values = shape(doc, s.additionalProperties, depth + 1);
  return out;
}

/** Our Record<string, T> compiles to patternProperties; read it as additionalProperties. */
export function normalise(s: Schema | undefined): Schema | undefined {
  if (!s || typeof s !== 'object') return s;
  if (Array.isArray(s)) return s.map(normalise) as unknown as Schema;
  const out: Schema = {};
  for (const [k, v] of Object.entries(s)) {
    if (k === 'patternProperties') {
      const inner = Object.values(v as Schema)[0] as Schema;
      out.additionalProperties = Object.keys(inner).length ? normalise(inner) : true;
    } else if (k === 'const' && typeof v === 'string') out.enum = [v];
    else out[k] = normalise(v as Schema);
  }
  return out;
}

export function operations(doc: Schema): [string, string, Schema][] {
  return Object.entries<Schema>(doc.paths).flatMap(([path, item]) =>
    Object.entries<Schema>(item)
      .filter(([m]) => m !== 'parameters')
      .map(([m, op]) => [path, m, op] as [string, string, Schema]),
  );
}

export const jsonSchema = (op: Schema, doc: Schema, kind: 'request' | 'response') =>
  deref(doc, kind === 'request' ? op.requestBody?.content?.['application/json']?.schema : op.responses?.['200']?.content?.['application/json']?.schema);

/** What the test needs of Baseten's published document, per operation (`method path`): committed as server/test/data/reference-facts.json. */
export interface ReferenceFacts {
  source: string;
  operations: Record<
    string,
    {
      query: string[];
      request: unknown;
      defaults: Record<string, unknown>;
      response: unknown;
    }
  >;
}

export function referenceFacts(reference: Schema, source: string): ReferenceFacts {
  const facts: ReferenceFacts = { source, operations: {} };
  for (const [path, method, op] of operations(reference)) {
    const request = jsonSchema(op, reference, 'request');
    const defaults: Record<string, unknown> = {};
    for (const [name, prop] of Object.entries<Schema>(request?.properties ?? {})) if ('default' in prop && prop.default !== null) defaults[name] = prop.default;
    facts.operations[`${method} ${path}`] = {
      query: (op.parameters ?? [])
        .map((p: Schema) => deref(reference, p)!)
        .filter((p: Schema) => p.in === 'query')
        .map((p: Schema) => p.name)
        .sort(),
      request: request ? shape(reference, request) : null,
      defaults,
      response: shape(reference, jsonSchema(op, reference, 'response')),
    };
  }
  return facts;
}
