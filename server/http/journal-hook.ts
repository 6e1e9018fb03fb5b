import type { IncomingMessage } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { LoopsCore } from '../core/core.js';
import type { FaultAction } from '../core/faults.js';
import type { JournalEntry, Surface } from '../core/journal.js';

/** What the journal and the fault rules learn about one request while it is handled. */
export interface RequestTrace {
  seq: number;
  time: string;
  started: number;
  surface: Surface;
  fault?: { id: string; action: FaultAction };
  response?: JournalEntry['response'];
  responseBody?: unknown;
  operationId?: string;
}

declare module 'fastify' {
  interface FastifyRequest {
    trace: RequestTrace;
  }
}

export function surfaceOf(url: string): Surface {
  if (url.startsWith('/_mock/') || url === '/_mock') return 'admin';
  if (url.startsWith('/trainer/')) return 'trainer';
  // A checkpoint deployed to inference is sampling too: its OpenAI-compatible door counts with the samplers.
  if (url.startsWith('/sampler/') || url.startsWith('/model/')) return 'sampler';
  if (url.startsWith('/hf/') || url === '/hf') return 'hub';
  if (url === '/healthz' || url === '/openapi.json' || url.startsWith('/healthz?')) return 'service';
  return 'control';
}

/** The admin route that answers with journal entries. */
const JOURNAL_ROUTE = '/_mock/journal';

// The browser's icon request belongs with the page that caused it.
const isDashboard = (url: string) =>
  url === '/favicon.ico' || url === '/_mock/ui' || url.startsWith('/_mock/ui/') || url.startsWith('/_mock/ui?') || url.startsWith('/_mock/dashboard/');

function decodedPath(url: string): string {
  const path = url.split('?')[0]!;
  try {
    return decodeURIComponent(path);
  } catch {
    return path;
  }
}

/** A Fastify route template in the braces form /openapi.json uses. */
export function routeTemplate(request: FastifyRequest): string | null {
  const url = request.routeOptions.url;
  return url === undefined ? null : url.replace(/:(\w+)/g, '{$1}');
}

/** The trainer operation or sampler route a request is about, for journal lines and fault matching. */
export function opOf(core: LoopsCore, request: FastifyRequest, route: string | null): string | undefined {
  if (!route) return undefined;
  const params = request.params as Record<string, string | undefined>;
  if (route === '/trainer/{run_id}/operations/{operation_id}') return params.operation_id ? core.operations.find(params.operation_id)?.op : undefined;
  if (route.startsWith('/trainer/{run_id}/') || route.startsWith('/sampler/{sampler_id}/')) return route.split('/').pop();
  return undefined;
}

function authScheme(request: FastifyRequest): JournalEntry['headers']['auth'] {
  const h = request.headers.authorization;
  if (!h) return 'none';
  return /^api-key\s/i.test(h) ? 'api-key' : 'bearer';
}

