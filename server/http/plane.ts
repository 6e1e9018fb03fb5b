import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { LoopsCore } from '../core/core.js';
import { LoopsError, notFound } from '../core/errors.js';
import type { Principal, RunRecord, SamplerRecord } from '../core/records.js';
import { apiKeyOf } from './auth.js';

export type PlaneKind = 'trainer' | 'sampler';

export interface PlaneTarget<T> {
  record: T;
  /** The caller when a key was sent; planes accept requests without one unless keys are enforced. */
  caller: Principal | undefined;
}

/**
 * What every data-plane request goes through: the key (optional unless
 * --api-key is set), the run or sampler behind the URL (404 when unknown or
 * another organisation's), and its deployment's traffic counters and logs.
 */
export function resolvePlane(core: LoopsCore, kind: 'trainer', request: FastifyRequest, reply: FastifyReply, id: string): PlaneTarget<RunRecord>;
export function resolvePlane(core: LoopsCore, kind: 'sampler', request: FastifyRequest, reply: FastifyReply, id: string): PlaneTarget<SamplerRecord>;
export function resolvePlane(
  core: LoopsCore,
  kind: PlaneKind,
  request: FastifyRequest,
  reply: FastifyReply,
  id: string,
): PlaneTarget<RunRecord | SamplerRecord> {
  const started = performance.now();
  const record = kind === 'trainer' ? core.fleet.findRun(id) : core.fleet.findSampler(id);
  const key = apiKeyOf(request);
  if (key === undefined && core.accounts.enforced)
    throw new LoopsError('unauthorized', "Missing Authorization header: this server enforces API keys; send 'Authorization: Bearer <key>'.");
  const caller = key === undefined ? undefined : core.accounts.authenticate(key);
  if (!record || (caller && caller.org_id !== record.org_id))
    throw notFound(`No ${kind} '${id}' on this server. Its URL comes from the ${kind === 'trainer' ? 'run' : 'sampler'}'s base_url.`);
  const deploymentId = kind === 'trainer' ? (record as RunRecord).deployment_id : core.fleet.deploymentOfSampler(id);
  const done = core.traffic.begin(deploymentId);
  const path = request.url.split('?')[0]!.split('/').slice(3).join('/');
  if (kind === 'trainer') core.fleet.touchRun(id);
  else core.fleet.touchSampler(id);
  // 'finish' when the answer went out, 'close' when the client left first: counted once either way.
  let counted = false;
  const count = () => {
    if (counted) return;
    counted = true;
    done(reply.statusCode, performance.now() - started);
    core.logs.add(deploymentId, reply.statusCode >= 400 ? 'WARNING' : 'INFO', `${request.method} /${path} -> ${reply.statusCode}`, `${kind}-0`, request.id);
  };
  reply.raw.once('finish', count);
  reply.raw.once('close', count);
  return { record, caller };
}

/**
 * Resolves every request of a plane plugin before validation (so that refused
 * requests are counted and logged like any other); the returned function
 * reads the result in a handler.
 */
export function planeTargets(app: FastifyInstance, core: LoopsCore, kind: 'trainer'): (req: FastifyRequest) => PlaneTarget<RunRecord>;
export function planeTargets(app: FastifyInstance, core: LoopsCore, kind: 'sampler'): (req: FastifyRequest) => PlaneTarget<SamplerRecord>;
export function planeTargets(app: FastifyInstance, core: LoopsCore, kind: PlaneKind): (req: FastifyRequest) => PlaneTarget<RunRecord | SamplerRecord> {
  const param = kind === 'trainer' ? 'run_id' : 'sampler_id';
  const targets = new WeakMap<FastifyRequest, PlaneTarget<RunRecord | SamplerRecord>>();
  app.addHook('onRequest', async (req, reply) => {
    const id = (req.params as Record<string, string | undefined>)[param];
    if (id !== undefined) targets.set(req, kind === 'trainer' ? resolvePlane(core, 'trainer', req, reply, id) : resolvePlane(core, 'sampler', req, reply, id));
  });
  return (req) => targets.get(req)!;
}
