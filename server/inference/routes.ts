import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Type from 'typebox';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import { PassThrough } from 'node:stream';
import { InferenceError, type InferenceAnswer } from '../core/inference.js';
import type { ModelDeploymentRecord } from '../core/records.js';
import { requirePrincipal } from '../http/auth.js';
import { STATUS_OF } from '../http/errors.js';
import { chatCompletion, event, streamChunks, textCompletion } from './openai-shapes.js';

interface Params {
  model_id: string;
  deployment_id?: string;
}

/** Any JSON: the core checks each field itself, so a bad one gets OpenAI's error shape naming it. */
const OPENAI_BODY = Type.Unknown();

/** What OpenAI's clients raise from: vLLM's error body (`{"error": {message, type, param, code}}`). */
const ERROR_TYPES: Record<number, string> = {
  400: 'BadRequestError',
  401: 'UnauthorizedError',
  404: 'NotFoundError',
  409: 'ConflictError',
  503: 'ServiceUnavailableError',
};

/**
 * The inference front door of checkpoints deployed to inference: vLLM's
 * OpenAI-compatible server behind Baseten's URL shape,
 * `/model/{model_id}/deployment/{deployment_id}/sync/v1/...` (and the
 * model's production environment, `/model/{model_id}/environments/production/sync/v1/...`).
 * In proxy mode `https://model-{model_id}.api.baseten.co/deployment/{deployment_id}/sync/...` lands here.
 */
export function inferenceRoutes(appIn: FastifyInstance, core: LoopsCore): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['inference'];
  const target = (req: FastifyRequest): ModelDeploymentRecord => {
    const p = req.params as Params;
    return core.inference.target(requirePrincipal(core, req), p.model_id, p.deployment_id);
  };

  for (const base of ['/model/:model_id/deployment/:deployment_id/sync/v1', '/model/:model_id/environments/production/sync/v1']) {
    app.post(
      `${base}/chat/completions`,
      { schema: { tags, summary: 'OpenAI-compatible chat completions on a deployed checkpoint (model = its checkpoint name)', body: OPENAI_BODY } as object },
      (req, reply) =>
        answer(reply, async () => {
          const r = target(req);
          const a = await core.inference.chat(r, req.body, `chatcmpl-${req.id}`);
          return a.stream ? streamed(reply, a, 'chat') : chatCompletion(a.result);
        }),
    );

    app.post(
      `${base}/completions`,
      { schema: { tags, summary: 'OpenAI-compatible completions on a deployed checkpoint (text or token-id prompt)', body: OPENAI_BODY } as object },
      (req, reply) =>
        answer(reply, async () => {
          const r = target(req);
          const a = await core.inference.complete(r, req.body, `cmpl-${req.id}`);
          return a.stream ? streamed(reply, a, 'completion') : textCompletion(a.result);
        }),
    );

    app.get(`${base}/models`, { schema: { tags, summary: 'The served models: each deployed checkpoint name, then the base model' } as object }, (req, reply) =>
      answer(reply, async () => core.inference.models(target(req))),
    );
  }
}

/**
 * Server-sent events, vLLM's way: each chunk written as soon as the core hands it out, `data: [DONE]` last.
 * A client that goes away closes the stream (Fastify destroys it), which aborts the generation.
 */
function streamed(reply: FastifyReply, answer: Extract<InferenceAnswer, { stream: true }>, kind: 'chat' | 'completion'): FastifyReply {
  const s = answer.events;
  const out = new PassThrough();
  const closed = new AbortController();
  out.once('close', () => closed.abort(new Error('the client closed the stream')));
  const write = (data: object) => {
    if (!out.destroyed) out.write(event(data));
  };
  streamChunks.start(s, kind).forEach(write);
  s.run((d) => write(streamChunks.delta(s, kind, d)), closed.signal).then(
    ({ completionTokens }) => {
      if (s.includeUsage) write(streamChunks.usage(s, kind, completionTokens));
      if (!out.destroyed) out.end(event('[DONE]'));
    },
    (err: Error) => {
      if (closed.signal.aborted) return;
      // Headers are sent: vLLM reports a failure mid-stream as an error event, then ends the stream.
      write({ error: { message: err.message, type: 'InternalServerError', param: null, code: 500 } });
      if (!out.destroyed) out.end(event('[DONE]'));
    },
  );
  return reply.type('text/event-stream; charset=utf-8').header('cache-control', 'no-cache').send(out);
}

/** Runs a handler and shapes its errors: Baseten's edge ones as `{"error": "<message>"}`, vLLM's in OpenAI's shape. */
async function answer(reply: FastifyReply, work: () => Promise<unknown>): Promise<unknown> {
  try {
    return await work();
  } catch (err) {
    if (err instanceof InferenceError) {
      if (err.edge) return reply.code(err.status).type('application/json').send({ error: err.message });
      return reply
        .code(err.status)
        .type('application/json')
        .send({ error: { message: err.message, type: ERROR_TYPES[err.status] ?? 'BadRequestError', param: err.param, code: err.status } });
    }
    // A bad or missing key is the gateway's answer too.
    if (err instanceof LoopsError && (err.kind === 'unauthorized' || err.kind === 'forbidden'))
      return reply.code(STATUS_OF[err.kind]).type('application/json').send({ error: err.message });
    if (err instanceof LoopsError) {
      const status = STATUS_OF[err.kind];
      return reply
        .code(status)
        .type('application/json')
        .send({
          error: {
            message: err.message,
            type: ERROR_TYPES[status] ?? 'BadRequestError',
            param: (err.details.field as string | undefined) ?? null,
            code: status,
          },
        });
    }
    throw err;
  }
}