const header = (request: FastifyRequest, name: string) => {
  const v = request.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

/** What clients act on in an answer body: error type and class, operation status and id, policy version. */
function bodyFacts(payload: unknown): { facts: NonNullable<JournalEntry['response']>; operationId?: string } {
  const facts: NonNullable<JournalEntry['response']> = {};
  if (!payload || typeof payload !== 'object' || Array.isArray(payload)) return { facts };
  const body = payload as Record<string, unknown>;
  const error = body.error as Record<string, unknown> | undefined;
  if (error && typeof error === 'object') {
    if (typeof error.type === 'string') facts.error_type = error.type;
    if (typeof error.error_class === 'string') facts.error_class = error.error_class;
    if (typeof error.message === 'string') facts.error_message = error.message.slice(0, 300);
  }
  if (body.status === 'done' || body.status === 'error') facts.operation_status = body.status;
  if (typeof body.policy_version === 'number') facts.policy_version = body.policy_version;
  const result = body.result as Record<string, unknown> | undefined;
  if (result && typeof result.policy_version === 'number') facts.policy_version = result.policy_version;
  return { facts, operationId: typeof body.operation_id === 'string' ? body.operation_id : undefined };
}

/** What clients act on in the answer's headers. */
function headerFacts(reply: FastifyReply, facts: NonNullable<JournalEntry['response']>): NonNullable<JournalEntry['response']> {
  const out = { ...facts };
  const version = reply.getHeader('x-policy-version');
  if (version !== undefined && out.policy_version === undefined) out.policy_version = Number(version);
  const retry = reply.getHeader('retry-after');
  if (retry !== undefined) out.retry_after = String(retry);
  return out;
}

/**
 * Records every request in the core's journal when its connection is done
 * with it: answered, or closed with no answer (a dropped connection, status 0).
 */
export function installJournal(app: FastifyInstance, core: LoopsCore, foreignHostOf?: (req: IncomingMessage) => string | undefined): void {
  app.decorateRequest('trace', null as never);
  app.addHook('onRequest', async (request, reply) => {
    // By the route it reached (what it is), not the bytes of its path: /%5Fmock/... is the admin API too.
    const surface = surfaceOf(request.routeOptions.url ?? decodedPath(request.url));
    // The dashboard's own page and polling would fill the journal it shows: not recorded, and no number taken (no gaps in seq).
    if (isDashboard(request.url)) {
      request.trace = { seq: 0, time: '', started: performance.now(), surface };
      return;
    }
    const trace: RequestTrace = { seq: core.journal.arrive(), time: new Date(core.clock.now()).toISOString(), started: performance.now(), surface };
    request.trace = trace;
    reply.raw.once('close', () => {
      const route = routeTemplate(request);
      const params = (request.params ?? {}) as Record<string, string | undefined>;
      const dropped = trace.fault?.action.type === 'drop';
      const answered = reply.raw.writableFinished && !dropped;
      const entry: JournalEntry = {
        seq: trace.seq,
        time: trace.time,
        surface: trace.surface,
        method: request.method,
        path: request.url.split('?')[0]!,
        route,
        status: answered ? reply.statusCode : 0,
        latency_ms: Math.round((performance.now() - trace.started) * 1000) / 1000,
        headers: {
          auth: authScheme(request),
          ...(header(request, 'idempotency-key') !== undefined ? { idempotency_key: header(request, 'idempotency-key') } : {}),
          ...(header(request, 'x-min-policy-version') !== undefined ? { min_policy_version: header(request, 'x-min-policy-version') } : {}),
          ...(header(request, 'x-affinity-key') !== undefined ? { affinity_key: header(request, 'x-affinity-key') } : {}),
        },
      };
      // Sent to another host (proxy mode) and served by the app: say where the client sent it.
      const host = foreignHostOf?.(request.raw);
      if (host) entry.host = host;
      if (params.run_id) entry.run_id = params.run_id;
      if (params.sampler_id) entry.sampler_id = params.sampler_id;
      const operationId = params.operation_id ?? trace.operationId;
      if (operationId) entry.operation_id = operationId;
      const op = opOf(core, request, route);
      if (op) entry.op = op;
      if (request.body !== undefined && request.body !== null) entry.body = core.journal.keep(request.body);
      const response = headerFacts(reply, trace.response ?? {});
      if (answered && Object.keys(response).length) entry.response = response;
      // Never the journal's own answers: each read would hold every entry before it (the journal grew ~3x a read).
      if (answered && trace.responseBody !== undefined && core.journal.detail === 'full' && route !== JOURNAL_ROUTE) entry.response_body = trace.responseBody;
      if (trace.fault)
        entry.fault = {
          id: trace.fault.id,
          action: dropped && trace.fault.action.type === 'drop' && trace.fault.action.phase === 'after' ? 'drop_after' : trace.fault.action.type,
        };
      core.journal.record(entry);
    });
  });
  // Read from the answer object before it is serialised: no second parse of every response body.
  app.addHook('preSerialization', async (request, _reply, payload) => {
    // Answered by an earlier onRequest hook (no Host header, shutting down): never journaled, nothing to note.
    if (!request.trace) return payload;
    const { facts, operationId } = bodyFacts(payload);
    request.trace.response = facts;
    if (core.journal.detail === 'full') request.trace.responseBody = payload;
    if (operationId) request.trace.operationId = operationId;
    return payload;
  });
}
