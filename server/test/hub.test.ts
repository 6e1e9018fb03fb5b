import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EnginePool, Tokenizers } from '../../models/index.js';
import type { RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

/** The Hugging Face Hub mirror, by the headers and bodies huggingface_hub reads (client-tests/ drives the real library). */
const MODEL = 'Qwen/Qwen3.5-2B';
let server: RunningServer;
let hf: string;
const tokenizerJson = readFileSync(new Tokenizers().files(MODEL).tokenizerJson);
const blobId = (b: Buffer) => createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex');

beforeAll(async () => {
  server = await startTestServer();
  hf = server.env.HF_ENDPOINT!;
});
afterAll(() => server.close());

describe('the Hub mirror', () => {
  it('is printed as HF_ENDPOINT, at /hf of the server', () => {
    expect(hf).toBe(`${server.url}/hf`);
  });

  it('answers model info with the revision sha and the files, at main and at that sha', async () => {
    const info = await (await fetch(`${hf}/api/models/${MODEL}`)).json() as { id: string; sha: string; siblings: { rfilename: string }[]; private: boolean };
    expect(info.id).toBe(MODEL);
    expect(info.sha).toMatch(/^[0-9a-f]{40}$/);
    expect(info.private).toBe(false);
    expect(info.siblings.map((s) => s.rfilename).sort()).toEqual(['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
    const pinned = await fetch(`${hf}/api/models/${MODEL}/revision/${info.sha}`);
    expect(((await pinned.json()) as { sha: string }).sha).toBe(info.sha);
    const tree = await (await fetch(`${hf}/api/models/${MODEL}/tree/main?recursive=true&expand=false`)).json() as { type: string; path: string; size: number; oid: string }[];
    expect(tree.find((f) => f.path === 'tokenizer.json')).toEqual({ type: 'file', path: 'tokenizer.json', size: tokenizerJson.length, oid: blobId(tokenizerJson) });
  });

  it('serves a file on HEAD and GET with the commit, a quoted ETag, its size and byte ranges', async () => {
    const url = `${hf}/${MODEL}/resolve/main/tokenizer.json`;
    const head = await fetch(url, { method: 'HEAD' });
    expect(head.status).toBe(200);
    const sha = head.headers.get('x-repo-commit');
    expect(sha).toMatch(/^[0-9a-f]{40}$/);
    expect(head.headers.get('etag')).toBe(`"${blobId(tokenizerJson)}"`);
    expect(Number(head.headers.get('content-length'))).toBe(tokenizerJson.length);
    expect(head.headers.get('accept-ranges')).toBe('bytes');
    expect(head.headers.get('content-encoding')).toBeNull();
    const whole = Buffer.from(await (await fetch(`${hf}/${MODEL}/resolve/${sha}/tokenizer.json`)).arrayBuffer());
    expect(whole.equals(tokenizerJson)).toBe(true);
    const part = await fetch(url, { headers: { range: 'bytes=10-19' } });
    expect(part.status).toBe(206);
    expect(part.headers.get('content-range')).toBe(`bytes 10-19/${tokenizerJson.length}`);
    expect(Buffer.from(await part.arrayBuffer()).equals(tokenizerJson.subarray(10, 20))).toBe(true);
    const resume = await fetch(url, { headers: { range: `bytes=${tokenizerJson.length - 5}-` } });
    expect(Buffer.from(await resume.arrayBuffer()).equals(tokenizerJson.subarray(-5))).toBe(true);
    const suffix = await fetch(url, { headers: { range: 'bytes=-3' } });
    expect(Buffer.from(await suffix.arrayBuffer()).equals(tokenizerJson.subarray(-3))).toBe(true);
    const beyond = await fetch(url, { headers: { range: `bytes=${tokenizerJson.length}-` } });
    expect(beyond.status).toBe(416);
    expect(beyond.headers.get('content-range')).toBe(`bytes */${tokenizerJson.length}`);
    expect(((await beyond.json()) as { error: { field: string } }).error.field).toBe('Range');
  });

  it('serves the weights as the Hub serves an LFS file: named by their SHA-256', async () => {
    const url = `${hf}/${MODEL}/resolve/main/model.safetensors`;
    const head = await fetch(url, { method: 'HEAD' });
    const body = Buffer.from(await (await fetch(url)).arrayBuffer());
    const sha256 = createHash('sha256').update(body).digest('hex');
    expect(head.headers.get('etag')).toBe(`"${sha256}"`);
    expect(head.headers.get('x-linked-etag')).toBe(`"${sha256}"`);
    expect(Number(head.headers.get('x-linked-size'))).toBe(body.length);
    const config = await (await fetch(`${hf}/${MODEL}/resolve/main/config.json`)).json() as Record<string, unknown>;
    expect(config).toMatchObject({ architectures: ['LlamaForCausalLM'], vocab_size: 151669, hidden_size: 64, tie_word_embeddings: false });
  });

  it('answers every miss with the Hub\'s X-Error-Code, our error shape, and for a missing file the commit it looked in', async () => {
    const cases: [string, string, number][] = [
      [`${hf}/${MODEL}/resolve/main/vocab.json`, 'EntryNotFound', 404],
      [`${hf}/nobody/no-such-model/resolve/main/config.json`, 'RepoNotFound', 404],
      [`${hf}/${MODEL}/resolve/v9.9/tokenizer.json`, 'RevisionNotFound', 404],
      [`${hf}/api/models/nobody/no-such-model`, 'RepoNotFound', 404],
      [`${hf}/api/models/${MODEL}/revision/nope`, 'RevisionNotFound', 404],
      [`${hf}/api/models/${MODEL}/tree/main/additional_chat_templates`, 'EntryNotFound', 404],
    ];
    for (const [url, code, status] of cases) {
      for (const method of ['GET', 'HEAD']) {
        const res = await fetch(url, { method });
        expect(res.status, `${method} ${url}`).toBe(status);
        expect(res.headers.get('x-error-code'), `${method} ${url}`).toBe(code);
        expect(res.headers.get('x-error-message'), url).toBeTruthy();
        if (method === 'GET') expect(((await res.json()) as { error: { type: string; hub_error: string } }).error).toMatchObject({ type: 'not_found', hub_error: code });
      }
    }
    const missing = await fetch(`${hf}/${MODEL}/resolve/main/vocab.json`, { method: 'HEAD' });
    expect(missing.headers.get('x-repo-commit')).toMatch(/^[0-9a-f]{40}$/);
  });

  it('serves a --tokenizer NAME=PATH file for NAME', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hub-tokenizer-'));
    const own = Buffer.concat([tokenizerJson, Buffer.from('\n')]);
    writeFileSync(join(dir, 'tokenizer.json'), own);
    const engines = new EnginePool(new Tokenizers(new Map([[MODEL, dir]])));
    const custom = await startTestServer({ engines });
    try {
      const res = await fetch(`${custom.env.HF_ENDPOINT}/${MODEL}/resolve/main/tokenizer.json`);
      expect(res.headers.get('etag')).toBe(`"${blobId(own)}"`);
      expect(Buffer.from(await res.arrayBuffer()).equals(own)).toBe(true);
      // A file of its own, without a tokenizer_config.json beside it: the repo lists just what there is.
      const info = await (await fetch(`${custom.env.HF_ENDPOINT}/api/models/${MODEL}`)).json() as { siblings: { rfilename: string }[] };
      expect(info.siblings.map((s) => s.rfilename)).toEqual(['tokenizer.json', 'config.json', 'generation_config.json', 'model.safetensors']);
    } finally {
      await custom.close();
      await engines.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('is journaled as the hub surface, never needing a Loops key', async () => {
    const entries = server.core.journal.query({ surface: 'hub' });
    expect(entries.length).toBeGreaterThan(5);
    expect(entries.every((e) => e.headers.auth === 'none' && e.path.startsWith('/hf/'))).toBe(true);
  });
});
