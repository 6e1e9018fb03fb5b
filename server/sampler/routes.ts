import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { LoopsCore } from '../core/core.js';
import { invalid } from '../core/errors.js';
import { FloorNotReached } from '../core/replicas.js';
import type { Pin, ServedReply } from '../core/sampling.js';
import { sendError } from '../http/errors.js';
import { planeTargets } from '../http/plane.js';
import { ComputeLogprobsRequest, CompletionsRequest, SampleRequest, SamplerParams } from '../wire/sampler.js';

/** The sampler of each sampler id at `sampler.base_url` = `{public_url}/sampler/{sampler_id}`. */
export function samplerPlaneRoutes(appIn: FastifyInstance, core: LoopsCore): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['sampler'];
  const targetOf = planeTargets(appIn, core, 'sampler');
  const target = (req: FastifyRequest) => targetOf(req).record;

  /** X-Min-Policy-Version and X-Affinity-Key. */
  const pinOf = (req: FastifyRequest): Pin => {
    const raw = req.headers['x-min-policy-version'];
    const text = Array.isArray(raw) ? raw[0] : raw;
    if (text !== undefined && !/^\d+$/.test(text.trim()))
      throw invalid(`X-Min-Policy-Version must be a whole number >= 0 (got '${text}').`, { field: 'X-Min-Policy-Version' });
    const affinity = req.headers['x-affinity-key'];
    return { floor: text === undefined ? undefined : Number(text), affinityKey: Array.isArray(affinity) ? affinity[0] : affinity };
  };

  /** The core's answer with the replica's version in headers, or 408 when no replica reached the floor in time. */
  const answer = async <T>(reply: FastifyReply, work: Promise<ServedReply<T>>): Promise<T | FastifyReply> => {
    try {
      const served = await work;
      reply.header('x-policy-version', String(served.policyVersion));
      reply.header('x-loops-mock-replica', String(served.replica));
      return served.reply;
    } catch (err) {
      if (!(err instanceof FloorNotReached)) throw err;
      reply.header('retry-after', String(err.miss.retry_after_s));
      return sendError(reply, 408, 'policy_version_floor', err.message, { ...err.miss });
    }
  };

  app.post(
    '/sampler/:sampler_id/sample',
    {
      schema: {
        tags,
        summary: 'Sample num_samples continuations of a prompt (honours X-Min-Policy-Version and X-Affinity-Key)',
        params: SamplerParams,
        body: SampleRequest,
      },
    },
    (req, reply) => answer(reply, core.sampling.sample(target(req), req.body, pinOf(req))),
  );

  app.post(
    '/sampler/:sampler_id/compute_logprobs',
    {
      schema: { tags, summary: 'Logprob of each prompt token given those before it (null at 0)', params: SamplerParams, body: ComputeLogprobsRequest },
    },
    (req, reply) => answer(reply, core.sampling.computeLogprobs(target(req), req.body.prompt, pinOf(req))),
  );

  app.post(
    '/sampler/:sampler_id/v1/completions',
    {
      schema: { tags, summary: 'OpenAI/vLLM-compatible completions (text or token-id prompt)', params: SamplerParams, body: CompletionsRequest },
    },
    (req, reply) => answer(reply, core.sampling.complete(target(req), req.body, `cmpl-${req.id}`, pinOf(req))),
  );

  app.get(
    '/sampler/:sampler_id/v1/models',
    {
      schema: {
        tags,
        summary: "Served models in vLLM's format: the base model (parent null) and each live adapter (parent = base model)",
        params: SamplerParams,
      },
    },
    (req) => core.sampling.models(target(req)),
  );

  app.get(
    '/sampler/:sampler_id/policy_version',
    {
      schema: { tags, summary: "Each replica's live policy version, the highest, and the latest published", params: SamplerParams },
    },
    (req) => core.sampling.policyVersions(target(req)),
  );

  app.get(
    '/sampler/:sampler_id/health',
    {
      schema: { tags, summary: '200 while ACTIVE, 503 while starting (a scaled-to-zero sampler starts waking), 409 once stopped', params: SamplerParams },
    },
    (req) => {
      core.sampling.ready(target(req));
      return { status: 'ok' };
    },
  );
}
