import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseOptions, type RunningServer } from '../index.js';
import { REPO_ROOT, startTestServer } from './helpers.js';
import { caDir, engines, plainProxyRequest, proxyEntry, rawConnect, useProxyServer } from './proxy-helpers.js';

useProxyServer();

describe('shutdown in proxy mode', () => {
  it('does not wait on kept-alive intercepted connections, open tunnels or unfinished handshakes', async () => {
    const upstream = createServer((_req, res) => res.end('up'));
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    const closing = await startTestServer({ proxy: true, caDir, engines, proxyPassthrough: [`127.0.0.1:${(upstream.address() as AddressInfo).port}`] });
    const port = Number(new URL(closing.url).port);
    const keptAlive = new ProxyAgent({ uri: closing.url, requestTls: { ca: readFileSync(join(caDir, 'ca.pem'), 'utf8') } });
    expect((await undiciFetch('https://api.baseten.co/v1/loops/capabilities', { dispatcher: keptAlive, headers: { authorization: 'Bearer k' } })).status).toBe(
      200,
    );
    const open = (target: string) =>
      new Promise<import('node:net').Socket>((resolve) => {
        const socket = connect(port, '127.0.0.1', () => socket.write(`CONNECT ${target} HTTP/1.1\r\n\r\n`));
        socket.once('data', () => resolve(socket));
        socket.on('error', () => undefined);
      });
    const tunnel = await open(`127.0.0.1:${(upstream.address() as AddressInfo).port}`);
    const handshake = await open('api.baseten.co:443');
    const started = Date.now();
    await closing.close();
    expect(Date.now() - started).toBeLessThan(3000);
    await keptAlive.close();
    tunnel.destroy();
    handshake.destroy();
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  });
});

