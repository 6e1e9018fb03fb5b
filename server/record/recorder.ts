import { randomBytes } from 'node:crypto';
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { mapStrings, shapeOf, type Fixture, type FixtureExchange } from './fixture-format.js';

export interface RecorderOptions {
  /** The Loops endpoint to record: its control plane URL (loops-mock, or the real service). */
  upstream: string;
  /** Folder the fixture is written to, as `<flow>.json`. */
  out: string;
  flow: string;
  description?: string;
  port?: number;
  host?: string;
}

export interface Recorder {
  /** Where clients point instead of the upstream (LOOPS_BASE_URL and BASETEN_MANAGEMENT_API_URL_OVERRIDE). */
  url: string;
  file: string;
  fixture(): Fixture;
  close(): Promise<void>;
}

/** Headers forwarded back to the client: what clients act on. */
const PASSED_BACK = ['content-type', 'retry-after', 'x-policy-version', 'x-loops-mock-version', 'x-loops-mock-replica'];
/** Response fields whose string values name things later requests refer to. */
const NAMES_A_THING = /(^id$|_id$|^base_url$|^path$|^url$|^checkpoint_id$|^model_path$)/;
const POLL = /\/operations\/[^/?]+$/;

/**
 * A recording proxy in front of a Loops endpoint. It forwards every request,
 * rewrites URLs in answers so that trainer, sampler and download traffic keeps
 * coming through it, and writes what it saw as an sdk-fixtures flow: ids and
 * URLs turned into placeholders, Idempotency-Keys into per-replay keys, API
 * keys never written. The file is rewritten after each exchange.
 */
