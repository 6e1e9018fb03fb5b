import { request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import type { LoopsCore } from '../core/core.js';
import type { JournalEntry, ProxyAction } from '../core/journal.js';
import type { FrontOfHouse } from '../http/base-app.js';
import { VERSION } from '../version.js';
import { appPathOf, INTERCEPTED_HOSTS_TEXT, isInterceptedHost, requestHost } from './baseten-hosts.js';
import type { LocalCa } from './ca.js';

export interface ForwardProxyOptions {
  ca: LocalCa;
  /** Hosts tunnelled (CONNECT) or forwarded (plain HTTP) untouched, by name; they win over interception. */
  passthrough: string[];
}

/** A client that opens a tunnel and never finishes its handshake is let go after this. */
const HANDSHAKE_TIMEOUT_MS = 10_000;

/** A CONNECT target or an absolute-form URL's authority. */
const AUTHORITY = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/;

/**
 * The server's port as an HTTP forward proxy (proxy mode): CONNECTs to
 * Baseten's and the Hub's hosts are answered with TLS under a leaf of the
 * local CA and handed to the app as if the client had connected to it
 * directly, so every decrypted request meets the same auth, validation,
 * journal and faults. Named passthrough hosts are tunnelled untouched; any
 * other host is refused with a reason naming the host and the flag that
 * would allow it. Each CONNECT and each refusal is in the journal.
 */
export class ForwardProxy implements FrontOfHouse {
  private readonly passthrough: Set<string>;
  /** Tunnels and forwarded requests, ended at shutdown (the HTTP server no longer knows these sockets). */
  private readonly open = new Set<Socket>();
  private server: Server | null = null;

  constructor(private readonly core: LoopsCore, private readonly options: ForwardProxyOptions) {
    this.passthrough = new Set(options.passthrough.map((h) => h.toLowerCase()));
  }

  get caFiles() {
    return this.options.ca.files;
  }

  rewriteUrl(req: IncomingMessage): string {
    const url = req.url ?? '/';
    const host = requestHost(url, req.headers.host);
    if (!host || !isInterceptedHost(host)) return url;
    return appPathOf(this.core, host, url) ?? (url.replace(/^https?:\/\/[^/]*/i, '') || '/');
  }

  foreignHostOf(req: IncomingMessage): string | undefined {
    // Fastify keeps the target as sent beside the rewritten one.
    const sent = (req as IncomingMessage & { originalUrl?: string }).originalUrl ?? req.url ?? '/';
    const host = requestHost(sent, req.headers.host);
    return host && isInterceptedHost(host) ? host : undefined;
  }

  /** Plain-HTTP proxy requests (absolute-form targets) for hosts the app does not answer. */
  handle(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url ?? '/';
    if (!/^https?:\/\//i.test(url)) return false;
    const host = requestHost(url, undefined);
    if (host && isInterceptedHost(host) && !this.passthrough.has(host)) return false;
    const started = performance.now();
    const seq = this.core.journal.arrive();
    const time = this.now();
    if (!host || !this.passthrough.has(host)) {
      const reason = host ? refusalOf(host) : `the request target '${url.slice(0, 200)}' names no host`;
      this.record({ seq, time, method: req.method ?? 'GET', path: url.split('?')[0]!, status: 403, started, action: 'refuse', host: host ?? '', port: portOf(url) });
      const body = JSON.stringify({ error: { type: 'proxy_refused', message: `${reason}.`, host: host ?? null, intercepted_hosts: INTERCEPTED_HOSTS_TEXT } });
      res.writeHead(403, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'x-loops-mock-version': VERSION, connection: 'close' });
      res.end(body);
      return true;
    }
    const target = new URL(url);
    const upstream = httpRequest({ host: target.hostname, port: target.port || 80, method: req.method, path: `${target.pathname}${target.search}`, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
      this.record({ seq, time, method: req.method ?? 'GET', path: url.split('?')[0]!, status: answer.statusCode ?? 502, started, action: 'passthrough', host, port: Number(target.port || 80) });
    });
    upstream.on('socket', (socket) => this.track(socket));
    upstream.on('error', (err) => {
      this.record({ seq, time, method: req.method ?? 'GET', path: url.split('?')[0]!, status: 502, started, action: 'passthrough', host, port: Number(target.port || 80), error: err.message });
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json', 'x-loops-mock-version': VERSION });
      res.end(JSON.stringify({ error: { type: 'bad_gateway', message: `loops-mock could not reach ${host} (a --proxy-passthrough host): ${err.message}.` } }));
    });
    req.pipe(upstream);
    return true;
  }

  attach(server: Server): void {
    this.server = server;
    server.on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) => this.connect(req, socket, head));
  }

  /** Ends every tunnel: a shutdown does not wait on connections the client keeps open. */
  close(): void {
    for (const socket of this.open) socket.destroy();
    this.open.clear();
  }

  private connect(req: IncomingMessage, socket: Socket, head: Buffer): void {
    const started = performance.now();
    const seq = this.core.journal.arrive();
    const time = this.now();
    const target = req.url ?? '';
    socket.on('error', () => socket.destroy());
    const m = AUTHORITY.exec(target);
    const entry = (status: number, action: ProxyAction, host: string, port: number, error?: string) =>
      this.record({ seq, time, method: 'CONNECT', path: target, status, started, action, host, port, error });
    if (!m) {
      entry(400, 'refuse', '', 0, 'not host:port');
      return refuseSocket(socket, 400, 'Bad CONNECT target', `CONNECT needs a target of the form host:port, got '${target.slice(0, 200)}'.`);
    }
    const host = m[1]!.replace(/^\[|\]$/g, '').toLowerCase();
    const port = Number(m[2]);
    if (this.passthrough.has(host)) return this.tunnel(socket, head, host, port, entry);
    if (!isInterceptedHost(host)) {
      entry(403, 'refuse', host, port);
      return refuseSocket(socket, 403, refusalOf(host), `${refusalOf(host)}.`, { host });
    }
    if (port !== 443) {
      const reason = `loops-mock intercepts ${host} on port 443 only, where Baseten and the Hub serve HTTPS; a CONNECT to port ${port} is refused`;
      entry(403, 'refuse', host, port);
      return refuseSocket(socket, 403, reason, `${reason}.`, { host, port });
    }
    this.intercept(socket, head, host, port, entry);
  }

  /** TLS with a leaf for `host`, then the decrypted stream is one more connection of the HTTP server. */
  private intercept(socket: Socket, head: Buffer, host: string, port: number, entry: (status: number, action: ProxyAction, host: string, port: number, error?: string) => void): void {
    let context;
    try {
      context = this.options.ca.contextFor(host);
    } catch (err) {
      entry(502, 'refuse', host, port, (err as Error).message);
      return refuseSocket(socket, 502, 'loops-mock could not make a certificate', `loops-mock could not make a certificate for ${host}: ${(err as Error).message}.`);
    }
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (head.length) socket.unshift(head);
    const tls = new TLSSocket(socket, {
      isServer: true,
      secureContext: context,
      ALPNProtocols: ['http/1.1'],
      // A client that names another intercepted host in SNI gets that host's certificate.
      SNICallback: (name, done) => done(null, isInterceptedHost(name) ? this.options.ca.contextFor(name) : context),
    });
    // Until its handshake ends the connection is the proxy's to end at shutdown; then the HTTP server's (idle ones closed, busy ones finished).
    this.track(socket);
    const stalled = setTimeout(() => {
      settle(`the TLS handshake did not finish within ${HANDSHAKE_TIMEOUT_MS / 1000} s`);
      tls.destroy();
    }, HANDSHAKE_TIMEOUT_MS);
    stalled.unref();
    // One journal entry per CONNECT: when the handshake succeeds, or with why it did not.
    let settled = false;
    const settle = (error?: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(stalled);
      entry(200, 'intercept', host, port, error);
    };
    tls.once('secure', () => {
      settle();
      this.open.delete(socket);
      this.server?.emit('connection', tls);
    });
    tls.on('error', (err) => {
      settle(tlsFailure(err, this.options.ca.files.cert));
      tls.destroy();
    });
    tls.once('close', () => {
      settle(`the client closed the connection before the TLS handshake ended: most likely it does not trust the loops-mock CA (${this.options.ca.files.cert})`);
      socket.destroy();
    });
    socket.once('close', () => tls.destroy());
  }

  private tunnel(socket: Socket, head: Buffer, host: string, port: number, entry: (status: number, action: ProxyAction, host: string, port: number, error?: string) => void): void {
    const upstream = connect({ host, port });
    this.track(upstream);
    this.track(socket);
    upstream.once('connect', () => {
      entry(200, 'passthrough', host, port);
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) upstream.write(head);
      upstream.pipe(socket);
      socket.pipe(upstream);
    });
    upstream.on('error', (err) => {
      if (upstream.connecting || !socket.writable) {
        entry(502, 'passthrough', host, port, err.message);
        refuseSocket(socket, 502, `loops-mock could not reach ${host}:${port}`, `loops-mock could not reach ${host}:${port} (a --proxy-passthrough host): ${err.message}.`);
      } else {
        socket.destroy();
      }
    });
    socket.on('close', () => upstream.destroy());
    upstream.on('close', () => socket.destroy());
  }

  private track(socket: Socket): void {
    this.open.add(socket);
    socket.once('close', () => this.open.delete(socket));
  }

  private now(): string {
    return new Date(this.core.clock.now()).toISOString();
  }

  private record(e: { seq: number; time: string; method: string; path: string; status: number; started: number; action: ProxyAction; host: string; port: number; error?: string }): void {
    const entry: JournalEntry = {
      seq: e.seq, time: e.time, surface: 'proxy', method: e.method, path: e.path, route: null, status: e.status,
      latency_ms: Math.round((performance.now() - e.started) * 1000) / 1000,
      headers: { auth: 'none' },
      host: e.host,
      proxy: { action: e.action, port: e.port, ...(e.error ? { error: e.error } : {}) },
    };
    this.core.journal.record(entry);
  }
}

