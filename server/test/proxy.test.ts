import { execFile, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createServer, request as httpRequest, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { promisify } from 'node:util';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import type { RunningServer } from '../index.js';
import { REPO_ROOT, startTestServer } from './helpers.js';

const run = promisify(execFile);
let dir: string;
let caDir: string;
let engines: EnginePool;
let server: RunningServer;
let agent: ProxyAgent;
const KEY = 'proxy-test-key';

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'proxy-test-'));
  caDir = join(dir, 'ca');
  engines = new EnginePool();
  server = await startTestServer({ proxy: true, caDir, engines });
  agent = new ProxyAgent({ uri: server.url, requestTls: { ca: readFileSync(join(caDir, 'ca.pem'), 'utf8') } });
});

afterAll(async () => {
  await agent?.close();
  await server?.close();
  await engines?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** fetch through the proxy, as a Node client given HTTPS_PROXY and the CA would (undici's ProxyAgent). */
async function viaProxy(url: string, init: { method?: string; body?: unknown; headers?: Record<string, string> } = {}) {
  const res = await undiciFetch(url, {
    method: init.method ?? 'GET',
    dispatcher: agent,
    headers: { authorization: `Bearer ${KEY}`, ...(init.body === undefined ? {} : { 'content-type': 'application/json' }), ...init.headers },
    ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) };
}

/** A raw CONNECT: the status line and headers of the proxy's answer, and the socket for what follows. */
function rawConnect(target: string): Promise<{ head: string; body: string; socket: import('node:net').Socket }> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(new URL(server.url).port), '127.0.0.1');
    let data = '';
    socket.once('connect', () => socket.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
    socket.on('error', reject);
    const onData = (chunk: Buffer) => {
      data += chunk.toString('latin1');
      const end = data.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = data.slice(0, end);
      const length = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
      if (data.length < end + 4 + length) return;
      socket.off('data', onData);
      resolve({ head, body: data.slice(end + 4, end + 4 + length), socket });
    };
    socket.on('data', onData);
  });
}

