// What the proxy-mode tests share: one proxy-mode server per file, and clients that reach it as proxies (CONNECT, plain HTTP, TLS, undici).
import { execFile } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { promisify } from 'node:util';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, expect } from 'vitest';
import { EnginePool } from '../../models/index.js';
import type { RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

export const run = promisify(execFile);
export let dir: string;
export let caDir: string;
export let engines: EnginePool;
export let server: RunningServer;
export let agent: ProxyAgent;
export const KEY = 'proxy-test-key';

/** One proxy-mode server for a test file, its CA in a fresh folder. */
export function useProxyServer(): void {
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
}

/** fetch through the proxy, as a Node client given HTTPS_PROXY and the CA would (undici's ProxyAgent). */
export async function viaProxy(url: string, init: { method?: string; body?: unknown; headers?: Record<string, string> } = {}) {
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
export function rawConnect(target: string, url = server.url): Promise<{ head: string; body: string; socket: Socket }> {
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
export async function proxyEntry(match: (e: ReturnType<RunningServer['core']['journal']['query']>[number]) => boolean, core = server.core) {
  for (let i = 0; i < 50; i++) {
    const found = core.journal.query({ surface: 'proxy' }).find(match);
    if (found) return found;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('no such proxy journal entry');
}

/** A verified TLS handshake for `name` through a CONNECT to `target` (the client checks chain and name): the leaf it was shown. */
export async function leafShown(name: string, target = `${name}:443`): Promise<X509Certificate> {
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
export function keptLeaf(dir = caDir): X509Certificate {
  return new X509Certificate(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----\r?\n/.exec(readFileSync(join(dir, 'leaf.pem'), 'utf8'))![0]);
}

/** A plain-HTTP proxy request (absolute-form target) to the proxy at `url`. */
export function plainProxyRequest(url: string, target: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
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
