import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type RouteOptions } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import { VERSION } from '../version.js';
import { installErrorHandler, installNotFoundHandler, sendError } from './errors.js';
import { installBodyBudget } from './body-budget.js';
import { installFaults } from './fault-hook.js';
import { installJournal } from './journal-hook.js';
import { answerClientError } from './client-errors.js';
import { createServerLog, logRequest, type LogFormat } from './server-log.js';
import { serializerCompiler } from './answer-cache.js';
import { validatorCompiler } from './validation.js';
import { addressedHost, HostCheck } from './allowed-hosts.js';
import { graphBuildLine } from '../engine-warm-up.js';

export interface BaseAppOptions {
  bodyLimit: number;
  logLevel: string;
  /** pretty: one short line each, for a terminal; json: pino's NDJSON. */
  logFormat: LogFormat;
  /** A request's headers must arrive within this, the whole request within bodyTimeoutMs; answers (long polls) are not limited. */
  headersTimeoutMs: number;
  bodyTimeoutMs: number;
  /** What stands before the app on its port (proxy mode's forward proxy); without it the port serves the app alone. */
  front?: FrontOfHouse;
  /** Host names answered beyond localhost and IP addresses (allowed-hosts.ts): --allowed-host, the bound --host, --public-url's host. */
  allowedHosts?: readonly string[];
  /** The caller logs the engines' graph builds itself (startServer's warm-up, which begins before the app exists). */
  graphBuildsLogged?: boolean;
}

/** Something that shares the app's HTTP server: sees each raw request first, and may join the server (CONNECT). */
export interface FrontOfHouse {
  /** The path the app serves a raw request at (Fastify's rewriteUrl): a request for another host may map to one of the app's routes. */
  rewriteUrl(req: IncomingMessage): string;
  /** Answers a request the app does not serve at all; true when it did. */
  handle(req: IncomingMessage, res: ServerResponse): boolean;
  /** Joins the server once it exists (e.g. listens for CONNECT). */
  attach(server: Server): void;
  /** The host a request was addressed to when it is not this server (for the journal). */
  foreignHostOf(req: IncomingMessage): string | undefined;
  /** The hosts whose requests it hands the app: the app's names too (the Host check). */
  readonly interceptedHosts: { has(host: string): boolean; description: string };
}

/** Deeper than any Loops body (about six levels): a deeper one is refused before any recursive code meets it. */
const MAX_BODY_DEPTH = 64;

/** A container met while walking a body: its path is built only for the one value found wrong. */
interface Frame {
  value: object;
  parent: Frame | null;
  key: string | number;
  depth: number;
}

function pathOf(frame: Frame | null, key?: string | number): string {
  const parts: (string | number)[] = key === undefined ? [] : [key];
  for (let f = frame; f?.parent; f = f.parent) parts.push(f.key);
  return parts.reverse().reduce<string>((path, k) => (typeof k === 'number' ? `${path}[${k}]` : `${path}.${k}`), 'body');
}

/**
 * What is wrong with a parsed body that a schema would not say safely: a
 * number that is not finite (its path), or nesting deeper than
 * MAX_BODY_DEPTH. Walked without recursion, so any depth is safe to look at,
 * and without a string or an entry per number: a body of millions of token
 * ids costs about what parsing it did (issue 31 item 15: building a path per
 * number held the event loop 3.8 s for 5M tokens).
 */
function bodyProblem(value: unknown): { field: string; message: string } | null {
  if (value === null || typeof value !== 'object') return typeof value === 'number' && !Number.isFinite(value) ? notFinite('body') : null;
  const stack: Frame[] = [{ value, parent: null, key: '', depth: 0 }];
  while (stack.length) {
    const frame = stack.pop()!;
    const visit = (child: unknown, key: string | number) => {
      if (typeof child === 'number') return Number.isFinite(child) ? null : notFinite(pathOf(frame, key));
      if (child === null || typeof child !== 'object') return null;
      if (frame.depth + 1 >= MAX_BODY_DEPTH)
        return {
          field: 'body',
          message: `The body nests deeper than ${MAX_BODY_DEPTH} levels (at ${pathOf(frame, key).slice(0, 120)}...): no Loops request does; send a flatter body.`,
        };
      stack.push({ value: child, parent: frame, key, depth: frame.depth + 1 });
      return null;
    };
    const v = frame.value;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const child: unknown = v[i];
        // Numbers inline: most of a large body is arrays of them.
        if (typeof child === 'number') {
          if (!Number.isFinite(child)) return notFinite(pathOf(frame, i));
          continue;
        }
        const problem = visit(child, i);
        if (problem) return problem;
      }
    } else {
      for (const k of Object.keys(v)) {
        const problem = visit((v as Record<string, unknown>)[k], k);
        if (problem) return problem;
      }
    }
  }
  return null;
}

function notFinite(path: string): { field: string; message: string } {
  return { field: path, message: `${path} is not a finite number (JSON numbers beyond ±1.8e308 read as infinity); send a finite value.` };
}

const CHECK_EVERY_MS = 1000;

/** Fastify's own default, kept when the server is made here. */
const KEEP_ALIVE_TIMEOUT_MS = 72_000;

/**
 * A Fastify instance with what every front door shares: the error shape, the
 * version header, validation, JSON parsing, refusal while shutting down, and
 * the journal and fault hooks. `routes` fills as doors register theirs (the
 * 404 handler and /openapi.json read it).
 */