/** The journal's proxy entries, once the one sought has landed (a handshake failure is recorded a moment after the client gives up). */
async function proxyEntry(match: (e: ReturnType<RunningServer['core']['journal']['query']>[number]) => boolean) {
  for (let i = 0; i < 50; i++) {
    const found = server.core.journal.query({ surface: 'proxy' }).find(match);
    if (found) return found;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('no such proxy journal entry');
}

describe('the local CA', () => {
  it('is made once, its key readable by its owner only, valid for years, and reused by a restarted server', async () => {
    const pem = readFileSync(join(caDir, 'ca.pem'), 'utf8');
    const ca = new X509Certificate(pem);
    expect(ca.ca).toBe(true);
    expect(ca.subject).toContain('loops-mock local CA');
    expect(Date.parse(ca.validTo) - Date.now()).toBeGreaterThan(5 * 365 * 86_400_000);
    expect(statSync(join(caDir, 'ca-key.pem')).mode & 0o777).toBe(0o600);
    expect(statSync(caDir).mode & 0o777).toBe(0o700);
    // The bundle holds the CA after the usual roots, so a client given it still trusts other hosts.
    const bundle = readFileSync(join(caDir, 'ca-bundle.pem'), 'utf8');
    expect(bundle.endsWith(pem)).toBe(true);
    expect(bundle.split('BEGIN CERTIFICATE').length).toBeGreaterThan(100);

    const again = await startTestServer({ proxy: true, caDir, engines });
    try {
      expect(readFileSync(join(caDir, 'ca.pem'), 'utf8')).toBe(pem);
      const other = new ProxyAgent({ uri: again.url, requestTls: { ca: pem } });
      const res = await undiciFetch('https://api.baseten.co/v1/loops/capabilities', { dispatcher: other, headers: { authorization: `Bearer ${KEY}` } });
      expect(res.status).toBe(200);
      await other.close();
    } finally {
      await again.close();
    }
  });

  it('`loops-mock ca` prints where it is and its PEM', async () => {
    const { stdout } = await run('npx', ['tsx', join(REPO_ROOT, 'server/cli.ts'), 'ca', '--ca-dir', caDir], { cwd: REPO_ROOT });
    expect(stdout).toContain(`CA_CERT=${join(caDir, 'ca.pem')}`);
    expect(stdout).toContain(`CA_BUNDLE=${join(caDir, 'ca-bundle.pem')}`);
    expect(stdout).toContain(readFileSync(join(caDir, 'ca.pem'), 'utf8'));
  }, 30_000);
});

describe('proxy mode, as clients see it', () => {
  it('Node (undici ProxyAgent) reaches https://api.baseten.co with the CA and nothing else', async () => {
    const res = await viaProxy('https://api.baseten.co/v1/loops/capabilities');
    expect(res.status).toBe(200);
    expect(res.headers.get('x-loops-mock-version')).toBeTruthy();
    expect(res.json().supported_models.map((m: { model_name: string }) => m.model_name)).toContain('Qwen/Qwen3.5-2B');
  });

  it('curl with --proxy and --cacert does too, and without the CA refuses the certificate', async () => {
    const { stdout } = await run('curl', ['-sS', '--proxy', server.url, '--cacert', join(caDir, 'ca.pem'), '-H', `Authorization: Bearer ${KEY}`, 'https://api.baseten.co/v1/loops/capabilities']);
    expect(JSON.parse(stdout).supported_models.length).toBeGreaterThan(0);
    const refused = await run('curl', ['-sS', '--proxy', server.url, 'https://api.baseten.co/v1/loops/capabilities']).then(() => null, (err: { code: number; stderr: string }) => err);
    expect(refused?.code).toBe(60);
    const entry = await proxyEntry((e) => /does not trust the loops-mock CA/.test(e.proxy?.error ?? ''));
    expect(entry.host).toBe('api.baseten.co');
  });

  it('answers plain-HTTP proxy requests for Baseten\'s hosts (absolute-form targets) like HTTPS ones', async () => {
    const plain = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = httpRequest({ host: '127.0.0.1', port: Number(new URL(server.url).port), path: 'http://api.baseten.co/v1/loops/capabilities', headers: { host: 'api.baseten.co', authorization: `Bearer ${KEY}` } }, (res) => {
        let text = '';
        res.on('data', (d: Buffer) => { text += d.toString(); });
        res.on('end', () => resolve({ status: res.statusCode!, body: text }));
      });
      req.on('error', reject);
      req.end();
    });
    expect(plain.status).toBe(200);
    expect(JSON.parse(plain.body).supported_models.length).toBeGreaterThan(0);
    const entry = server.core.journal.query({ surface: 'control' }).at(-1)!;
    expect([entry.path, entry.host]).toEqual(['/v1/loops/capabilities', 'api.baseten.co']);
  });

  it('hands out Baseten-shaped trainer, sampler and download URLs, and serves every plane on them', async () => {
    const session = (await viaProxy('https://api.baseten.co/v1/loops/sessions', { method: 'POST' })).json().session;
    const created = await viaProxy('https://api.baseten.co/v1/loops/runs', { method: 'POST', body: { session_id: session.id, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4, max_seq_len: 64 } });
    expect(created.status).toBe(200);
    const runView = created.json().run;
    expect(runView.base_url).toBe(`https://model-${runView.deployment_id}.api.baseten.co/deployment/${runView.id}/sync`);
    const sampler = runView.sampler;
    expect(sampler.base_url).toBe(`https://model-${sampler.model_id}.api.baseten.co/deployment/${sampler.deployment_id}/sync`);
    // What a host-checking client (smithtune) demands of a sampler URL: https, a host under .api.baseten.co, port 443, no query.
    const url = new URL(sampler.base_url);
    expect(url.protocol === 'https:' && url.hostname.endsWith('.api.baseten.co') && url.port === '' && !url.search && !url.username).toBe(true);

    const trainer = runView.base_url;
    const datum = { model_input: { chunks: [{ type: 'encoded_text', tokens: [9707, 11, 1879, 0] }] } };
    const op = async (name: string, body: unknown) => {
      const submitted = await viaProxy(`${trainer}/${name}`, { method: 'POST', body, headers: { 'idempotency-key': `${name}-${Math.random()}` } });
      expect(submitted.status, submitted.text).toBe(200);
      const polled = await viaProxy(`${trainer}/operations/${submitted.json().operation_id}`);
      expect(polled.json().status, polled.text).toBe('done');
      return polled.json().result;
    };
    expect(typeof (await op('forward_backward', { data: [datum], loss_fn: 'cross_entropy' })).loss).toBe('number');
    expect((await op('optim_step', { adam_params: { learning_rate: 1e-3 } })).policy_version).toBe(1);
    const saved = await op('save_weights_for_sampler', { name: 'proxied' });
    expect((await viaProxy(`${trainer}/policy_version`)).json().policy_version).toBe(1);

    const sampled = await viaProxy(`${sampler.base_url}/sample`, { method: 'POST', body: { prompt: datum.model_input, sampling_params: { max_tokens: 3, temperature: 0 } }, headers: { 'x-min-policy-version': '1' } });
    expect(sampled.status, sampled.text).toBe(200);
    expect(sampled.json().policy_version).toBe(1);
    expect((await viaProxy(`${sampler.base_url}/v1/models`)).json().data.length).toBe(2);
    // The environment form a promoted deployment is called by reaches the same sampler.
    expect((await viaProxy(`https://model-${sampler.model_id}.api.baseten.co/environments/production/sync/policy_version`)).json().published_version).toBe(1);
    expect((await viaProxy(`https://api.baseten.co/v1/models/${sampler.model_id}/deployments/${sampler.deployment_id}`)).json().status).toBe('ACTIVE');

    const [checkpoint] = (await viaProxy(`https://api.baseten.co/v1/loops/checkpoints?checkpoint_path=${encodeURIComponent(saved.path)}`)).json().checkpoints;
    const files = (await viaProxy(`https://api.baseten.co/v1/loops/checkpoints/${checkpoint.id}/files`)).json().presigned_urls;
    for (const f of files) {
      expect(f.url.startsWith('https://api.baseten.co/checkpoint-files/')).toBe(true);
      const download = await undiciFetch(f.url, { dispatcher: agent });
      expect(download.status).toBe(200);
      expect((await download.arrayBuffer()).byteLength).toBe(f.size_bytes);
    }

    // The journal keeps the app's routes (what the conformance checks read) and says which host the client called.
    const trainerEntry = server.core.journal.query({ surface: 'trainer' }).find((e) => e.route === '/trainer/{run_id}/forward_backward')!;
    expect(trainerEntry.host).toBe(`model-${runView.deployment_id}.api.baseten.co`);
    expect(trainerEntry.run_id).toBe(runView.id);
    const samplerEntry = server.core.journal.query({ surface: 'sampler' }).find((e) => e.op === 'sample')!;
    expect(samplerEntry.host).toBe(`model-${sampler.model_id}.api.baseten.co`);
    expect(samplerEntry.sampler_id).toBe(sampler.id);

    // An unknown deployment on a model host is a 404 in the error shape.
    const unknown = await viaProxy('https://model-nosuchmo.api.baseten.co/deployment/nope123/sync/sample', { method: 'POST', body: {} });
    expect(unknown.status).toBe(404);
    expect(unknown.json().error.type).toBe('route_not_found');
  });
});

