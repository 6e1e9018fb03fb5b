import Fastify, { type FastifyInstance, type RouteOptions } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { ServerOptions } from '../config.js';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import { adminRoutes } from '../admin/routes.js';
import { accountRoutes } from '../control/account.js';
import { checkpointDownloadRoute, checkpointRoutes } from '../control/checkpoints.js';
import type { ControlContext } from '../control/context.js';
import { deploymentRoutes } from '../control/deployments.js';
import { samplerRoutes } from '../control/samplers.js';
import { sessionAndRunRoutes } from '../control/sessions-runs.js';
import { Views } from '../control/views.js';
import { samplerPlaneRoutes } from '../sampler/routes.js';
import { trainerRoutes } from '../trainer/routes.js';
import { VERSION } from '../version.js';
import { apiKeyOf, requirePrincipal } from './auth.js';
import { installErrorHandler, installNotFoundHandler, sendError } from './errors.js';
import { installFaults } from './fault-hook.js';
import { installJournal } from './journal-hook.js';
import { buildOpenApi } from './openapi.js';
import { serializerCompiler, validatorCompiler } from './validation.js';

export type AppOptions = Pick<ServerOptions, 'bodyLimit' | 'logLevel' | 'dataDir' | 'admin' | 'adminToken'> & {
  /** The URL base_url fields start with; a function because the port may be known only after listen. */
  publicUrl: () => string;
};

/**
 * Builds the Fastify app over a core: the error shape, the version header,
 * validation, and every front door as an encapsulated plugin.
 */
export async function buildApp(core: LoopsCore, options: AppOptions): Promise<FastifyInstance> {
  const app = Fastify({
    logger: { level: options.logLevel, stream: process.stderr },
    bodyLimit: options.bodyLimit,
    // Answered by our own hook below, in our own error shape.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    // Router-level failures (a path too long or not decodable) get our error shape too.
    frameworkErrors: (error, _request, reply) => {
      const status = error.statusCode && error.statusCode >= 400 && error.statusCode < 500 ? error.statusCode : 400;
      const type = status === 414 ? 'uri_too_long' : 'invalid_request';
      void reply.header('x-loops-mock-version', VERSION);
      void sendError(reply, status, type, `${error.message}.`);
    },
  }).withTypeProvider<TypeBoxTypeProvider>();

  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  app.decorateRequest('principal', null as never);

  let closing = false;
  // Shutting down: new requests get 503, waiting long polls are answered 503 at once.
  app.addHook('preClose', async () => {
    closing = true;
    core.beginShutdown();
  });
  app.addHook('onRequest', async (_request, reply) => {
    reply.header('x-loops-mock-version', VERSION);
    if (closing) {
      reply.header('connection', 'close');
      return sendError(reply, 503, 'unavailable', 'loops-mock is shutting down.');
    }
  });

  // JSON bodies; an empty body counts as no body (POST /sessions is sent with none).
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
    const text = (body as string).trim();
    if (!text) return done(null, null);
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(new LoopsError('invalid_request', `The body is not valid JSON: ${(err as Error).message}.`, { field: 'body' }), undefined);
    }
  });

  installErrorHandler(app, options.bodyLimit);
  // Root-level hooks: they run for every front door registered below.
  installJournal(app, core);
  installFaults(app, core);
  const routes: RouteOptions[] = [];
  app.addHook('onRoute', (route) => { routes.push(route as RouteOptions); });
  installNotFoundHandler(app, routes);

  const ctx: ControlContext = { core, views: new Views(core, options.publicUrl) };

  // Control plane: every route needs an API key.
  await app.register(async (control) => {
    control.addHook('onRequest', async (request) => { request.principal = requirePrincipal(core, request); });
    sessionAndRunRoutes(control, ctx);
    samplerRoutes(control, ctx);
    checkpointRoutes(control, ctx);
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
  if (options.admin) await app.register(async (admin) => adminRoutes(admin, core, { token: options.adminToken }));

  app.get('/openapi.json', { schema: { hide: true } as object }, () => buildOpenApi(routes, VERSION, options.publicUrl()));

  return app;
}