describe('--proxy-passthrough', () => {
  let upstream: Server;
  let passing: RunningServer;
  let seen: IncomingHttpHeaders | undefined;
  /** A port nothing listens on: a passthrough target the proxy cannot reach. */
  let deadPort: number;

  beforeAll(async () => {
    upstream = createServer((req, res) => {
      seen = req.headers;
      res.end(`upstream saw ${req.method} ${req.url}`);
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    const dead = createTcpServer();
    await new Promise<void>((r) => dead.listen(0, '127.0.0.1', r));
    deadPort = (dead.address() as AddressInfo).port;
    await new Promise((r) => dead.close(r));
    const port = (upstream.address() as AddressInfo).port;
    passing = await startTestServer({ proxy: true, caDir, engines, proxyPassthrough: [`127.0.0.1:${port}`, `127.0.0.1:${deadPort}`, 'localhost'] });
  });
  afterAll(async () => {
    await passing?.close();
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  });

  it('tunnels a named host untouched, over CONNECT and as plain HTTP (a loopback upstream)', async () => {
    const port = (upstream.address() as AddressInfo).port;
    const proxyPort = Number(new URL(passing.url).port);
    const tunnelled = await new Promise<string>((resolve, reject) => {
      const socket = connect(proxyPort, '127.0.0.1', () => socket.write(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`));
      let data = '';
      let sent = false;
      socket.on('data', (d: Buffer) => {
        data += d.toString();
        if (!sent && data.includes('\r\n\r\n')) {
          sent = true;
          expect(data).toMatch(/^HTTP\/1\.1 200/);
          data = '';
          socket.write('GET /through-the-tunnel HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
        }
      });
      socket.on('end', () => resolve(data));
      socket.on('error', reject);
    });
    expect(tunnelled).toContain('upstream saw GET /through-the-tunnel');
    const forwarded = await new Promise<string>((resolve, reject) => {
      const req = httpRequest(
        { host: '127.0.0.1', port: proxyPort, path: `http://127.0.0.1:${port}/plain?x=1`, headers: { host: `127.0.0.1:${port}` } },
        (res) => {
          let text = '';
          res.on('data', (d: Buffer) => {
            text += d.toString();
          });
          res.on('end', () => resolve(text));
        },
      );
      req.on('error', reject);
      req.end();
    });
    expect(forwarded).toBe('upstream saw GET /plain?x=1');
    const entries = passing.core.journal.query({ surface: 'proxy' });
    expect(entries.filter((e) => e.proxy?.action === 'passthrough' && e.host === '127.0.0.1')).toHaveLength(2);
  });

  it('passes only the ports it was given: a bare host is its port 443, HOST:PORT names another', async () => {
    const port = (upstream.address() as AddressInfo).port;
    // localhost was given bare: its port 443 would tunnel, the upstream's port on it does not.
    const bare = await rawConnect(`localhost:${port}`, passing.url);
    bare.socket.destroy();
    expect(bare.head).toMatch(new RegExp(`^HTTP/1\\.1 403 loops-mock does not proxy localhost:${port}: .*--proxy-passthrough localhost:${port}`));
    const otherPort = await rawConnect(`127.0.0.1:${port + 1 === deadPort ? port + 2 : port + 1}`, passing.url);
    otherPort.socket.destroy();
    expect(otherPort.head).toMatch(/^HTTP\/1\.1 403 loops-mock does not proxy 127\.0\.0\.1:/);
    // Plain HTTP to a bare host's port 80 is not its port 443 either.
    const plain = await plainProxyRequest(passing.url, 'http://localhost/x');
    expect(plain.status).toBe(403);
    expect(JSON.parse(plain.body).error.message).toMatch(/--proxy-passthrough localhost:80/);
  });

  it('answers 502, with the reason and a JSON body, when a passthrough target cannot be reached', async () => {
    const { head, body, socket } = await rawConnect(`127.0.0.1:${deadPort}`, passing.url);
    socket.destroy();
    expect(head).toMatch(new RegExp(`^HTTP/1\\.1 502 loops-mock could not reach 127\\.0\\.0\\.1:${deadPort}`));
    expect(JSON.parse(body).error).toMatchObject({ type: 'bad_gateway', port: deadPort });
    expect((await proxyEntry((e) => e.path === `127.0.0.1:${deadPort}`, passing.core)).status).toBe(502);
  });

  it("does not forward the proxy's own headers (Proxy-Authorization, Proxy-Connection) nor hop-by-hop ones upstream", async () => {
    const port = (upstream.address() as AddressInfo).port;
    seen = undefined;
    const res = await plainProxyRequest(passing.url, `http://127.0.0.1:${port}/h`, {
      'proxy-authorization': 'Basic c2VjcmV0',
      'proxy-connection': 'keep-alive',
      connection: 'x-hop',
      'x-hop': '1',
      'x-kept': 'yes',
    });
    expect(res.body).toBe('upstream saw GET /h');
    expect(seen).toMatchObject({ 'x-kept': 'yes' });
    expect(Object.keys(seen!).filter((h) => ['proxy-authorization', 'proxy-connection', 'x-hop'].includes(h))).toEqual([]);
  });

  it('refuses a CONNECT, or a proxy request, sent inside one of its own intercepted tunnels', async () => {
    const port = (upstream.address() as AddressInfo).port;
    const { socket } = await rawConnect('api.baseten.co:443', passing.url);
    const tls = tlsConnect({ socket, servername: 'api.baseten.co', ca: readFileSync(join(caDir, 'ca.pem'), 'utf8') });
    await new Promise((r, j) => {
      tls.once('secureConnect', r);
      tls.once('error', j);
    });
    const answer = (text: string) =>
      new Promise<string>((resolve) => {
        let data = '';
        tls.on('data', (d: Buffer) => {
          data += d.toString();
          if (data.includes('}')) resolve(data);
        });
        tls.write(text);
      });
    // Without the check the inner CONNECT would open a tunnel to the passthrough upstream.
    const nested = await answer(`CONNECT 127.0.0.1:${port} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\n`);
    expect(nested).toMatch(/^HTTP\/1\.1 403 loops-mock refuses a proxy request sent inside one of its own tunnels/);
    tls.destroy();

    const again = await rawConnect('api.baseten.co:443', passing.url);
    const inner = tlsConnect({ socket: again.socket, servername: 'api.baseten.co', ca: readFileSync(join(caDir, 'ca.pem'), 'utf8') });
    await new Promise((r, j) => {
      inner.once('secureConnect', r);
      inner.once('error', j);
    });
    const forwarded = await new Promise<string>((resolve) => {
      let data = '';
      inner.on('data', (d: Buffer) => {
        data += d.toString();
      });
      inner.on('end', () => resolve(data));
      inner.write(`GET http://127.0.0.1:${port}/nested HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: close\r\n\r\n`);
    });
    inner.destroy();
    expect(forwarded).toMatch(/^HTTP\/1\.1 403/);
    expect(forwarded).not.toContain('upstream saw');
  });

  it('reads HOST and HOST:PORT from the command line', () => {
    expect(parseOptions(['--proxy-passthrough', 'Example.com,127.0.0.1:8080,[::1]:8443,::1']).proxyPassthrough).toEqual([
      'example.com',
      '127.0.0.1:8080',
      '[::1]:8443',
      '::1',
    ]);
  });

  it('refuses a bad --proxy-passthrough and --public-url with --proxy at start', async () => {
    const cli = (args: string[]) =>
      new Promise<{ code: number | null; stderr: string }>((resolve) => {
        const child = spawn('npx', ['tsx', join(REPO_ROOT, 'server/cli.ts'), '--port', '0', '--proxy', '--ca-dir', caDir, ...args], { cwd: REPO_ROOT });
        let stderr = '';
        child.stderr.on('data', (d: Buffer) => {
          stderr += d.toString();
        });
        child.on('close', (code) => resolve({ code, stderr }));
      });
    const badHost = await cli(['--proxy-passthrough', 'example.com:99999']);
    expect(badHost.code).toBe(2);
    expect(badHost.stderr).toMatch(/--proxy-passthrough takes HOST \(its port 443\) or HOST:PORT, .*got 'example.com:99999': the port must be 1-65535/);
    const badName = await cli(['--proxy-passthrough', 'exa mple.com']);
    expect(badName.code).toBe(2);
    expect(badName.stderr).toMatch(/--proxy-passthrough takes HOST \(its port 443\) or HOST:PORT/);
    const both = await cli(['--public-url', 'http://example.com']);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/--public-url does not go with --proxy/);
  }, 60_000);
});
