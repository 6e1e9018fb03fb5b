import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { HostCheck } from '../http/allowed-hosts.js';
import { isInterceptedHost } from '../proxy/baseten-hosts.js';
import { ConfigError, MockAdmin, parseOptions, type RunningServer, type StartOptions } from '../index.js';
import { startTestServer } from './helpers.js';

// Issue 31 items 6 and 7: a web page of another site can neither reach the server by a name of its own (DNS
// rebinding) nor make the admin API change anything with the requests a browser lets any page send.

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

async function start(options: StartOptions = {}) {
  server = await startTestServer({ admin: true, ...options });
  const send = async (method: string, url: string, headers: Record<string, string> = {}, payload?: string) => {
    const res = await server!.app.inject({ method: method as 'GET', url, headers, payload });
    return { status: res.statusCode, body: res.json() as any, headers: res.headers };
  };
  return { server, send, admin: new MockAdmin(server.url, options.adminToken) };
}

/** A request to a real server with a Host header of our choosing (fetch would not send one). */
function withHost(url: string, host: string, path: string): Promise<{ status: number; body: any }> {
  const { port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path, headers: { host } }, (res) => {
      let text = '';
      res.on('data', (c) => {
        text += c;
      });
      res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe("Host: only the server's own names are answered (DNS rebinding)", () => {
  it("refuses a page's own name with 403 naming --allowed-host, on the dashboard and the admin API, and changes nothing", async () => {
    const { send, admin } = await start();
    await admin.addFault({ match: { surface: 'trainer' }, action: { type: 'respond', status: 503 } });
    const read = await send('GET', '/_mock/dashboard/overview', { host: 'rebind.example:8787' });
    expect(read.status).toBe(403);
    expect(read.body.error).toMatchObject({ type: 'forbidden', field: 'headers.host', flag: '--allowed-host' });
    expect(read.body.error.message).toMatch(/'rebind\.example'.*DNS rebinding.*--allowed-host rebind\.example/);
    const reset = await send('POST', '/_mock/reset', { host: 'rebind.example:8787', 'x-loops-mock-admin': '1' });
    expect(reset.status).toBe(403);
    expect(await admin.faults()).toHaveLength(1);
    expect((await send('GET', '/healthz', { host: 'rebind.example' })).status).toBe(403);
  });

  it('answers localhost, *.localhost, IP addresses with or without a port, and a request with no Host (HTTP/1.0)', async () => {
    const { send } = await start();
    for (const host of [
      'localhost',
      'localhost:8787',
      'LOCALHOST.',
      'app.localhost:3000',
      '127.0.0.1:8787',
      '[::1]:8787',
      '[::1]',
      '192.168.1.20:8787',
      '10.0.0.1',
    ]) {
      expect((await send('GET', '/healthz', { host })).status, host).toBe(200);
    }
    const port = Number(new URL(server!.url).port);
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = connect(port, '127.0.0.1', () => socket.write('GET /healthz HTTP/1.0\r\n\r\n'));
      let text = '';
      socket.on('data', (c) => {
        text += c;
      });
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
    expect(answer).toMatch(/^HTTP\/1\.[01] 200/);
  });

  it("answers the names it is started under: --allowed-host, --host and --public-url's host; a real server refuses others", async () => {
    await start({ allowedHost: ['box.lan', 'loops-mock'], publicUrl: 'http://mock.internal:9000' });
    for (const host of ['box.lan:8787', 'Box.LAN', 'loops-mock:8787', 'mock.internal:9000'])
      expect((await withHost(server!.url, host, '/healthz')).status, host).toBe(200);
    const refused = await withHost(server!.url, 'other.lan:8787', '/healthz');
    expect(refused.status).toBe(403);
    expect(refused.body.error.message).toMatch(/'box\.lan', 'loops-mock', .*'mock\.internal'/);
  });

  it("Baseten's and the Hub's hosts are its names in proxy mode only (the interception's requests carry them)", () => {
    const direct = new HostCheck({ extra: ['127.0.0.1'] });
    const proxy = new HostCheck({ intercepted: { has: isInterceptedHost, description: "Baseten's and the Hub's hosts (proxy mode)" } });
    for (const host of ['api.baseten.co', 'model-abc123.api.baseten.co', 'app.baseten.co', 'huggingface.co']) {
      expect([direct.allows(host), proxy.allows(host)], host).toEqual([false, true]);
    }
    expect(proxy.allows('baseten.co.evil.example')).toBe(false);
    expect(proxy.refusal('x.example')).toMatch(/Baseten's and the Hub's hosts \(proxy mode\)/);
  });

  it('--allowed-host takes names and addresses without a port, from flags and LOOPS_MOCK_ALLOWED_HOST', () => {
    expect(parseOptions(['--allowed-host', 'Box.lan,[fe80::1]', '--allowed-host', 'svc_name'], { LOOPS_MOCK_ALLOWED_HOST: 'env.lan' }).allowedHost).toEqual([
      'env.lan',
      'box.lan',
      'fe80::1',
      'svc_name',
    ]);
    expect(() => parseOptions(['--allowed-host', 'box.lan:8787'])).toThrow(ConfigError);
    expect(() => parseOptions(['--allowed-host', 'http://box.lan'])).toThrow(/--allowed-host takes host names/);
  });
});

describe('the admin API refuses changes a page of another site could make (CSRF)', () => {
  it('a bodiless POST, DELETE or text/plain body without X-Loops-Mock-Admin is 403 naming the header, and nothing changes', async () => {
    const { send, admin } = await start();
    await admin.addFault({ match: { surface: 'trainer' }, action: { type: 'respond', status: 503 } });
    const attempts: [string, string, Record<string, string>, string?][] = [
      ['POST', '/_mock/reset', {}],
      ['POST', '/_mock/reset', { 'content-type': 'text/plain' }, ''],
      ['POST', '/_mock/operations/op123/release', {}],
      ['DELETE', '/_mock/faults', {}],
      ['POST', '/_mock/faults', { 'content-type': 'text/plain;charset=UTF-8' }, JSON.stringify({ action: { type: 'respond', status: 500 } })],
      ['POST', '/_mock/clock/advance', { 'content-type': 'application/x-www-form-urlencoded' }, 'ms=5'],
    ];
    for (const [method, url, headers, payload] of attempts) {
      const res = await send(method, url, headers, payload);
      expect([res.status, res.body.error.field], `${method} ${url}`).toEqual([403, 'headers.x-loops-mock-admin']);
      expect(res.body.error.message).toContain('X-Loops-Mock-Admin: 1');
    }
    expect(await admin.faults()).toHaveLength(1);
    // Reads need nothing; JSON bodies and the header pass.
    expect((await send('GET', '/_mock/journal')).status).toBe(200);
    expect(
      (await send('POST', '/_mock/faults', { 'content-type': 'application/json' }, JSON.stringify({ action: { type: 'respond', status: 500 } }))).status,
    ).toBe(200);
    expect((await send('POST', '/_mock/operations/op123/release', { 'x-loops-mock-admin': '1' })).status).toBe(404);
    expect((await send('POST', '/_mock/reset', { 'x-loops-mock-admin': '1' })).status).toBe(200);
    expect(await admin.faults()).toHaveLength(0);
  });

  it("refuses what a browser marks as another origin's, even another port of 127.0.0.1 holding the sign-in cookie", async () => {
    const { send, admin } = await start({ adminToken: 'sesame' });
    const cookie = 'loops_mock_admin=sesame';
    await admin.addFault({ match: { surface: 'trainer' }, action: { type: 'respond', status: 503 } });
    for (const site of ['same-site', 'cross-site']) {
      const res = await send('POST', '/_mock/reset', { cookie, 'sec-fetch-site': site, 'x-loops-mock-admin': '1' });
      expect([res.status, res.body.error.field], site).toEqual([403, 'headers.sec-fetch-site']);
    }
    // A browser without Sec-Fetch-* still sends Origin.
    const host = new URL(server!.url).host;
    const other = await send('POST', '/_mock/reset', { cookie, host, origin: 'http://127.0.0.1:1', 'x-loops-mock-admin': '1' });
    expect([other.status, other.body.error.field]).toEqual([403, 'headers.origin']);
    expect((await send('POST', '/_mock/reset', { cookie, origin: 'null', 'x-loops-mock-admin': '1' })).status).toBe(403);
    expect(await admin.faults()).toHaveLength(1);
    // The page's own: its Origin, or the browser's Sec-Fetch-Site: same-origin (no page can set it).
    expect((await send('DELETE', '/_mock/faults', { cookie, host, origin: `http://${host}`, 'x-loops-mock-admin': '1' })).status).toBe(200);
    expect((await send('POST', '/_mock/reset', { cookie, 'sec-fetch-site': 'same-origin' })).status).toBe(200);
  });

  it('the TypeScript admin client sends what is needed', async () => {
    const { admin } = await start({ adminToken: 't' });
    await admin.addProgress({ mode: 'manual' });
    expect((await admin.reset()).reset).toBe(true);
    expect(await admin.progressRules()).toEqual([]);
    await expect(admin.release('op123')).rejects.toMatchObject({ status: 404 });
  });
});
