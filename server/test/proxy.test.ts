import { X509Certificate } from 'node:crypto';
import { cpSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { describe, expect, it } from 'vitest';
import { LoopsCore } from '../core/core.js';
import { LocalCa } from '../proxy/ca.js';
import { ForwardProxy } from '../proxy/forward-proxy.js';
import { REPO_ROOT, startTestServer } from './helpers.js';
import {
  agent,
  caDir,
  dir,
  engines,
  KEY,
  keptLeaf,
  leafShown,
  plainProxyRequest,
  proxyEntry,
  rawConnect,
  run,
  server,
  useProxyServer,
  viaProxy,
} from './proxy-helpers.js';

useProxyServer();

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
    const plain = await plainProxyRequest(server.url, 'http://api.baseten.co/v1/loops/capabilities', { authorization: `Bearer ${KEY}` });
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
    const plain = await plainProxyRequest(server.url, 'http://example.org/some/path');
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
