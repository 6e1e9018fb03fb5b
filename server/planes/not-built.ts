import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { LoopsCore } from '../core/core.js';
import { LoopsError, notFound } from '../core/errors.js';
import { apiKeyOf } from '../http/auth.js';

/**
 * The trainer and sampler data planes are built in later issues. Until then
 * their URLs resolve the run or sampler (404 when unknown), count as traffic
 * in the deployment's logs and metrics, and answer a clear 501.
 */
export function notBuiltPlane(app: FastifyInstance, core: LoopsCore, kind: 'trainer' | 'sampler'): void {
  const handler = (request: FastifyRequest<{ Params: { id: string; '*'?: string } }>, reply: FastifyReply) => {
    const { id } = request.params;
    const started = performance.now();
    const owner = kind === 'trainer' ? core.fleet.findRun(id) : core.fleet.findSampler(id);
    const key = apiKeyOf(request);
    if (key === undefined && core.accounts.enforced) throw new LoopsError('unauthorized', "Missing Authorization header: this server enforces API keys; send 'Authorization: Bearer <key>'.");
    const caller = key === undefined ? undefined : core.accounts.authenticate(key);
    if (!owner || (caller && caller.org_id !== owner.org_id)) throw notFound(`No ${kind} '${id}' on this server. Its URL comes from the ${kind === 'trainer' ? 'run' : 'sampler'}'s base_url.`);
    const deploymentId = kind === 'trainer' ? (owner as { deployment_id: string }).deployment_id : core.fleet.deploymentOfSampler(id);
    const done = core.traffic.begin(deploymentId);
    const path = request.params['*'] ?? '';
    if (kind === 'trainer') core.fleet.touchRun(id);
    const message = `The ${kind} data plane of loops-mock is not built yet (${request.method} /${path}): control-plane routes work; ${kind === 'trainer' ? 'training operations' : 'sampling'} arrive in a later version.`;
    reply.raw.once('finish', () => {
      done(reply.statusCode, performance.now() - started);
      core.logs.add(deploymentId, 'WARNING', `${request.method} /${path} -> ${reply.statusCode}`, `${kind}-0`, request.id);
    });
    return reply.code(501).send({ error: { type: 'not_implemented', message, surface: kind } });
  };
  for (const url of [`/${kind}/:id`, `/${kind}/:id/*`]) {
    app.route({ method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'], url, handler });
  }
}
