import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { taskInputs, MODEL } from '../../conformance/tasks.js';
import { EVAL_TICKETS, prompt, TICKETS } from '../../models/data/support-tickets.js';
import { EnginePool, Tokenizers } from '../../models/index.js';
import type { RunningServer } from '../index.js';
import { chatTemplateCases, deployTrainedCheckpoint } from './deployed-checkpoint.js';
import { REPO_ROOT, startTestServer } from './helpers.js';

/**
 * Runs client-tests/ (pytest) with the real Python client libraries
 * (requests, httpx, huggingface_hub, transformers, torch, peft) from the venv that
 * scripts/python-venv.sh makes (npm test makes it first), against two
 * servers: one direct (HF_ENDPOINT), one in proxy mode (HTTPS_PROXY and the
 * CA variables only). Then reads the servers' journals for what the clients did.
 */
const PYTHON = join(REPO_ROOT, '.venv', 'bin', 'python');

let dir: string;
let engines: EnginePool;
let direct: RunningServer;
let proxy: RunningServer;
/** A server whose unembedding LoRA takes a run's whole rank (--unembedding-rank 16), and its engines. */
let uncapped: RunningServer;
let uncappedEngines: EnginePool;
let pytest: { code: number | null; output: string };
/** The proxy server's last journal entry before the clients ran: the deployed checkpoint's set-up (app.inject, no host) comes before it. */
let setupSeq = 0;

beforeAll(async () => {
  if (!existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run 'bash scripts/python-venv.sh' (npm test runs it before the tests)`);
  dir = mkdtempSync(join(tmpdir(), 'client-tests-'));
  engines = new EnginePool();
  direct = await startTestServer({ engines });
  proxy = await startTestServer({ engines, proxy: true, caDir: join(dir, 'ca') });
  uncappedEngines = new EnginePool(undefined, { unembeddingRank: 16 });
  uncapped = await startTestServer({ engines: uncappedEngines });
  const tokenizers = new Tokenizers();
  const tok = tokenizers.get(MODEL);
  const prompts = [...TICKETS, ...EVAL_TICKETS].map(([t]) => prompt(t));
  const expectedFile = join(dir, 'expected.json');
  writeFileSync(expectedFile, JSON.stringify({ prompts }));
  const sftInput = join(dir, 'sft-input.json');
  writeFileSync(sftInput, JSON.stringify(taskInputs()['sft-round']));
  const description = join(dir, 'servers.json');
  writeFileSync(
    description,
    JSON.stringify({
      direct_env: direct.env,
      proxy_env: proxy.env,
      expected_file: expectedFile,
      ids: prompts.map((p) => tok.encode(p)),
      ds_ids: prompts.map((p) => tokenizers.get('deepseek-ai/DeepSeek-V4-Pro').encode(p)),
      tokenizer_json_sha256: createHash('sha256')
        .update(readFileSync(tokenizers.files(MODEL).tokenizerJson))
        .digest('hex'),
      sft_input: sftInput,
      driver: join(REPO_ROOT, 'conformance', 'drivers', 'python', 'driver.py'),
      uncapped_url: uncapped.url,
      // A trained checkpoint deployed to inference on each server (test_deployed_checkpoint.py), and the chat-template cases.
      deployed_direct: await deployTrainedCheckpoint(direct, MODEL),
      deployed_proxy: await deployTrainedCheckpoint(proxy, MODEL),
      chat_template_cases: chatTemplateCases(direct, [MODEL, 'deepseek-ai/DeepSeek-V4-Flash']),
    }),
  );
  setupSeq = proxy.core.journal.query({}).at(-1)?.seq ?? 0;
  pytest = await new Promise((resolve) => {
    const child = spawn(PYTHON, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', join(REPO_ROOT, 'client-tests')], {
      cwd: dir,
      env: { PATH: process.env.PATH ?? '', HOME: dir, LOOPS_MOCK_CLIENT_TESTS: description },
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => {
      output += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      output += d.toString();
    });
    child.on('close', (code) => resolve({ code, output }));
  });
}, 600_000);

afterAll(async () => {
  await uncapped?.close();
  await uncappedEngines?.close();
  await proxy?.close();
  await direct?.close();
  await engines?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('unmodified clients', () => {
  it('pass every client test in client-tests/ (pytest, real client libraries)', () => {
    expect(pytest.code, pytest.output).toBe(0);
    expect(pytest.output).toMatch(/\d+ passed/);
    expect(pytest.output).not.toMatch(/skipped|xfail|error/i);
  });

  it("reach the proxy-mode server on Baseten's and the Hub's own hosts, and the journal says so", () => {
    const journal = proxy.core.journal.query({}).filter((e) => e.seq > setupSeq);
    const hostsOf = (surface: string) => new Set(journal.filter((e) => e.surface === surface).map((e) => e.host?.replace(/^model-[a-z0-9]+\./, 'model-*.')));
    expect(hostsOf('control')).toEqual(new Set(['api.baseten.co']));
    expect(hostsOf('trainer')).toEqual(new Set(['model-*.api.baseten.co']));
    expect(hostsOf('sampler')).toEqual(new Set(['model-*.api.baseten.co']));
    expect(hostsOf('hub')).toEqual(new Set(['huggingface.co']));
    const connects = journal.filter((e) => e.surface === 'proxy');
    expect(connects.some((e) => e.proxy?.action === 'intercept' && e.host === 'huggingface.co' && !e.proxy.error)).toBe(true);
    // The clients that do not trust the CA: their handshake failed, and the entry says how to mend it.
    expect(connects.filter((e) => e.proxy?.error).some((e) => /does not trust the loops-mock CA/.test(e.proxy!.error!))).toBe(true);
    expect(connects.some((e) => e.proxy?.action === 'refuse' && e.host === 'example.com' && e.status === 403)).toBe(true);
  });

  it('through HF_ENDPOINT, hit only the mirror on the direct server', () => {
    const hub = direct.core.journal.query({ surface: 'hub' });
    expect(hub.length).toBeGreaterThan(0);
    expect(hub.every((e) => e.path.startsWith('/hf/'))).toBe(true);
    expect(hub.some((e) => e.method === 'HEAD' && e.path === `/hf/${MODEL}/resolve/main/tokenizer.json` && e.status === 200)).toBe(true);
  });
});
