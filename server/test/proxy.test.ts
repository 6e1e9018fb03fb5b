import { execFile, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { cpSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { promisify } from 'node:util';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { parseOptions, type RunningServer } from '../index.js';
import { LoopsCore } from '../core/core.js';
import { LocalCa } from '../proxy/ca.js';
import { ForwardProxy } from '../proxy/forward-proxy.js';
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
function rawConnect(target: string, url = server.url): Promise<{ head: string; body: string; socket: Socket }> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(new URL(url).port), '127.0.0.1');
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
async function proxyEntry(match: (e: ReturnType<RunningServer['core']['journal']['query']>[number]) => boolean, core = server.core) {
  for (let i = 0; i < 50; i++) {
    const found = core.journal.query({ surface: 'proxy' }).find(match);
    if (found) return found;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('no such proxy journal entry');
}

/** A verified TLS handshake for `name` through a CONNECT to `target` (the client checks chain and name): the leaf it was shown. */
async function leafShown(name: string, target = `${name}:443`): Promise<X509Certificate> {
  const { head, socket } = await rawConnect(target);
  expect(head).toMatch(/^HTTP\/1\.1 200/);
  return new Promise((resolve, reject) => {
    const tls = tlsConnect({ socket, servername: name, ca: readFileSync(join(caDir, 'ca.pem'), 'utf8') });
    tls.once('secureConnect', () => {
      const leaf = tls.getPeerX509Certificate()!;
      tls.destroy();
      resolve(leaf);
    });
    tls.once('error', reject);
  });
}

/** The certificate in the leaf file kept beside the CA. */
function keptLeaf(dir = caDir): X509Certificate {
  return new X509Certificate(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----\r?\n/.exec(readFileSync(join(dir, 'leaf.pem'), 'utf8'))![0]);
}

/** A plain-HTTP proxy request (absolute-form target) to the proxy at `url`. */
function plainProxyRequest(url: string, target: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      { host: '127.0.0.1', port: Number(new URL(url).port), path: target, headers: { host: new URL(target).host, ...headers } },
      (res) => {
        let text = '';
        res.on('data', (d: Buffer) => {
          text += d.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode!, body: text }));
      },
    );
    req.on('error', reject);
    req.end();
  });
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

    await leafShown('api.baseten.co');
    const leafBefore = keptLeaf().fingerprint256;
    const again = await startTestServer({ proxy: true, caDir, engines });
    try {
      expect(readFileSync(join(caDir, 'ca.pem'), 'utf8')).toBe(pem);
      const other = new ProxyAgent({ uri: again.url, requestTls: { ca: pem } });
      const res = await undiciFetch('https://api.baseten.co/v1/loops/capabilities', { dispatcher: other, headers: { authorization: `Bearer ${KEY}` } });
      expect(res.status).toBe(200);
      await other.close();
      // The leaf is the one kept beside the CA, not one minted by this start.
      const shown = await new Promise<X509Certificate>((resolve, reject) => {
        rawConnect('api.baseten.co:443', again.url).then(({ socket }) => {
          const tls = tlsConnect({ socket, servername: 'api.baseten.co', ca: pem });
          tls.once('secureConnect', () => {
            resolve(tls.getPeerX509Certificate()!);
            tls.destroy();
          });
          tls.once('error', reject);
        }, reject);
      });
      expect([shown.fingerprint256, keptLeaf().fingerprint256]).toEqual([leafBefore, leafBefore]);
    } finally {
      await again.close();
    }
  });

  it('shows one leaf, kept beside the CA, for every intercepted name: no CONNECT mints a certificate', async () => {
    const names = ['api.baseten.co', 'app.baseten.co', 'huggingface.co', 'model-abc123.api.baseten.co', 'model-zz9.api.baseten.co', 'chain-q1.api.baseten.co'];
    const leaves = [];
    for (const name of names) leaves.push(await leafShown(name));
    // SNI naming another intercepted host than the CONNECT target: the same leaf, and it verifies for that name.
    leaves.push(await leafShown('model-other.api.baseten.co', 'api.baseten.co:443'));
    expect(new Set(leaves.map((l) => l.fingerprint256)).size).toBe(1);
    const kept = keptLeaf();
    expect(leaves[0]!.fingerprint256).toBe(kept.fingerprint256);
    expect(kept.subjectAltName).toBe('DNS:api.baseten.co, DNS:*.api.baseten.co, DNS:app.baseten.co, DNS:huggingface.co');
    expect(kept.checkIssued(new X509Certificate(readFileSync(join(caDir, 'ca.pem'), 'utf8')))).toBe(true);
    // An EC key: each handshake costs the server a P-256 signature, not an RSA one.
    expect(kept.publicKey.asymmetricKeyType).toBe('ec');
    // It holds the leaf's key: owner-only, as the CA's key is.
    expect(statSync(join(caDir, 'leaf.pem')).mode & 0o777).toBe(0o600);
  });

  it('mints the leaf again when the kept one is not usable (another CA, or damaged)', async () => {
    const copy = join(dir, 'ca-copy');
    cpSync(caDir, copy, { recursive: true });
    const other = join(dir, 'ca-other');
    LocalCa.open(other).context();
    // A leaf of another CA, then a damaged file: each is replaced by one this CA signed.
    for (const planted of [readFileSync(join(other, 'leaf.pem'), 'utf8'), 'not a certificate\n']) {
      writeFileSync(join(copy, 'leaf.pem'), planted);
      LocalCa.open(copy).context();
      expect(keptLeaf(copy).checkIssued(new X509Certificate(readFileSync(join(copy, 'ca.pem'), 'utf8')))).toBe(true);
    }
    expect(keptLeaf(copy).fingerprint256).not.toBe(keptLeaf().fingerprint256);
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
    const { stdout } = await run('curl', [
      '-sS',
      '--proxy',
      server.url,
      '--cacert',
      join(caDir, 'ca.pem'),
      '-H',
      `Authorization: Bearer ${KEY}`,
      'https://api.baseten.co/v1/loops/capabilities',
    ]);
    expect(JSON.parse(stdout).supported_models.length).toBeGreaterThan(0);
    const refused = await run('curl', ['-sS', '--proxy', server.url, 'https://api.baseten.co/v1/loops/capabilities']).then(
      () => null,
      (err: { code: number; stderr: string }) => err,
    );
    expect(refused?.code).toBe(60);
    const entry = await proxyEntry((e) => /does not trust the loops-mock CA/.test(e.proxy?.error ?? ''));
    expect(entry.host).toBe('api.baseten.co');
  });

  it("answers plain-HTTP proxy requests for Baseten's hosts (absolute-form targets) like HTTPS ones", async () => {
    const plain = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = httpRequest(
        {
          host: '127.0.0.1',
          port: Number(new URL(server.url).port),
          path: 'http://api.baseten.co/v1/loops/capabilities',
          headers: { host: 'api.baseten.co', authorization: `Bearer ${KEY}` },
        },
        (res) => {
          let text = '';
          res.on('data', (d: Buffer) => {
            text += d.toString();
          });
          res.on('end', () => resolve({ status: res.statusCode!, body: text }));
        },
      );
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
    const created = await viaProxy('https://api.baseten.co/v1/loops/runs', {
      method: 'POST',
      body: { session_id: session.id, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4, max_seq_len: 64 },
    });
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

    const sampled = await viaProxy(`${sampler.base_url}/sample`, {
      method: 'POST',
      body: { prompt: datum.model_input, sampling_params: { max_tokens: 3, temperature: 0 } },
      headers: { 'x-min-policy-version': '1' },
    });
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
      const req = httpRequest(
        { host: '127.0.0.1', port: Number(new URL(server.url).port), path: 'http://example.org/some/path', headers: { host: 'example.org' } },
        (res) => {
          let text = '';
          res.on('data', (d: Buffer) => {
            text += d.toString();
          });
          res.on('end', () => resolve({ status: res.statusCode!, body: text }));
        },
      );
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

  it('a name two labels under api.baseten.co, which the leaf does not cover', async () => {
    const { head, socket } = await rawConnect('a.b.api.baseten.co:443');
    socket.destroy();
    expect(head).toMatch(/^HTTP\/1\.1 403 loops-mock does not proxy a\.b\.api\.baseten\.co: /);
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

describe('clients that leave, and the handshake limit', () => {
  it('a CONNECT whose client leaves before its handshake frees its socket at once, not after the 10 s handshake timeout', async () => {
    const { head, socket } = await rawConnect('api.baseten.co:443');
    expect(head).toMatch(/^HTTP\/1\.1 200/);
    const before = server.core.journal.query({ surface: 'proxy' }).length;
    socket.end();
    const closed = new Promise((r) => socket.once('close', r));
    // The proxy ends its side too (the client sees the close), and the journal says why, well within the 10 s.
    await closed;
    const entry = await proxyEntry(
      (e) =>
        e.seq > 0 &&
        server.core.journal.query({ surface: 'proxy' }).indexOf(e) >= before &&
        /client closed the connection before the TLS handshake/.test(e.proxy?.error ?? ''),
    );
    expect(entry.proxy?.action).toBe('intercept');
  });

  it('past the handshake limit a CONNECT is refused with 503, logged, and let in again once one ends', async () => {
    const core = new LoopsCore({ engines });
    const http = createServer((_req, res) => res.end());
    const proxy = new ForwardProxy(core, { ca: LocalCa.open(caDir), passthrough: [], maxHandshakes: 2 });
    const warnings: string[] = [];
    proxy.onWarning((m) => warnings.push(m));
    proxy.attach(http);
    await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
    try {
      const first = await rawConnect('api.baseten.co:443', url);
      const second = await rawConnect('api.baseten.co:443', url);
      expect([first.head, second.head].every((h) => h.startsWith('HTTP/1.1 200'))).toBe(true);
      const third = await rawConnect('api.baseten.co:443', url);
      third.socket.destroy();
      expect(third.head).toMatch(/^HTTP\/1\.1 503 loops-mock has 2 TLS handshakes in progress, its limit/);
      expect(JSON.parse(third.body).error).toMatchObject({ limit: 2 });
      expect(warnings).toHaveLength(1);
      expect(warnings[0]).toMatch(/1 CONNECT\(s\) refused with 503: 2 TLS handshakes already in progress/);
      expect((await proxyEntry((e) => e.status === 503, core)).proxy).toMatchObject({ action: 'refuse', error: 'handshake limit' });
      first.socket.destroy();
      await proxyEntry((e) => e.status === 200 && /client closed/.test(e.proxy?.error ?? ''), core);
      const fourth = await rawConnect('api.baseten.co:443', url);
      expect(fourth.head).toMatch(/^HTTP\/1\.1 200/);
      fourth.socket.destroy();
      second.socket.destroy();
    } finally {
      proxy.close();
      http.closeAllConnections();
      await new Promise((r) => http.close(r));
      core.close();
    }
  });
});

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