describe('what the proxy refuses, and why', () => {
  it('another host, over CONNECT and as a plain-HTTP proxy request: 403 naming the host and the flag, in the journal', async () => {
    const { head, body, socket } = await rawConnect('example.com:443');
    socket.destroy();
    expect(head).toMatch(/^HTTP\/1\.1 403 loops-mock does not proxy example\.com: .*--proxy-passthrough example\.com/);
    expect(JSON.parse(body).error).toMatchObject({ type: 'proxy_refused', host: 'example.com' });
    const plain = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = httpRequest({ host: '127.0.0.1', port: Number(new URL(server.url).port), path: 'http://example.org/some/path', headers: { host: 'example.org' } }, (res) => {
        let text = '';
        res.on('data', (d: Buffer) => { text += d.toString(); });
        res.on('end', () => resolve({ status: res.statusCode!, body: text }));
      });
      req.on('error', reject);
      req.end();
    });
    expect(plain.status).toBe(403);
    expect(JSON.parse(plain.body).error.message).toMatch(/does not proxy example\.org.*--proxy-passthrough example\.org/);
    expect((await proxyEntry((e) => e.host === 'example.com')).proxy).toMatchObject({ action: 'refuse', port: 443 });
    expect((await proxyEntry((e) => e.host === 'example.org')).status).toBe(403);
  });

  it('a CONNECT to another port of an intercepted host', async () => {
    const { head, body, socket } = await rawConnect('api.baseten.co:8443');
    socket.destroy();
    expect(head).toMatch(/^HTTP\/1\.1 403 loops-mock intercepts api\.baseten\.co on port 443 only/);
    expect(JSON.parse(body).error.port).toBe(8443);
    expect((await proxyEntry((e) => e.path === 'api.baseten.co:8443')).proxy?.action).toBe('refuse');
  });

  it('a malformed CONNECT target', async () => {
    const { head, socket } = await rawConnect('no-port-here');
    socket.destroy();
    expect(head).toMatch(/^HTTP\/1\.1 400 /);
  });

  it('a Node client that does not trust the CA fails its handshake; the journal names the fix', async () => {
    const { head, socket } = await rawConnect('api.baseten.co:443');
    expect(head).toMatch(/^HTTP\/1\.1 200/);
    const failure = await new Promise<Error>((resolve) => {
      const tls = tlsConnect({ socket, servername: 'api.baseten.co' });
      tls.once('secureConnect', () => resolve(new Error('the handshake succeeded')));
      tls.once('error', resolve);
    });
    expect((failure as NodeJS.ErrnoException).code).toMatch(/SELF_SIGNED_CERT_IN_CHAIN|UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT/);
    socket.destroy();
    const entry = await proxyEntry((e) => e.host === 'api.baseten.co' && /does not trust the loops-mock CA/.test(e.proxy?.error ?? '') && e.seq > 0);
    expect(entry.proxy?.error).toContain(join(caDir, 'ca.pem'));
  });
});