export function createBaseApp(core: LoopsCore, options: BaseAppOptions): { app: FastifyInstance; routes: RouteOptions[] } {
  const front = options.front;
  const log = createServerLog(options.logLevel, options.logFormat);
  const app = Fastify({
    loggerInstance: log as unknown as FastifyBaseLogger,
    // One line per request comes from the journal instead (below): with the error's type and message.
    logController: new LogController({ disableRequestLogging: true }),
    // Ids are short, but a long one is an unknown id (404), not a URL too long (Fastify's 414 past 100 characters).
    routerOptions: { maxParamLength: 8192 },
    // Node checks the two timeouts this often (every 30 s by default: a slow body could hold on that long past its limit).
    // A missing Host is answered below in our error shape; Node's own 400 for it has neither shape nor version header.
    http: { connectionsCheckingInterval: CHECK_EVERY_MS, requireHostHeader: false },
    clientErrorHandler: answerClientError,
    ...(front
      ? {
          rewriteUrl: (req: IncomingMessage) => front.rewriteUrl(req),
          serverFactory: (handler: (req: IncomingMessage, res: ServerResponse) => void) => {
            const server = createServer({ connectionsCheckingInterval: CHECK_EVERY_MS, requireHostHeader: false }, (req, res) => {
              if (!front.handle(req, res)) handler(req, res);
            });
            server.keepAliveTimeout = KEEP_ALIVE_TIMEOUT_MS;
            front.attach(server);
            return server;
          },
        }
      : {}),
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

  // Receiving a request is bounded; sending the answer is not, so a long poll waits as long as it must.
  app.server.headersTimeout = options.headersTimeoutMs;
  app.server.requestTimeout = Math.max(options.bodyTimeoutMs, options.headersTimeoutMs);

  app.setValidatorCompiler(validatorCompiler);
  app.setSerializerCompiler(serializerCompiler);
  app.decorateRequest('principal', null as never);

  // Proxy mode's interception hands the app requests for Baseten's and the Hub's hosts.
  const hosts = new HostCheck({ extra: options.allowedHosts, intercepted: front?.interceptedHosts });
  let closing = false;
  // Shutting down: new requests get 503, waiting long polls are answered 503 at once.
  app.addHook('preClose', async () => {
    closing = true;
    core.beginShutdown();
  });
  app.addHook('onRequest', async (request, reply) => {
    reply.header('x-loops-mock-version', VERSION);
    if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
      reply.header('connection', 'close');
      return sendError(
        reply,
        400,
        'invalid_request',
        "An HTTP/1.1 request needs a Host header (RFC 9112, section 3.2): send 'Host: <the server's host:port>'.",
        { field: 'headers.host' },
      );
    }
    const host = addressedHost(request.raw);
    if (!hosts.allows(host)) return sendError(reply, 403, 'forbidden', hosts.refusal(host!), { field: 'headers.host', flag: '--allowed-host' });
    if (closing) {
      reply.header('connection', 'close');
      return sendError(reply, 503, 'unavailable', 'loops-mock is shutting down.');
    }
  });

  // Bodies held at once are bounded (a reset replaces the settings: read them through the core each time).
  installBodyBudget(app, {
    get bodyBytesInFlight() {
      return core.settings.bodyBytesInFlight;
    },
  });

  // JSON bodies; an empty body counts as no body (POST /sessions is sent with none).
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_request, body, done) => {
    const text = (body as string).trim();
    if (!text) return done(null, null);
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      return done(new LoopsError('invalid_request', `The body is not valid JSON: ${(err as Error).message}.`, { field: 'body' }), undefined);
    }
    // A number beyond float64 (1e400) parses to Infinity and would poison the model; a body nested thousands deep would
    // overflow the stack of whatever recursive code met it next: both refused here, for every route.
    const problem = bodyProblem(parsed);
    if (problem) return done(new LoopsError('invalid_request', problem.message, { field: problem.field }), undefined);
    done(null, parsed);
  });

  installErrorHandler(app, options.bodyLimit);
  core.journal.onRecord((entry) => logRequest(log, entry));
  core.onLifecycle((line) => (line.level === 'INFO' ? log.info(line.message) : log.warn(line.message)));
  core.onStorageNotice((level, message) => (level === 'info' ? log.info(message) : log.warn(message)));
  // Engines may outlive this app (shared by a test suite's servers): stop listening when it closes.
  const unlisten = options.graphBuildsLogged ? () => {} : core.engines.onGraphBuild((e) => log.info(graphBuildLine(e)));
  // Shutdown and reset end the server's log lines with the server, not in the middle of a test's output.
  app.addHook('onClose', async () => {
    unlisten();
    log.flush?.();
  });
  // Root-level hooks: they run for every front door registered later.
  installJournal(app, core, front ? (req) => front.foreignHostOf(req) : undefined);
  installFaults(app, core);
  const routes: RouteOptions[] = [];
  app.addHook('onRoute', (route) => {
    routes.push(route as RouteOptions);
  });
  // A route that takes no body refuses one rather than ignore it (an empty body, or {}, is no body).
  // Hooks run for the not-found handler too: an unknown route is a 404 whatever its body.
  app.addHook('preValidation', async (request) => {
    if (request.is404) return;
    const takesBody = (request.routeOptions.schema as { body?: unknown } | undefined)?.body !== undefined;
    const body = request.body;
    if (takesBody || body === undefined || body === null) return;
    if (typeof body === 'object' && !Array.isArray(body) && Object.keys(body).length === 0) return;
    throw new LoopsError(
      'invalid_request',
      `${request.method} ${request.routeOptions.url ?? request.url} takes no body; send none (got ${Array.isArray(body) ? 'an array' : typeof body === 'object' ? `fields ${Object.keys(body).slice(0, 5).join(', ')}` : typeof body}).`,
      { field: 'body' },
    );
  });
  installNotFoundHandler(app, routes);
  return { app, routes };
}
