import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VERSION, type RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

/** What reaches the server as bytes, not as a well-behaved client's request: every answer still has the error shape and the version header. */
let server: RunningServer;
let port: number;

beforeAll(async () => {
  server = await startTestServer({ headersTimeoutMs: 1000, bodyTimeoutMs: 1500, longPollMs: 3000 });
  port = Number(new URL(server.url).port);
});
afterAll(() => server.close());

interface RawAnswer {
  status: number;
  headers: string;
  body: string;
  ms: number;
}

/** Writes `chunks` to a fresh connection (each after `gapMs`) and reads until the server closes it. */
function raw(chunks: (string | Buffer)[], gapMs = 0): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const socket = connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    let timer: NodeJS.Timeout | undefined;
    socket.on('data', (d: Buffer) => {
      data = Buffer.concat([data, d]);
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      const text = data.toString('latin1');
      const split = text.indexOf('\r\n\r\n');
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0),
        headers: text.slice(0, split),
        body: text.slice(split + 4),
        ms: Date.now() - started,
      });
    });
    let i = 0;
    const next = () => {
      if (i >= chunks.length || socket.destroyed) return;
      socket.write(chunks[i++]!);
      timer = setTimeout(next, gapMs);
    };
    socket.once('connect', next);
    setTimeout(() => {
      socket.destroy();
      reject(new Error('no answer in 15 s'));
    }, 15_000).unref();
  });
}

const errorOf = (a: RawAnswer) => (JSON.parse(a.body) as { error: { type: string; message: string } }).error;

describe('requests that never reach the app', () => {
  it('a body that trickles in is cut off with 408 after --body-timeout-ms; headers after --headers-timeout-ms', async () => {
    const head =
      'POST /v1/loops/sessions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n';
    const body = await raw([head, ...Array.from({ length: 30 }, () => '  ')], 300);
    expect(body.status).toBe(408);
    expect(errorOf(body).type).toBe('request_timeout');
    expect(body.headers.toLowerCase()).toContain(`x-loops-mock-version: ${VERSION}`);
    expect(body.ms).toBeLessThan(5000);
    const headers = await raw(['GET /healthz HTTP/1.1\r\n', ...Array.from({ length: 30 }, (_, k) => `X-Slow-${k}: y\r\n`)], 250);
    expect(headers.status).toBe(408);
    expect(errorOf(headers).message).toMatch(/--headers-timeout-ms/);
  });

  it('leaves long polls alone: a poll waits its whole window, longer than the body timeout, and answers 408 operation_pending', async () => {
    const headers = { authorization: 'Bearer k', 'content-type': 'application/json' };
    const session = ((await (await fetch(`${server.url}/v1/loops/sessions`, { method: 'POST', headers: { authorization: 'Bearer k' } })).json()) as any).session
      .id;
    const run = (
      (await (
        await fetch(`${server.url}/v1/loops/runs`, {
          method: 'POST',
          headers,
          body: JSON.stringify({ session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4 }),
        })
      ).json()) as any
    ).run;
    // A progress rule (the admin API's, here through the core) holds the step: the poll has nothing to answer for its window.
    server.core.progress.add({ mode: 'manual', match: { op: 'optim_step' } });
    const op = ((await (await fetch(`${run.base_url}/optim_step`, { method: 'POST', headers, body: '{}' })).json()) as any).operation_id;
    const started = Date.now();
    const poll = await fetch(`${run.base_url}/operations/${op}`, { headers });
    expect(poll.status).toBe(408);
    expect(((await poll.json()) as any).error.type).toBe('operation_pending');
    expect(Date.now() - started).toBeGreaterThanOrEqual(2900);
  });

  it('malformed HTTP gets a 400 in the error shape with the version header', async () => {
    const cases = [
      'GET /healthz HTTP/1.1\r\nHost: localhost\r\nNot a header line\r\n\r\n',
      'POST /v1/loops/sessions HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n',
      'POST /v1/loops/sessions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}',
      'POST /v1/loops/sessions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n',
      'GET /hea\0lthz HTTP/1.1\r\nHost: localhost\r\n\r\n',
      'GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Name: y\r\n\r\n',
    ];
    for (const request of cases) {
      const answer = await raw([request]);
      expect(answer.status, JSON.stringify(request)).toBe(400);
      expect(errorOf(answer).type, JSON.stringify(request)).toBe('invalid_request');
      expect(errorOf(answer).message).toMatch(/not well-formed HTTP/);
      expect(answer.headers.toLowerCase()).toContain(`x-loops-mock-version: ${VERSION}`);
    }
  });

  it('an HTTP/1.1 request without a Host header is a 400 naming the header, in the error shape', async () => {
    const answer = await raw(['GET /v1/loops/runs HTTP/1.1\r\nAuthorization: Bearer k\r\n\r\n']);
    expect(answer.status).toBe(400);
    expect(errorOf(answer)).toMatchObject({ type: 'invalid_request', field: 'headers.host' });
    expect(errorOf(answer).message).toMatch(/Host header/);
    expect(answer.headers.toLowerCase()).toContain(`x-loops-mock-version: ${VERSION}`);
    // HTTP/1.0 has no Host requirement.
    expect((await raw(['GET /healthz HTTP/1.0\r\n\r\n'])).status).toBe(200);
  });

  it('a URL over 16 KB is 414, headers over 16 KB are 431', async () => {
    const longUrl = await raw([`GET /v1/loops/runs/${'a'.repeat(20_000)} HTTP/1.1\r\nHost: localhost\r\n\r\n`]);
    expect([longUrl.status, errorOf(longUrl).type]).toEqual([414, 'uri_too_long']);
    const bigHeaders = await raw([`GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: ${'b'.repeat(20_000)}\r\n\r\n`]);
    expect([bigHeaders.status, errorOf(bigHeaders).type]).toEqual([431, 'headers_too_large']);
    expect(bigHeaders.headers.toLowerCase()).toContain(`x-loops-mock-version: ${VERSION}`);
  });
});
