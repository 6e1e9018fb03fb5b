import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { LoopsCore } from '../core/core.js';
import { resolvePlane } from './plane.js';

/**
 * The sampler data plane is built in a later version. Until then its URLs
 * resolve the sampler (404 when unknown), count as traffic in the
 * deployment's logs and metrics, and answer a clear 501.
 */
export function notBuiltSamplerPlane(app: FastifyInstance, core: LoopsCore): void {
  const handler = (request: FastifyRequest<{ Params: { id: string; '*'?: string } }>, reply: FastifyReply) => {
    resolvePlane(core, 'sampler', request, reply, request.params.id);
    const message = `The sampler data plane of loops-mock is not built yet (${request.method} /${request.params['*'] ?? ''}): control plane and trainer work; sampling arrives in a later version.`;
    return reply.code(501).send({ error: { type: 'not_implemented', message, surface: 'sampler' } });
  };
  for (const url of ['/sampler/:id', '/sampler/:id/*']) {
    app.route({ method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'], url, handler });
  }
}
