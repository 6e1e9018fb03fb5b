import type { FastifyError, FastifyInstance, FastifyReply, RouteOptions } from 'fastify';
import { LoopsError, type ErrorKind } from '../core/errors.js';
import { describeValidationErrors } from './validation.js';

/** HTTP status of each core error kind. */
export const STATUS_OF: Record<ErrorKind, number> = {
  invalid_request: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  rate_limited: 429,
  payload_too_large: 413,
  unavailable: 503,
  // RFC 4918's Insufficient Storage: the write was refused for want of disk, reads still answer.
  insufficient_storage: 507,
};

export function sendError(reply: FastifyReply, status: number, type: string, message: string, details: Record<string, unknown> = {}): FastifyReply {
  return reply
    .code(status)
    .type('application/json')
    .send({ error: { type, message, ...details } });
}

/**
 * One error shape everywhere: `{"error": {"type", "message", ...details}}`.
 * Anything a client sent maps to a 4xx; a 500 means a bug in loops-mock.
 */
export function installErrorHandler(app: FastifyInstance, bodyLimit: number): void {
  app.setErrorHandler((err: FastifyError | LoopsError, request, reply) => {
    if (err instanceof LoopsError) {
      // An error that says when to come back says it in Retry-After too, as HTTP clients read it there.
      const retry = err.details.retry_after_s;
      if (typeof retry === 'number') reply.header('retry-after', String(retry));
      return sendError(reply, STATUS_OF[err.kind], err.kind, err.message, err.details);
    }
    if (err.validation) {
      const problem = describeValidationErrors(err.validation as never, err.validationContext ?? 'body');
      return sendError(reply, 400, 'invalid_request', problem.message, { field: problem.field, ...(problem.expected ? { expected: problem.expected } : {}) });
    }
    switch (err.code) {
      case 'FST_ERR_CTP_BODY_TOO_LARGE':
        return sendError(reply, 413, 'payload_too_large', `The request body is larger than this server's limit of ${bodyLimit} bytes (--body-limit).`, {
          limit_bytes: bodyLimit,
        });
      case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
        return sendError(
          reply,
          415,
          'unsupported_media_type',
          `Send the body as JSON with Content-Type: application/json (got ${JSON.stringify(request.headers['content-type'] ?? '')}).`,
        );
      case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
        return sendError(reply, 400, 'invalid_request', 'The Content-Length header does not match the body.');
    }
    if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) {
      return sendError(reply, err.statusCode, 'invalid_request', err.message);
    }
    request.log.error({ err }, 'internal error');
    return sendError(reply, 500, 'internal_error', `loops-mock failed on this request; this is a bug in loops-mock, please report it: ${err.message}`);
  });
}

/** Unknown routes: 404 naming the nearest route the server knows. */
export function installNotFoundHandler(app: FastifyInstance, routeOptions: RouteOptions[]): void {
  app.setNotFoundHandler((request, reply) => {
    const routes = routeOptions.flatMap((r) =>
      (Array.isArray(r.method) ? r.method : [r.method]).filter((m) => m !== 'HEAD').map((method) => ({ method, url: r.url })),
    );
    const path = request.url.split('?')[0]!;
    let best: { method: string; url: string } | undefined;
    let bestScore = Infinity;
    for (const r of routes) {
      const score = distance(path, r.url) + (r.method === request.method ? 0 : 1);
      if (score < bestScore) {
        best = r;
        bestScore = score;
      }
    }
    const nearest = best ? `${best.method} ${best.url.replace(/:(\w+)/g, '{$1}')}` : undefined;
    return sendError(
      reply,
      404,
      'route_not_found',
      `No route ${request.method} ${path}.${nearest ? ` Nearest known route: ${nearest}.` : ''} GET /openapi.json lists every route.`,
      nearest ? { nearest_route: nearest } : {},
    );
  });
}

/** Edit distance after filling the route's parameters with the path's own segments; what a wildcard absorbs counts as edits. */
function distance(path: string, route: string): number {
  const given = path.split('/');
  const parts = route.split('/');
  const wildcard = parts[parts.length - 1] === '*' ? given.slice(parts.length - 1).join('/').length : 0;
  const filled = parts.map((seg, i) => ((seg.startsWith(':') || seg === '*') && given[i] !== undefined ? given[i] : seg)).join('/');
  return levenshtein(path, wildcard ? `${filled}${path.slice(filled.length)}` : filled) + wildcard;
}

function levenshtein(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) cur[j] = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = cur;
  }
  return prev[b.length]!;
}
