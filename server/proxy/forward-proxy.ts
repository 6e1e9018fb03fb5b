import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { TLSSocket } from 'node:tls';
import type { LoopsCore } from '../core/core.js';
import type { JournalEntry, ProxyAction } from '../core/journal.js';
import type { FrontOfHouse } from '../http/base-app.js';
import { VERSION } from '../version.js';
import { appPathOf, INTERCEPTED_HOSTS_TEXT, isInterceptedHost, requestHost } from './baseten-hosts.js';
import { authorityKey, authorityText, forwardPlain, HANDSHAKE_TIMEOUT_MS, openTunnel, passthroughKey, refuseSocket } from './tunnels.js';
import type { LocalCa } from './ca.js';

export interface ForwardProxyOptions {
  ca: LocalCa;
  /**
   * What is tunnelled (CONNECT) or forwarded (plain HTTP) untouched, as
   * `HOST` (its port 443 only) or `HOST:PORT` (`[v6]:PORT`); these win over interception.
   */
  passthrough: string[];
  /** TLS handshakes in progress at once, past which a CONNECT is refused (503); MAX_HANDSHAKES unless set (tests lower it). */
  maxHandshakes?: number;
}

/**
 * Handshakes in progress at once: each holds a file descriptor until it ends,
 * so a flood of CONNECTs that never handshake could otherwise take every
 * descriptor of a 1,024 limit and shut out direct clients. Half that limit:
 * hundreds of honest clients connecting at once still all get in.
 */
