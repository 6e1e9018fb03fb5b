import type { FastifyInstance } from 'fastify';
import Type from 'typebox';
import type { ServerOptions } from './config.js';
import type { LoopsCore } from './core/core.js';
import { adminRoutes } from './admin/routes.js';
import { accountRoutes } from './control/account.js';
import { checkpointDownloadRoute, checkpointRoutes } from './control/checkpoints.js';
import type { ControlContext } from './control/context.js';
import { deploymentRoutes } from './control/deployments.js';
import { modelRoutes, ModelViews } from './control/models.js';
import { samplerRoutes } from './control/samplers.js';
import { sessionAndRunRoutes } from './control/sessions-runs.js';
import { Views } from './control/views.js';
import { AnswerCache } from './http/answer-cache.js';
import { AdminTokenGate, apiKeyOf, requirePrincipal } from './http/auth.js';
import { createBaseApp, type FrontOfHouse } from './http/base-app.js';
import { dashboardRoutes } from './dashboard/routes.js';
import { buildOpenApi } from './http/openapi.js';
import type { PublicUrls } from './http/public-urls.js';
import { graphqlRoutes } from './graphql/routes.js';
import { hubRoutes } from './hub/routes.js';
import { inferenceRoutes } from './inference/routes.js';
import { samplerPlaneRoutes } from './sampler/routes.js';
import { trainerRoutes } from './trainer/routes.js';
import { VERSION } from './version.js';

export type AppOptions = Pick<
  ServerOptions,
  'bodyLimit' | 'logLevel' | 'logFormat' | 'headersTimeoutMs' | 'bodyTimeoutMs' | 'dataDir' | 'admin' | 'adminToken'
> & {
  /** The URLs base_url fields and download links carry (directUrls, or Baseten's hosts in proxy mode). */
  urls: PublicUrls;
  /** Proxy mode's forward proxy, in front of the app on its port. */
  front?: FrontOfHouse;
  /** Whether the background warm-up is still building the engines (startServer); ready when not told. */
  engine?: () => 'warming' | 'ready';
  /** Host names answered beyond localhost and IP addresses (server/http/allowed-hosts.ts). */
  allowedHosts?: readonly string[];
  /** The caller logs the engines' graph builds itself (startServer's warm-up, which begins before the app). */
  graphBuildsLogged?: boolean;
};

/** Builds the Fastify app over a core: the shared base (http/), then every front door as an encapsulated plugin. */
export async function buildApp(core: LoopsCore, options: AppOptions): Promise<FastifyInstance> {
  const { app, routes } = createBaseApp(core, options);
  const ctx: ControlContext = { core, views: new Views(core, options.urls), answers: new AnswerCache(core) };
  const modelViews = new ModelViews(core, options.urls);

  // Control plane: every route needs an API key.
  await app.register(async (control) => {
    control.addHook('onRequest', async (request) => {
      request.principal = requirePrincipal(core, request);
    });
    sessionAndRunRoutes(control, ctx);
    samplerRoutes(control, ctx, modelViews);
    checkpointRoutes(control, ctx, modelViews);
    modelRoutes(control, ctx, modelViews);
    deploymentRoutes(control, ctx, options.dataDir);
    accountRoutes(control, ctx);
  });

  // Presigned downloads carry their permission in the URL.
  await app.register(async (files) => {
    checkpointDownloadRoute(files, ctx, (request) => {
      const key = apiKeyOf(request);
      return key === undefined ? undefined : core.accounts.authenticate(key);
    });
  });

  await app.register(async (trainer) => trainerRoutes(trainer, core));
  await app.register(async (sampler) => samplerPlaneRoutes(sampler, core));
  // Checkpoints deployed to inference: OpenAI-compatible, on Baseten's URL shape for a model deployment.
  await app.register(async (inference) => inferenceRoutes(inference, core));
  // Baseten's GraphQL API, as much as truss's `loops checkpoints deploy` and `whoami` use.
  await app.register(async (graphql) => graphqlRoutes(graphql, core));
  // The Hugging Face mirror needs no key: clients send it Hub tokens, if anything.
  await app.register(async (hub) => hubRoutes(hub, core));
  // One check of the admin token for both, so that wrong guesses count wherever they are tried.
  const gate = options.adminToken === undefined ? undefined : new AdminTokenGate(options.adminToken);
  if (options.admin) await app.register(async (admin) => adminRoutes(admin, core, { gate }));
  // The live dashboard: read-only unless --admin; with --api-key, the admin token's.
  await app.register(async (dashboard) => dashboardRoutes(dashboard, core, { admin: options.admin, gate, views: ctx.views, models: modelViews }));

  // For CI services and scripts that wait for the server: no key, nothing but liveness (503 once shutting down).
  // engine: warming while --warm builds the engines in the background (requests work meanwhile, slower), then ready.
  const engineState = options.engine ?? (() => 'ready' as const);
  app.get(
    '/healthz',
    {
      schema: {
        tags: ['service'],
        summary: 'Liveness for scripts and CI: no key needed; 200 while the engines warm too',
        response: {
          200: Type.Object({
            status: Type.Literal('ok'),
            engine: Type.Union([Type.Literal('warming'), Type.Literal('ready')]),
            version: Type.String(),
            // Alive on a full disk too (reads answer, writes get 507): whether writes go through, and how many the disk refused.
            storage: Type.Object({
              writable: Type.Boolean(),
              refused_writes: Type.Integer(),
              background_write_failures: Type.Integer(),
              journal_file_failures: Type.Integer(),
            }),
          }),
        },
      },
    },
    () => ({
      status: 'ok' as const,
      engine: engineState(),
      version: VERSION,
      storage: { ...core.store.health, journal_file_failures: core.journal.fileFailures.failures },
    }),
  );
  // Browsers ask every page's host for an icon: an empty answer, never a 404 in the journal (journal-hook skips it).
  app.get('/favicon.ico', { schema: { hide: true } as object }, (_request, reply) => reply.code(204).send());

  app.get('/openapi.json', { schema: { hide: true } as object }, () => buildOpenApi(routes, VERSION, options.urls.root()));

  return app;
}
