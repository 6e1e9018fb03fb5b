// Passthrough: CONNECT tunnels and plain-HTTP requests to --proxy-passthrough targets, untouched; their keys, and answers on a raw socket.
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { ProxyAction } from '../core/journal.js';
import { VERSION } from '../version.js';

/** A client that opens a tunnel and never finishes its handshake (or a passthrough host that never answers) is let go after this. */
export const HANDSHAKE_TIMEOUT_MS = 10_000;
/** Hop-by-hop headers a forwarded request or answer loses (RFC 9110 7.6.1), and the proxy's own credentials. */
const HOP_BY_HOP = [
  'connection',
  'keep-alive',
  'proxy-authorization',
  'proxy-authenticate',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
];

/** A plain-HTTP proxy request for a passthrough host, forwarded untouched but for the hop-by-hop headers; 502 if the host cannot be reached. */
export function forwardPlain(
  req: IncomingMessage,
  res: ServerResponse,
  { url, host, port }: { url: string; host: string; port: number },
  hooks: { track: (socket: Socket) => void; record: (status: number, error?: string) => void },
): void {
  const target = new URL(url);
  const upstream = httpRequest(
    { host: target.hostname, port, method: req.method, path: `${target.pathname}${target.search}`, headers: endToEnd(req.headers) },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, endToEnd(answer.headers));
      answer.pipe(res);
      hooks.record(answer.statusCode ?? 502);
    },
  );
  upstream.on('socket', (socket) => hooks.track(socket));
  upstream.on('error', (err) => {
    hooks.record(502, err.message);
    if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json', 'x-loops-mock-version': VERSION });
    res.end(JSON.stringify({ error: { type: 'bad_gateway', message: `loops-mock could not reach ${host} (a --proxy-passthrough host): ${err.message}.` } }));
  });
  req.pipe(upstream);
}

/** A CONNECT to a passthrough target: the client's bytes to it and back, once the upstream connection stands; 502 if it never does. */
export function openTunnel(
  socket: Socket,
  head: Buffer,
  host: string,
  port: number,
  entry: (status: number, action: ProxyAction, host: string, port: number, error?: string) => void,
  track: (socket: Socket) => void,
): void {
  const upstream = connect({ host, port });
  track(upstream);
  track(socket);
  let established = false;
  const unreachable = (why: string) => {
    entry(502, 'passthrough', host, port, why);
    const reason = `loops-mock could not reach ${authorityText(host, port)}`;
    refuseSocket(socket, 502, reason, `${reason} (a --proxy-passthrough target): ${why}.`, { host, port });
    upstream.destroy();
  };
  upstream.setTimeout(HANDSHAKE_TIMEOUT_MS, () => {
    if (!established) unreachable(`no connection within ${HANDSHAKE_TIMEOUT_MS / 1000} s`);
  });
  // Read the client from the start, so that its leaving is seen at once; what it sends early is kept for the upstream.
  const early: Buffer[] = head.length ? [head] : [];
  const keep = (chunk: Buffer) => early.push(chunk);
  socket.on('data', keep);
  upstream.once('connect', () => {
    established = true;
    upstream.setTimeout(0);
    entry(200, 'passthrough', host, port);
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    socket.off('data', keep);
    for (const chunk of early) upstream.write(chunk);
    upstream.pipe(socket);
    socket.pipe(upstream);
  });
  upstream.on('error', (err) => {
    // Before the tunnel stands the client is owed the 502; after, its end of the tunnel just closes.
    if (!established) unreachable(err.message);
    else socket.destroy();
  });
  // A client gone before the tunnel stands takes its upstream connection with it, at once.
  socket.once('end', () => {
    if (!established) {
      entry(499, 'passthrough', host, port, 'the client closed the connection before the tunnel stood');
      upstream.destroy();
      socket.destroy();
    }
  });
  socket.on('close', () => upstream.destroy());
  upstream.on('close', () => {
    if (established) socket.destroy();
  });
}

/** A passthrough entry as its key: `HOST` is port 443, `HOST:PORT` and `[V6]:PORT` name theirs. */
export function passthroughKey(entry: string): string {
  const text = entry.trim().toLowerCase();
  const bracketed = /^\[([0-9a-f:.]+)\](?::(\d+))?$/.exec(text);
  if (bracketed) return authorityKey(bracketed[1]!, Number(bracketed[2] ?? 443));
  // More than one colon and no brackets: an IPv6 address without a port.
  if (text.split(':').length > 2) return authorityKey(text, 443);
  const [host, port] = text.split(':');
  return authorityKey(host!, Number(port ?? 443));
}

export function authorityKey(host: string, port: number): string {
  return `${host.toLowerCase()}#${port}`;
}

/** `host:port` as a client writes it (IPv6 in brackets). */
export function authorityText(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

/** Headers without the hop-by-hop ones, nor those the Connection header names. */
function endToEnd(headers: IncomingMessage['headers']): IncomingMessage['headers'] {
  const named = String(headers.connection ?? '')
    .toLowerCase()
    .split(',')
    .map((h) => h.trim())
    .filter(Boolean);
  const out: IncomingMessage['headers'] = {};
  for (const [name, value] of Object.entries(headers)) if (!HOP_BY_HOP.includes(name) && !named.includes(name)) out[name] = value;
  return out;
}

/**
 * Answers on a raw socket: the reason phrase carries the one-line reason
 * (clients print it, e.g. requests' "Tunnel connection failed: 403 ..."), the
 * body the error in its JSON shape.
 */
export function refuseSocket(socket: Socket, status: number, reason: string, message: string, details: Record<string, unknown> = {}): void {
  const phrase = reason.replace(/[^\x20-\x7e]/g, '?').slice(0, 300);
  const body = JSON.stringify({ error: { type: status === 400 ? 'invalid_request' : status === 502 ? 'bad_gateway' : 'proxy_refused', message, ...details } });
  socket.end(
    `HTTP/1.1 ${status} ${phrase}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nx-loops-mock-version: ${VERSION}\r\nconnection: close\r\n\r\n${body}`,
  );
}