const MAX_HANDSHAKES = 512;
/** At most one log line a this often about refused handshakes, with how many were refused since the last. */
const LIMIT_LOG_EVERY_MS = 5_000;
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
  /** `host:port` keys (authorityKey) of what passes through. */
  private readonly passthrough: Set<string>;
  /** Tunnels and forwarded requests, ended at shutdown (the HTTP server no longer knows these sockets). */
  private readonly open = new Set<Socket>();
  /** The decrypted side of every intercepted tunnel: a CONNECT or a proxy request arriving on one is refused, not nested. */
  private readonly decrypted = new WeakSet<Socket>();
  private readonly maxHandshakes: number;
  private handshaking = 0;
  private refusedSinceLog = 0;
  private lastLimitLog = -Infinity;
  private readonly warnings: ((message: string) => void)[] = [];
  private server: Server | null = null;

  constructor(
    private readonly core: LoopsCore,
    private readonly options: ForwardProxyOptions,
  ) {
    this.passthrough = new Set(options.passthrough.map(passthroughKey));
    this.maxHandshakes = options.maxHandshakes ?? MAX_HANDSHAKES;
    // The leaf is read (or minted) now, at start, never while a client waits.
    options.ca.context();
  }

  /** Told of limits being hit (refused handshakes), for the server's log. */
  onWarning(listener: (message: string) => void): void {
    this.warnings.push(listener);
  }

  get caFiles() {
    return this.options.ca.files;
  }

  readonly interceptedHosts = { has: isInterceptedHost, description: "Baseten's and the Hub's hosts (proxy mode)" };

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
    const port = portOf(url);
    const passes = host !== undefined && this.passes(host, port);
    if (host && isInterceptedHost(host) && !passes) return false;
    const started = performance.now();
    const seq = this.core.journal.arrive();
    const time = this.now();
    const nested = this.decrypted.has(req.socket);
    if (!host || !passes || nested) {
      const reason = nested ? NESTED_REFUSAL : host ? refusalOf(host, port) : `the request target '${url.slice(0, 200)}' names no host`;
      this.record({
        seq,
        time,
        method: req.method ?? 'GET',
        path: url.split('?')[0]!,
        status: 403,
        started,
        action: 'refuse',
        host: host ?? '',
        port,
        ...(nested ? { error: 'inside a loops-mock tunnel' } : {}),
      });
      const body = JSON.stringify({ error: { type: 'proxy_refused', message: `${reason}.`, host: host ?? null, intercepted_hosts: INTERCEPTED_HOSTS_TEXT } });
      res.writeHead(403, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(body),
        'x-loops-mock-version': VERSION,
        connection: 'close',
      });
      res.end(body);
      return true;
    }
    forwardPlain(
      req,
      res,
      { url, host, port },
      {
        track: (socket) => this.track(socket),
        record: (status, error) =>
          this.record({ seq, time, method: req.method ?? 'GET', path: url.split('?')[0]!, status, started, action: 'passthrough', host, port, error }),
      },
    );
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
      refuseSocket(socket, 400, 'Bad CONNECT target', `CONNECT needs a target of the form host:port, got '${target.slice(0, 200)}'.`);
      return;
    }
    const host = m[1]!.replace(/^\[|\]$/g, '').toLowerCase();
    const port = Number(m[2]);
    if (this.decrypted.has(socket)) {
      entry(403, 'refuse', host, port, 'inside a loops-mock tunnel');
      refuseSocket(socket, 403, NESTED_REFUSAL, `${NESTED_REFUSAL}.`, { host, port });
      return;
    }
    if (this.passes(host, port)) {
      openTunnel(socket, head, host, port, entry, (s) => this.track(s));
      return;
    }
    if (!isInterceptedHost(host)) {
      entry(403, 'refuse', host, port);
      refuseSocket(socket, 403, refusalOf(host, port), `${refusalOf(host, port)}.`, { host, port });
      return;
    }
    if (port !== 443) {
      const reason = `loops-mock intercepts ${host} on port 443 only, where Baseten and the Hub serve HTTPS; a CONNECT to port ${port} is refused`;
      entry(403, 'refuse', host, port);
      refuseSocket(socket, 403, reason, `${reason}.`, { host, port });
      return;
    }
    this.intercept(socket, head, host, port, entry);
  }

  /** TLS with a leaf for `host`, then the decrypted stream is one more connection of the HTTP server. */
  private intercept(
    socket: Socket,
    head: Buffer,
    host: string,
    port: number,
    entry: (status: number, action: ProxyAction, host: string, port: number, error?: string) => void,
  ): void {
    if (this.handshaking >= this.maxHandshakes) {
      const reason = `loops-mock has ${this.handshaking} TLS handshakes in progress, its limit; try again in a moment`;
      entry(503, 'refuse', host, port, 'handshake limit');
      this.limitHit();
      refuseSocket(socket, 503, reason, `${reason}.`, { host, limit: this.maxHandshakes });
      return;
    }
    this.handshaking++;
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (head.length) socket.unshift(head);
    // One certificate names every intercepted host, whatever the client puts in SNI.
    const tls = new TLSSocket(socket, { isServer: true, secureContext: this.options.ca.context(), ALPNProtocols: ['http/1.1'] });
    this.decrypted.add(tls);
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
      this.handshaking--;
      clearTimeout(stalled);
      entry(200, 'intercept', host, port, error);
    };
    const gone = `the client closed the connection before the TLS handshake ended: most likely it does not trust the loops-mock CA (${this.options.ca.files.cert})`;
    // A client gone before its handshake ends frees its socket now, not when the handshake times out.
    tls.once('end', () => {
      if (settled) return;
      settle(gone);
      tls.destroy();
    });
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
      settle(gone);
      socket.destroy();
    });
    socket.once('close', () => tls.destroy());
  }

  /** Whether `host:port` is a passthrough target. */
  private passes(host: string, port: number): boolean {
    return this.passthrough.has(authorityKey(host, port));
  }

  /** A refused handshake, in the log: the first of a burst at once, then at most every LIMIT_LOG_EVERY_MS with the count. */
  private limitHit(): void {
    this.refusedSinceLog++;
    const now = performance.now();
    if (now - this.lastLimitLog < LIMIT_LOG_EVERY_MS) return;
    const message = `proxy: ${this.refusedSinceLog} CONNECT(s) refused with 503: ${this.maxHandshakes} TLS handshakes already in progress (clients that open tunnels and never handshake?)`;
    this.lastLimitLog = now;
    this.refusedSinceLog = 0;
    for (const warn of this.warnings) warn(message);
  }

  private track(socket: Socket): void {
    this.open.add(socket);
    socket.once('close', () => this.open.delete(socket));
  }

  private now(): string {
    return new Date(this.core.clock.now()).toISOString();
  }

  private record(e: {
    seq: number;
    time: string;
    method: string;
    path: string;
    status: number;
    started: number;
    action: ProxyAction;
    host: string;
    port: number;
    error?: string;
  }): void {
    const entry: JournalEntry = {
      seq: e.seq,
      time: e.time,
      surface: 'proxy',
      method: e.method,
      path: e.path,
      route: null,
      status: e.status,
      latency_ms: Math.round((performance.now() - e.started) * 1000) / 1000,
      headers: { auth: 'none' },
      host: e.host,
      proxy: { action: e.action, port: e.port, ...(e.error ? { error: e.error } : {}) },
    };
    this.core.journal.record(entry);
  }
}

const NESTED_REFUSAL = 'loops-mock refuses a proxy request sent inside one of its own tunnels; send it to the proxy port itself';

/** Why a host is refused, with the --proxy-passthrough value that would let it through (the bare host means port 443). */
function refusalOf(host: string, port: number): string {
  const safe = host.replace(/[^A-Za-z0-9.:-]/g, '?');
  const named = port === 443 ? (safe.includes(':') ? `[${safe}]` : safe) : authorityText(safe, port);
  return `loops-mock does not proxy ${named}: it answers ${INTERCEPTED_HOSTS_TEXT} itself; tunnel others with --proxy-passthrough ${named}`;
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

/** What a failed handshake most likely means, said so that the journal reader knows the fix. */
function tlsFailure(err: Error, caFile: string): string {
  const text = `${(err as NodeJS.ErrnoException).code ?? ''} ${err.message}`;
  if (/unknown ca|bad certificate|certificate unknown|ALERT_UNKNOWN_CA|ALERT_BAD_CERTIFICATE|CERTIFICATE_UNKNOWN/i.test(text)) {
    return `TLS handshake refused by the client (${err.message.trim()}): it does not trust the loops-mock CA; trust ${caFile} (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, curl --cacert)`;
  }
  return `TLS handshake failed: ${err.message.trim()}`;
}