describe('shutdown in proxy mode', () => {
  it('does not wait on kept-alive intercepted connections, open tunnels or unfinished handshakes', async () => {
    const upstream = createServer((_req, res) => res.end('up'));
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    const closing = await startTestServer({ proxy: true, caDir, engines, proxyPassthrough: ['127.0.0.1'] });
    const port = Number(new URL(closing.url).port);
    const keptAlive = new ProxyAgent({ uri: closing.url, requestTls: { ca: readFileSync(join(caDir, 'ca.pem'), 'utf8') } });
    expect((await undiciFetch('https://api.baseten.co/v1/loops/capabilities', { dispatcher: keptAlive, headers: { authorization: 'Bearer k' } })).status).toBe(200);
    const open = (target: string) => new Promise<import('node:net').Socket>((resolve) => {
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

  beforeAll(async () => {
    upstream = createServer((req, res) => res.end(`upstream saw ${req.method} ${req.url}`));
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    passing = await startTestServer({ proxy: true, caDir, engines, proxyPassthrough: ['127.0.0.1'] });
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
      const req = httpRequest({ host: '127.0.0.1', port: proxyPort, path: `http://127.0.0.1:${port}/plain?x=1`, headers: { host: `127.0.0.1:${port}` } }, (res) => {
        let text = '';
        res.on('data', (d: Buffer) => { text += d.toString(); });
        res.on('end', () => resolve(text));
      });
      req.on('error', reject);
      req.end();
    });
    expect(forwarded).toBe('upstream saw GET /plain?x=1');
    const entries = passing.core.journal.query({ surface: 'proxy' });
    expect(entries.filter((e) => e.proxy?.action === 'passthrough' && e.host === '127.0.0.1')).toHaveLength(2);
  });

  it('refuses a bad --proxy-passthrough and --public-url with --proxy at start', async () => {
    const cli = (args: string[]) => new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const child = spawn('npx', ['tsx', join(REPO_ROOT, 'server/cli.ts'), '--port', '0', '--proxy', '--ca-dir', caDir, ...args], { cwd: REPO_ROOT });
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
      child.on('close', (code) => resolve({ code, stderr }));
    });
    const badHost = await cli(['--proxy-passthrough', 'example.com:443']);
    expect(badHost.code).toBe(2);
    expect(badHost.stderr).toMatch(/--proxy-passthrough takes host names or IP addresses without a port/);
    const both = await cli(['--public-url', 'http://example.com']);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/--public-url does not go with --proxy/);
  }, 60_000);
});
