import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { EnginePool, Tokenizers } from '../../models/index.js';
import { HubRepos } from '../core/hub-repos.js';
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
    const info = (await (await fetch(`${hf}/api/models/${MODEL}`)).json()) as { id: string; sha: string; siblings: { rfilename: string }[]; private: boolean };
    expect(info.id).toBe(MODEL);
    expect(info.sha).toMatch(/^[0-9a-f]{40}$/);
    expect(info.private).toBe(false);
    expect(info.siblings.map((s) => s.rfilename).sort()).toEqual([
      'config.json',
      'generation_config.json',
      'model.safetensors',
      'tokenizer.json',
      'tokenizer_config.json',
    ]);
    const pinned = await fetch(`${hf}/api/models/${MODEL}/revision/${info.sha}`);
    expect(((await pinned.json()) as { sha: string }).sha).toBe(info.sha);
    const tree = (await (await fetch(`${hf}/api/models/${MODEL}/tree/main?recursive=true&expand=false`)).json()) as {
      type: string;
      path: string;
      size: number;
      oid: string;
    }[];
    expect(tree.find((f) => f.path === 'tokenizer.json')).toEqual({
      type: 'file',
      path: 'tokenizer.json',
      size: tokenizerJson.length,
      oid: blobId(tokenizerJson),
    });
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
    const config = (await (await fetch(`${hf}/${MODEL}/resolve/main/config.json`)).json()) as Record<string, unknown>;
    expect(config).toMatchObject({ architectures: ['LlamaForCausalLM'], vocab_size: 151669, hidden_size: 64, tie_word_embeddings: false });
  });

  it("answers every miss with the Hub's X-Error-Code, our error shape, and for a missing file the commit it looked in", async () => {
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
        if (method === 'GET')
          expect(((await res.json()) as { error: { type: string; hub_error: string } }).error).toMatchObject({ type: 'not_found', hub_error: code });
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
      const info = (await (await fetch(`${custom.env.HF_ENDPOINT}/api/models/${MODEL}`)).json()) as { siblings: { rfilename: string }[] };
      expect(info.siblings.map((s) => s.rfilename)).toEqual(['tokenizer.json', 'config.json', 'generation_config.json', 'model.safetensors']);
    } finally {
      await custom.close();
      await engines.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('answers HEAD for the weights from the listing, without making evicted weights again; GET makes the same bytes', async () => {
    const hub = server.core.hub;
    const url = `${hf}/${MODEL}/resolve/main/model.safetensors`;
    const before = await fetch(url, { method: 'HEAD' });
    // Listing more repos than the mirror holds weights for evicts MODEL's.
    for (const other of hub
      .ids()
      .filter((id) => id !== MODEL)
      .slice(0, 3))
      expect((await fetch(`${hf}/api/models/${other}`)).status).toBe(200);
    expect(hub.holdsWeights(MODEL)).toBe(false);
    const head = await fetch(url, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(hub.holdsWeights(MODEL)).toBe(false);
    for (const h of ['etag', 'x-linked-etag', 'x-linked-size', 'content-length', 'x-repo-commit']) expect(head.headers.get(h), h).toBe(before.headers.get(h));
    const part = await fetch(url, { method: 'HEAD', headers: { range: 'bytes=8-' } });
    expect(part.status).toBe(206);
    expect(Number(part.headers.get('content-length'))).toBe(Number(before.headers.get('content-length')) - 8);
    const body = Buffer.from(await (await fetch(url)).arrayBuffer());
    expect(`"${createHash('sha256').update(body).digest('hex')}"`).toBe(before.headers.get('etag'));
    expect(hub.holdsWeights(MODEL)).toBe(true);
  });

  it("holds the weights of a bounded number of repos and makes an evicted repo's again byte for byte", async () => {
    const engines = new EnginePool();
    const hub = new HubRepos(engines, { weightsHeld: 1 });
    try {
      const [first, second, third] = hub.ids();
      const repo = hub.repo(first!);
      const weights = repo.files.find((f) => f.name === 'model.safetensors')!;
      const made = hub.content(repo, weights);
      hub.repo(second!);
      hub.repo(third!);
      expect(hub.weightsHeld()).toBe(1);
      expect(hub.holdsWeights(first!)).toBe(false);
      expect(hub.holdsWeights(third!)).toBe(true);
      const again = hub.content(hub.repo(first!), weights);
      // Made again, not kept: compared as booleans (expect's diff of two 78 MB buffers would take minutes).
      expect(again === made).toBe(false);
      expect(again.equals(made)).toBe(true);
      expect(createHash('sha256').update(again).digest('hex')).toBe(weights.lfsSha256);
      expect(blobId(again)).toBe(weights.blobId);
      expect(hub.repo(first!).sha).toBe(repo.sha);
      expect(hub.weightsHeld()).toBe(1);
      expect(hub.holdsWeights(third!)).toBe(false);
    } finally {
      await engines.close();
    }
  });

  it("shares a tokenizer family's files among its repos and names its special ids without loading the tokenizer", async () => {
    const engines = new EnginePool();
    const hub = new HubRepos(engines);
    const loads = vi.spyOn(engines.tokenizers, 'get');
    try {
      const fileOf = (id: string, name: string) => {
        const repo = hub.repo(id);
        return hub.content(repo, repo.files.find((f) => f.name === name)!);
      };
      expect(fileOf('Qwen/Qwen3-8B', 'tokenizer.json') === fileOf('Qwen/Qwen3.5-2B', 'tokenizer.json')).toBe(true);
      // What the tokenizer library reads from the families' files (models/test/tokenizers.test.ts holds the eos ids to it):
      // Qwen3 pads with <|endoftext|>, DeepSeek V3 with its end of sentence.
      const expected: [string, number[], number][] = [
        ['Qwen/Qwen3-8B', [151643, 151645], 151643],
        ['deepseek-ai/DeepSeek-V4-Flash', [1], 1],
      ];
      for (const [id, eos, pad] of expected) {
        const generation = JSON.parse(fileOf(id, 'generation_config.json').toString('utf8')) as { eos_token_id: number[]; pad_token_id?: number };
        expect(generation, id).toMatchObject({ eos_token_id: eos, pad_token_id: pad });
      }
      // The built-in families' whole tokenizers (~85 MB resident each) are not loaded for the mirror.
      expect(loads).not.toHaveBeenCalled();
    } finally {
      await engines.close();
    }
  });

  it('is journaled as the hub surface, never needing a Loops key', async () => {
    const entries = server.core.journal.query({ surface: 'hub' });
    expect(entries.length).toBeGreaterThan(5);
    expect(entries.every((e) => e.headers.auth === 'none' && e.path.startsWith('/hf/'))).toBe(true);
  });
});
