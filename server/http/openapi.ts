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
const ErrorResponse = Type.Object({
  error: Type.Object({
    type: Type.String(),
    message: Type.String(),
  }, { additionalProperties: true }),
}, { title: 'Error' });

const ERROR_REPLY = { description: 'Error: {"error": {"type", "message", ...details}}', content: { 'application/json': { schema: ErrorResponse } } };

/** The OpenAPI 3.1 document of every route registered with a schema, generated from the same TypeBox schemas that validate requests. */
export function buildOpenApi(routes: RouteOptions[], version: string, serverUrl: string): object {
  const paths: Record<string, Record<string, object>> = {};
  for (const route of routes) {
    const schema = route.schema as RouteSchema | undefined;
    if (!schema || schema.hide) continue;
    const path = route.url.replace(/:(\w+)/g, '{$1}').replace(/\*$/, '{file_path}');
    const methods = (Array.isArray(route.method) ? route.method : [route.method]).filter((m) => m !== 'HEAD');
    for (const method of methods) {
      const parameters = [
        ...Object.entries(schema.params?.properties ?? {}).map(([name, s]) => ({ name: name === '*' ? 'file_path' : name, in: 'path', required: true, schema: s })),
        ...Object.entries(schema.querystring?.properties ?? {}).map(([name, s]) => ({ name, in: 'query', required: schema.querystring?.required?.includes(name) ?? false, schema: s })),
      ];
      const responses: Record<string, object> = {};
      for (const [code, body] of Object.entries(schema.response ?? { 200: {} })) {
        responses[code] = { description: 'OK', content: { 'application/json': { schema: body } } };
      }
      responses['4XX'] = ERROR_REPLY;
      responses['5XX'] = ERROR_REPLY;
      (paths[path] ??= {})[method.toLowerCase()] = {
        tags: schema.tags,
        summary: schema.summary,
        parameters,
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
    components: { securitySchemes: { BearerAuth: { type: 'http', scheme: 'bearer', description: 'Authorization: Bearer <key>; the legacy Authorization: Api-Key <key> works too.' } } },
    security: [{ BearerAuth: [] }],
    paths,
  };
}
