import type { RouteOptions } from 'fastify';
import Type from 'typebox';

interface RouteSchema {
  tags?: string[];
  summary?: string;
  params?: { properties?: Record<string, object> };
  querystring?: { properties?: Record<string, object>; required?: string[] };
  body?: object;
  response?: Record<string, object>;
  hide?: boolean;
}

/** The error body every route answers with on failure (http/errors.ts sends it). */
const ErrorResponse = Type.Object(
  {
    error: Type.Object(
      {
        type: Type.String(),
        message: Type.String(),
      },
      { additionalProperties: true },
    ),
  },
  { title: 'Error' },
);

const RETRY_AFTER = {
  description: 'Seconds to wait before retrying: on 408 (a version floor not reached), 429 and 503 (starting, waking, injected)',
  schema: { type: 'integer', minimum: 0 },
};
const ERROR_REPLY = {
  description: 'Error: {"error": {"type", "message", ...details}}',
  headers: { 'Retry-After': RETRY_AFTER },
  content: { 'application/json': { schema: ErrorResponse } },
};

/** The request headers the protocol gives meaning to, and where. */
const HEADER_PARAMS: Record<string, { description: string; schema: object }> = {
  'Idempotency-Key': {
    description: 'A resubmission with the same key (and body) returns the same operation instead of running it again',
    schema: { type: 'string' },
  },
  'X-Min-Policy-Version': {
    description: 'Serve only from a replica whose live policy version is at least this; 408 with Retry-After while none is',
    schema: { type: 'string', pattern: '^\\d+$' },
  },
  'X-Affinity-Key': { description: 'Requests sharing a key are served by one replica', schema: { type: 'string' } },
};
const HEADERS_BY_ROUTE: [method: string, route: RegExp, headers: string[]][] = [
  ['POST', /^\/trainer\/\{run_id\}\/(?!operations)[a-z_]+$/, ['Idempotency-Key']],
  ['POST', /^\/sampler\/\{sampler_id\}\/(sample|compute_logprobs|v1\/completions)$/, ['X-Min-Policy-Version', 'X-Affinity-Key']],
];

/** A stable operationId from the method and the path: GET /v1/loops/runs/{run_id} is getV1LoopsRunsByRunId. */
function operationId(method: string, path: string): string {
  const camel = (s: string) =>
    s
      .split(/[^A-Za-z0-9]+/)
      .filter(Boolean)
      .map((w) => w[0]!.toUpperCase() + w.slice(1))
      .join('');
  return (
    method.toLowerCase() +
    path
      .split('/')
      .filter(Boolean)
      .map((seg) => (seg.startsWith('{') ? `By${camel(seg.slice(1, -1))}` : camel(seg)))
      .join('')
  );
}

/** The OpenAPI 3.1 document of every route registered with a schema, generated from the same TypeBox schemas that validate requests. */
export function buildOpenApi(routes: RouteOptions[], version: string, serverUrl: string): object {
  const paths: Record<string, Record<string, object>> = {};
  for (const route of routes) {
    const schema = route.schema as RouteSchema | undefined;
    if (!schema || schema.hide) continue;
    const path = route.url.replace(/:(\w+)/g, '{$1}').replace(/\*$/, '{file_path}');
    const methods = (Array.isArray(route.method) ? route.method : [route.method]).filter((m) => m !== 'HEAD');
    for (const method of methods) {
      const headers = HEADERS_BY_ROUTE.filter(([m, re]) => m === method && re.test(path)).flatMap(([, , names]) => names);
      const parameters = [
        ...Object.entries(schema.params?.properties ?? {}).map(([name, s]) => ({
          name: name === '*' ? 'file_path' : name,
          in: 'path',
          required: true,
          schema: s,
        })),
        ...Object.entries(schema.querystring?.properties ?? {}).map(([name, s]) => ({
          name,
          in: 'query',
          required: schema.querystring?.required?.includes(name) ?? false,
          schema: s,
        })),
        ...headers.map((name) => ({ name, in: 'header', required: false, ...HEADER_PARAMS[name] })),
      ];
      const responses: Record<string, object> = {};
      for (const [code, body] of Object.entries(schema.response ?? { 200: {} })) {
        responses[code] = { description: 'OK', content: { 'application/json': { schema: body } } };
      }
      responses['4XX'] = ERROR_REPLY;
      responses['5XX'] = ERROR_REPLY;
      const operations = paths[path] ?? {};
      paths[path] = operations;
      operations[method.toLowerCase()] = {
        operationId: operationId(method, path),
        tags: schema.tags,
        summary: schema.summary,
        parameters,
        // The service routes and the Hub mirror take no key.
        ...(path === '/healthz' || path.startsWith('/hf/') || path.startsWith('/checkpoint-files/') ? { security: [] } : {}),
        ...(schema.body ? { requestBody: { required: false, content: { 'application/json': { schema: schema.body } } } } : {}),
        responses,
      };
    }
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'loops-mock',
      version,
      description: "A local, offline stand-in for Baseten's Loops API. Control-plane schemas follow Baseten's published management API.",
    },
    servers: [{ url: serverUrl }],
    components: {
      securitySchemes: {
        BearerAuth: { type: 'http', scheme: 'bearer', description: 'Authorization: Bearer <key>; the legacy Authorization: Api-Key <key> works too.' },
      },
    },
    security: [{ BearerAuth: [] }],
    paths,
  };
}
