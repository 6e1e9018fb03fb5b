import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { DocumentNode, GraphQLError } from 'graphql';
import Type from 'typebox';
import type { LoopsCore } from '../core/core.js';
import { requirePrincipal } from '../http/auth.js';

/** The fields a GraphQL request over HTTP may carry. */
const REQUEST_FIELDS = new Set(['query', 'variables', 'operationName', 'extensions']);

/** `{"errors": [...]}` with a 200, as GraphQL servers answer what they could not run (truss raises on `errors[0]`). */
const failed = (message: string, code: string) => ({ errors: [{ message, extensions: { code, description: message } }] });

/**
 * `POST /graphql/` (and `/graphql`): the request is parsed and validated
 * against the schema with graphql-js, then executed against the core. In
 * proxy mode `https://app.baseten.co/graphql/` lands here.
 */
export function graphqlRoutes(appIn: FastifyInstance, core: LoopsCore): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  // graphql-js (130 files) and the schema are loaded at the first GraphQL request, not at start: only the Python
  // CLI asks, and a server's ready line came ~70 ms later with them.
  let loaded: Promise<{ graphql: typeof import('graphql'); schema: import('graphql').GraphQLSchema; root: unknown }> | null = null;
  const graphqlEngine = () =>
    (loaded ??= Promise.all([import('graphql'), import('./schema.js')]).then(([graphql, s]) => ({
      graphql,
      schema: s.graphqlSchema(),
      root: s.rootValue(core),
    })));
  // truss posts to `/graphql/`; the bare form is the same route (hidden from /openapi.json, where it would repeat it).
  for (const url of ['/graphql/', '/graphql']) {
    app.post(
      url,
      {
        schema: {
          tags: ['graphql'],
          summary:
            "Baseten's GraphQL API as truss calls it (listed_instances, create_model_version_from_inference_template, organization, user, range_model_metrics)",
          body: Type.Unknown(),
          ...(url === '/graphql' ? { hide: true } : {}),
        } as object,
      },
      async (req, reply) => {
        const principal = requirePrincipal(core, req);
        const body = req.body as { query?: unknown; variables?: unknown; operationName?: unknown } | null;
        // A request that is not a GraphQL request at all is a 400 (as Django's GraphQL view answers it); a query
        // that does not parse, validate or run is a 200 with errors, as GraphQL servers answer them.
        const refuse = (message: string) => reply.code(400).send(failed(message, 'BAD_REQUEST'));
        if (typeof body !== 'object' || body === null || Array.isArray(body) || typeof body.query !== 'string')
          return refuse('Send a JSON body {"query": "...", "variables": {...}}: query must be a string.');
        const unknown = Object.keys(body).filter((k) => !REQUEST_FIELDS.has(k));
        if (unknown.length) return refuse(`${unknown[0]} is not a field of a GraphQL request; send only ${[...REQUEST_FIELDS].join(', ')}.`);
        if (body.variables !== undefined && body.variables !== null && (typeof body.variables !== 'object' || Array.isArray(body.variables)))
          return refuse('variables must be an object.');
        const { graphql, schema, root } = await graphqlEngine();
        const { parse, validate, execute } = graphql;
        let document: DocumentNode;
        try {
          document = parse(body.query);
        } catch (err) {
          return failed((err as GraphQLError).message, 'GRAPHQL_PARSE_FAILED');
        }
        const problems = validate(schema, document);
        if (problems.length)
          return {
            errors: problems.map((e) => ({
              message: e.message,
              locations: e.locations,
              extensions: { code: 'GRAPHQL_VALIDATION_FAILED', description: e.message },
            })),
          };
        const result = await execute({
          schema,
          document,
          rootValue: root,
          contextValue: { principal },
          variableValues: (body.variables as Record<string, unknown> | undefined) ?? undefined,
          operationName: typeof body.operationName === 'string' ? body.operationName : undefined,
        });
        return result.errors?.length
          ? {
              ...result,
              errors: result.errors.map((e) => ({
                message: e.message,
                locations: e.locations,
                path: e.path,
                extensions: { code: 'BAD_USER_INPUT', description: e.message, ...e.extensions },
              })),
            }
          : result;
      },
    );
  }
}