function refusalOf(host: string): string {
  const safe = host.replace(/[^A-Za-z0-9.:-]/g, '?');
  return `loops-mock does not proxy ${safe}: it answers ${INTERCEPTED_HOSTS_TEXT} itself; tunnel others with --proxy-passthrough ${safe}`;
}

/** The port of an absolute-form URL, for the journal. */
function portOf(url: string): number {
  try {
    const u = new URL(url);
    return Number(u.port || (u.protocol === 'https:' ? 443 : 80));
  } catch {
    return 0;
  }
}

/**
 * Answers on a raw socket: the reason phrase carries the one-line reason
 * (clients print it, e.g. requests' "Tunnel connection failed: 403 ..."), the
 * body the error in its JSON shape.
 */
function refuseSocket(socket: Socket, status: number, reason: string, message: string, details: Record<string, unknown> = {}): void {
  const phrase = reason.replace(/[^\x20-\x7e]/g, '?').slice(0, 300);
  const body = JSON.stringify({ error: { type: status === 400 ? 'invalid_request' : status === 502 ? 'bad_gateway' : 'proxy_refused', message, ...details } });
  socket.end(`HTTP/1.1 ${status} ${phrase}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nx-loops-mock-version: ${VERSION}\r\nconnection: close\r\n\r\n${body}`);
}

/** What a failed handshake most likely means, said so that the journal reader knows the fix. */
function tlsFailure(err: Error, caFile: string): string {
  const text = `${(err as NodeJS.ErrnoException).code ?? ''} ${err.message}`;
  if (/unknown ca|bad certificate|certificate unknown|ALERT_UNKNOWN_CA|ALERT_BAD_CERTIFICATE|CERTIFICATE_UNKNOWN/i.test(text)) {
    return `TLS handshake refused by the client (${err.message.trim()}): it does not trust the loops-mock CA; trust ${caFile} (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, curl --cacert)`;
  }
  return `TLS handshake failed: ${err.message.trim()}`;
}
