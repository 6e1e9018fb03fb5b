import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { LoopsCore } from '../core/core.js';
import type { FaultAction, RequestFacts } from '../core/faults.js';
import { sendError } from './errors.js';
import { opOf, routeTemplate } from './journal-hook.js';

const POLL_ROUTE = '/trainer/{run_id}/operations/{operation_id}';

/** The error type a fault's status answers with unless the rule names one: what the real service would send. */
const DEFAULT_ERROR_TYPE: Record<number, string> = {
  400: 'invalid_request',
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  408: 'operation_pending',
  409: 'conflict',
  429: 'rate_limited',
  500: 'internal_error',
  502: 'bad_gateway',
  503: 'unavailable',
  504: 'gateway_timeout',
};

function factsOf(core: LoopsCore, request: FastifyRequest): RequestFacts {
  const route = routeTemplate(request);
  const params = (request.params ?? {}) as Record<string, string | undefined>;
  const headers: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(request.headers)) headers[k] = Array.isArray(v) ? v[0] : v;
  const isSubmit = request.method === 'POST' && route !== null && /^\/trainer\/\{run_id\}\/[a-z_]+$/.test(route);
  return {
    surface: request.trace.surface,
    method: request.method,
    route,
    op: opOf(core, request, route),
    run_id: params.run_id,
    sampler_id: params.sampler_id,
    headers,
    kind: route === POLL_ROUTE ? 'poll' : isSubmit ? 'submit' : 'other',
  };
}

/** Wall-clock sleep that ends early when the server stops, so a long injected delay never holds a shutdown. */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done);
  });
}

/** The fault acting on a request, for the handlers that carry it out themselves (hold_poll, fail_operation). */
export function faultOf(request: FastifyRequest): FaultAction | undefined {
  return request.trace?.fault?.action;
}

/**
 * Applies the core's fault rules to every request of the Loops surfaces
 * (never to the admin API), after the request is parsed and its run or
 * sampler resolved, before it is validated and handled.
 */
export function installFaults(app: FastifyInstance, core: LoopsCore): void {
  app.addHook('preValidation', async (request, reply) => {
    // Faults are for the Loops planes and the Hub: never the admin API, nor a CI script's wait on /healthz.
    if (request.trace.surface === 'admin' || request.trace.surface === 'service') return;
    const decided = core.faults.decide(factsOf(core, request));
    if (!decided) return;
    request.trace.fault = decided;
    const action = decided.action;
    switch (action.type) {
      case 'respond': {
        for (const [name, value] of Object.entries(action.headers ?? {})) reply.header(name, value);
        if (action.retry_after_s !== undefined) reply.header('retry-after', String(action.retry_after_s));
        if (action.body !== undefined) {
          // Objects go through serialisation (and the journal reads them); other JSON values are sent as text.
          const body = action.body !== null && typeof action.body === 'object' ? action.body : JSON.stringify(action.body);
          return reply.code(action.status).type('application/json').send(body);
        }
        const type = action.error_type ?? DEFAULT_ERROR_TYPE[action.status] ?? (action.status >= 500 ? 'internal_error' : 'invalid_request');
        return sendError(reply, action.status, type, action.message ?? `Injected by loops-mock fault rule ${decided.id}.`, {
          fault_id: decided.id,
          ...(action.retry_after_s !== undefined ? { retry_after_s: action.retry_after_s } : {}),
        });
      }
      case 'delay':
        await abortableSleep(action.ms, core.stopSignal);
        return;
      case 'drop':
        if (action.phase === 'after') return; // the onSend hook below drops the answer
        reply.hijack();
        request.raw.socket.destroy();
        return reply;
      case 'deactivate': {
        const params = request.params as Record<string, string | undefined>;
        const run = params.run_id ? core.fleet.findRun(params.run_id) : undefined;
        const sampler = params.sampler_id ? core.fleet.findSampler(params.sampler_id) : undefined;
        core.fleet.deactivateNow({ run, sampler }, `deactivated by loops-mock fault rule ${decided.id}`);
        return;
      }
      default:
        return; // hold_poll and fail_operation are carried out by the trainer plane's handlers
    }
  });
  // drop after: the work is done (an operation is queued, a step taken), then the answer is lost with the connection.
  app.addHook('onSend', async (request, _reply, payload) => {
    const action = faultOf(request);
    if (action?.type === 'drop' && action.phase === 'after') {
      request.raw.socket.destroy();
    }
    return payload;
  });
}