export async function startRecorder(options: RecorderOptions): Promise<Recorder> {
  const upstream = options.upstream.replace(/\/+$/, '');
  const origins: string[] = [];
  const exchanges: FixtureExchange[] = [];
  /** Known values (as the client sees them) → placeholder names, longest first when replacing. */
  const names = new Map<string, string>();
  const counters = new Map<string, number>();
  const keyNames = new Map<string, string>();
  mkdirSync(options.out, { recursive: true });
  const file = join(options.out, `${options.flow}.json`);
  let base = '';

  const fixture = (): Fixture => ({ name: options.flow, ...(options.description ? { description: options.description } : {}), exchanges });
  const save = () => {
    const tmp = `${file}.${randomBytes(4).toString('hex')}.tmp`;
    writeFileSync(tmp, `${JSON.stringify(fixture(), null, 1)}\n`);
    renameSync(tmp, file);
  };

  /** An upstream URL as the client must see it: through this proxy. */
  const proxied = (url: string): string => {
    if (url.startsWith(upstream)) return `${base}${url.slice(upstream.length)}`;
    const origin = new URL(url).origin;
    let i = origins.indexOf(origin);
    if (i < 0) i = origins.push(origin) - 1;
    return `${base}/_via/${i}${url.slice(origin.length)}`;
  };
  const upstreamOf = (path: string): string => {
    const via = /^\/_via\/(\d+)(\/.*)?$/.exec(path);
    if (via && origins[Number(via[1])]) return `${origins[Number(via[1])]}${via[2] ?? ''}`;
    return `${upstream}${path}`;
  };
  const rewrite = (v: unknown): unknown => mapStrings(v, (x) => (/^https?:\/\//.test(x) ? proxied(x) : x));

  /** Names every id-like value of an answer not seen before; returns the captures. */
  const learn = (body: unknown): Record<string, string> => {
    const capture: Record<string, string> = {};
    const walk = (v: unknown, ptr: string, key: string) => {
      if (typeof v === 'string') {
        if (NAMES_A_THING.test(key) && v.length >= 4 && !names.has(v)) {
          const n = (counters.get(key) ?? 0) + 1;
          counters.set(key, n);
          const name = `${key}_${n}`;
          names.set(v, name);
          capture[name] = ptr;
        }
      } else if (Array.isArray(v)) {
        // Lists (GET /runs) hold whatever the account has: positions are not stable enough to capture from.
        return;
      } else if (v && typeof v === 'object') {
        for (const [k, x] of Object.entries(v)) walk(x, `${ptr}/${k.replace(/~/g, '~0').replace(/\//g, '~1')}`, k);
      }
    };
    walk(body, '', '');
    return capture;
  };

  /** A string of a request with every known value turned back into its placeholder. */
  const templated = (s: string): string => {
    const exact = names.get(s);
    if (exact) return `{${exact}}`;
    // A URL or path that starts with a known URL (a base_url): the rest follows it.
    for (const [value, name] of [...names].sort((a, b) => b[0].length - a[0].length)) {
      if (/^https?:\/\//.test(value) && s.startsWith(value)) return `{${name}}${templated(s.slice(value.length))}`;
    }
    return s
      .split('/')
      .map((seg) => {
        const [head, ...query] = seg.split('?');
        const n = names.get(head!);
        return `${n ? `{${n}}` : head}${query.length ? `?${query.join('?')}` : ''}`;
      })
      .join('/');
  };

  const record = (req: IncomingMessage, requestBody: unknown, status: number, responseBody: unknown, binary: boolean) => {
    const path = req.url ?? '/';
    const isPoll = req.method === 'GET' && POLL.test(path.split('?')[0]!);
    // A long poll's 408s are the waiting; the fixture keeps the poll once, with its final answer.
    if (isPoll && status === 408) return;
    const headers: Record<string, string> = {};
    const key = req.headers['idempotency-key'];
    if (typeof key === 'string') {
      if (!keyNames.has(key)) keyNames.set(key, `key:${keyNames.size + 1}`);
      headers['Idempotency-Key'] = `{${keyNames.get(key)}}`;
    }
    for (const h of ['x-min-policy-version', 'x-affinity-key']) {
      const v = req.headers[h];
      if (typeof v === 'string') headers[h.replace(/(^|-)([a-z])/g, (_m, d: string, c: string) => `${d}${c.toUpperCase()}`)] = v;
    }
    const exchange: FixtureExchange = {
      request: {
        method: req.method ?? 'GET',
        // Under a captured base_url: relative to it; anything else: a path on the server.
        url: [...names.keys()].some((v) => /^https?:\/\//.test(v) && `${base}${path}`.startsWith(v)) ? templated(`${base}${path}`) : templated(path),
        ...(Object.keys(headers).length ? { headers } : {}),
        ...(requestBody !== undefined ? { body: mapStrings(requestBody, templated) } : {}),
      },
      ...(isPoll ? { poll: true } : {}),
      response: { status, shape: binary ? 'binary' : shapeOf(responseBody) },
    };
    const capture = binary ? {} : learn(responseBody);
    if (Object.keys(capture).length) exchange.capture = capture;
    exchanges.push(exchange);
    save();
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks);
    let requestBody: unknown;
    if (raw.length) {
      try {
        requestBody = JSON.parse(raw.toString('utf8'));
      } catch {
        requestBody = raw.toString('utf8');
      }
    }
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (typeof v === 'string' && !['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive'].includes(k)) headers[k] = v;
    }
    let upstreamRes: Response;
    try {
      upstreamRes = await fetch(upstreamOf(req.url ?? '/'), { method: req.method, headers, body: raw.length ? raw : undefined, redirect: 'manual' });
    } catch (err) {
      res.writeHead(502, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { type: 'bad_gateway', message: `loops-mock record: the upstream did not answer: ${(err as Error).message}` } }));
      return;
    }
    const bytes = Buffer.from(await upstreamRes.arrayBuffer());
    const type = upstreamRes.headers.get('content-type') ?? '';
    const out: Record<string, string> = {};
    for (const h of PASSED_BACK) {
      const v = upstreamRes.headers.get(h);
      if (v !== null) out[h] = v;
    }
    if (type.includes('json') && bytes.length) {
      let body: unknown;
      try {
        body = rewrite(JSON.parse(bytes.toString('utf8')));
      } catch {
        body = undefined;
      }
      if (body !== undefined) {
        const text = JSON.stringify(body);
        res.writeHead(upstreamRes.status, out);
        res.end(text);
        record(req, requestBody, upstreamRes.status, body, false);
        return;
      }
    }
    res.writeHead(upstreamRes.status, out);
    res.end(bytes);
    record(req, requestBody, upstreamRes.status, null, !type.includes('json'));
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { type: 'internal_error', message: `loops-mock record failed: ${(err as Error).message}` } }));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  const host = options.host && options.host !== '0.0.0.0' ? options.host : '127.0.0.1';
  base = `http://${host}:${port}`;
  save();
  return {
    url: base,
    file,
    fixture,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
