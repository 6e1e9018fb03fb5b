import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ProxyAgent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

/**
 * Proxy mode and the Hub mirror in one pass, as an unmodified client meets them: Baseten's and the
 * Hub's own URLs through HTTPS_PROXY with the local CA. The short test of both surfaces for
 * `npm run test:quick`; proxy.test.ts and hub.test.ts hold the rest.
 */
let dir: string;
let server: RunningServer;
let agent: ProxyAgent;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'proxy-hub-smoke-'));
  server = await startTestServer({ proxy: true, caDir: join(dir, 'ca') });
  agent = new ProxyAgent({ uri: server.env.HTTPS_PROXY!, requestTls: { ca: readFileSync(server.env.SSL_CERT_FILE!, 'utf8') } });
});
afterAll(async () => {
  await agent?.close();
  await server?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('proxy mode with the Hub mirror', () => {
  it("answers Baseten's control plane at api.baseten.co through the proxy", async () => {
    const res = await undiciFetch('https://api.baseten.co/v1/loops/capabilities', {
      dispatcher: agent,
      headers: { authorization: `Api-Key ${server.env.BASETEN_API_KEY}` },
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { supported_models: { model_name: string }[] }).supported_models.map((m) => m.model_name)).toContain('Qwen/Qwen3.5-2B');
  });

  it("serves a base model's repo at huggingface.co through the proxy, and a file of it", async () => {
    const info = (await (await undiciFetch('https://huggingface.co/api/models/Qwen/Qwen3.5-2B', { dispatcher: agent })).json()) as { id: string; sha: string };
    expect(info.id).toBe('Qwen/Qwen3.5-2B');
    expect(info.sha).toMatch(/^[0-9a-f]{40}$/);
    const file = await undiciFetch(`https://huggingface.co/Qwen/Qwen3.5-2B/resolve/${info.sha}/tokenizer_config.json`, { dispatcher: agent });
    expect(file.status).toBe(200);
    expect(file.headers.get('x-repo-commit')).toBe(info.sha);
    expect(JSON.parse(await file.text())).toHaveProperty('tokenizer_class');
  });
});
