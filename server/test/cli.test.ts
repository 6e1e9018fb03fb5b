import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { baseWeightsFor, decodeSafetensors, DEFAULT_DIMS } from '../../models/index.js';
import { ConfigError, LOOPS_API_VERSION, parseOptions, VERSION } from '../index.js';
import { REPO_ROOT } from './helpers.js';

const CLI = join(REPO_ROOT, 'server', 'cli.ts');
const children: ChildProcess[] = [];
const dirs: string[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill('SIGKILL');
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

interface Started {
  child: ChildProcess;
  vars: Record<string, string>;
  /** Where the server really listens (the URL in its '# loops-mock ... listening on' line). */
  listening: () => string;
  /** Everything printed so far. */
  output: () => string;
  /** Everything logged so far (stderr). */
  logged: () => string;
  exit: Promise<{ code: number | null; stderr: string }>;
}

/** Runs the CLI the way `npm start` does (from source through tsx) and waits for its printed variables. */
function runCli(args: string[], env: Record<string, string> = {}): Started & { ready: Promise<void> } {
  const child = spawn(process.execPath, ['--import', 'tsx', CLI, ...args], {
    cwd: REPO_ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stdout = '';
  let stderr = '';
  const vars: Record<string, string> = {};
  child.stderr!.on('data', (d) => {
    stderr += d;
  });
  const exit = new Promise<{ code: number | null; stderr: string }>((resolve) => child.on('exit', (code) => resolve({ code, stderr })));
  const ready = new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (d) => {
      stdout += d;
      for (const line of stdout.split('\n')) {
        const m = /^([A-Z_]+)=(.*)$/.exec(line);
        if (m) vars[m[1]!] = m[2]!;
      }
      // The variables and the '# ... listening on' line come in one write.
      if (stdout.includes(' listening on ')) resolve();
    });
    void exit.then(({ code }) => reject(new Error(`exited ${code} before printing its variables: ${stderr}`)));
  });
  ready.catch(() => {}); // Awaited only by tests that expect the server to start.
  const listening = () => /listening on (\S+?),/.exec(stdout)?.[1] ?? '';
  return { child, vars, exit, ready, listening, output: () => stdout, logged: () => stderr };
}

async function call(url: string, key: string, method = 'GET', body?: unknown) {
  const res = await fetch(url, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: res.status, body: (await res.json()) as any };
}

describe('the loops-mock command', () => {
  it('prints the client variables, each on its own line, with a key that works; --write-env writes them too; /healthz needs no key', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cli-env-'));
    dirs.push(dir);
    const cli = runCli(['serve', '--port', '0', '--write-env', join(dir, 'loops.env')]);
    await cli.ready;
    expect(readFileSync(join(dir, 'loops.env'), 'utf8')).toBe(
      `${Object.entries(cli.vars)
        .map(([k, v]) => `${k}=${v}`)
        .join('\n')}\n`,
    );
    // It holds BASETEN_API_KEY: owner-only.
    expect(statSync(join(dir, 'loops.env')).mode & 0o777).toBe(0o600);
    const health = await fetch(`${cli.vars.LOOPS_BASE_URL}/healthz`);
    // 200 while the default --warm model builds in the background too; engine says which.
    const healthBody = (await health.json()) as { status: string; engine: string; version: string };
    expect([health.status, healthBody.status, healthBody.version]).toEqual([200, 'ok', VERSION]);
    expect(['warming', 'ready']).toContain(healthBody.engine);
    expect(Object.keys(cli.vars)).toEqual(['LOOPS_BASE_URL', 'BASETEN_API_KEY', 'BASETEN_MANAGEMENT_API_URL_OVERRIDE', 'HF_ENDPOINT']);
    expect(cli.vars.HF_ENDPOINT).toBe(`${cli.vars.LOOPS_BASE_URL}/hf`);
    expect(cli.vars.LOOPS_BASE_URL).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(cli.vars.LOOPS_BASE_URL).not.toMatch(/:0$/);
    expect(cli.vars.BASETEN_MANAGEMENT_API_URL_OVERRIDE).toBe(cli.vars.LOOPS_BASE_URL);
    const res = await call(`${cli.vars.LOOPS_BASE_URL}/v1/loops/capabilities`, cli.vars.BASETEN_API_KEY!);
    expect(res.status).toBe(200);
    // The dashboard's address, and that it is served there.
    expect(cli.output()).toContain(`\n# dashboard: ${cli.vars.LOOPS_BASE_URL}/_mock/ui (read-only: --admin adds controls)\n`);
    const page = await fetch(`${cli.vars.LOOPS_BASE_URL}/_mock/ui`);
    expect([page.status, page.headers.get('content-type')]).toEqual([200, 'text/html; charset=utf-8']);
    expect(await page.text()).toContain('<script type="module" src="/_mock/ui/app.js">');
    cli.child.kill('SIGTERM');
    expect((await cli.exit).code).toBe(0);
  });

  it('in proxy mode prints exactly what an unmodified client needs: the key, HTTPS_PROXY and the CA files, no LOOPS_BASE_URL', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cli-proxy-'));
    dirs.push(dir);
    const cli = runCli(['--port', '0', '--proxy', '--ca-dir', join(dir, 'ca')]);
    await cli.ready;
    expect(Object.keys(cli.vars)).toEqual(['BASETEN_API_KEY', 'HTTPS_PROXY', 'SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'NODE_EXTRA_CA_CERTS']);
    expect(cli.vars.HTTPS_PROXY).toBe(cli.listening());
    expect(cli.vars.SSL_CERT_FILE).toBe(join(dir, 'ca', 'ca-bundle.pem'));
    expect(cli.vars.REQUESTS_CA_BUNDLE).toBe(cli.vars.SSL_CERT_FILE);
    expect(cli.vars.NODE_EXTRA_CA_CERTS).toBe(join(dir, 'ca', 'ca.pem'));
    const curl = spawn('curl', [
      '-sS',
      '--proxy',
      cli.vars.HTTPS_PROXY!,
      '--cacert',
      cli.vars.NODE_EXTRA_CA_CERTS!,
      '-H',
      `Authorization: Bearer ${cli.vars.BASETEN_API_KEY}`,
      'https://api.baseten.co/v1/loops/capabilities',
    ]);
    let out = '';
    curl.stdout.on('data', (d) => {
      out += d;
    });
    expect(await new Promise((r) => curl.on('close', r))).toBe(0);
    expect(JSON.parse(out).supported_models.length).toBeGreaterThan(0);
    cli.child.kill('SIGTERM');
    expect((await cli.exit).code).toBe(0);
  });

  it('takes flags from LOOPS_MOCK_* variables, flags winning, and enforces --api-key', async () => {
    const cli = runCli(['--api-key', 'secret:acme:ml'], {
      LOOPS_MOCK_PORT: '0',
      LOOPS_MOCK_PUBLIC_URL: 'http://mock.example:9000/',
      LOOPS_MOCK_API_KEY: 'ignored',
    });
    await cli.ready;
    expect(cli.vars.BASETEN_API_KEY).toBe('secret');
    expect(cli.vars.LOOPS_BASE_URL).toBe('http://mock.example:9000');
    // The public URL goes into base_url fields; the server itself listens on loopback.
    const base = cli.listening();
    expect(base).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect((await call(`${base}/v1/loops/runs`, 'ignored')).status).toBe(401);
    const session = (await call(`${base}/v1/loops/sessions`, 'secret', 'POST')).body.session.id;
    const run = await call(`${base}/v1/loops/runs`, 'secret', 'POST', { session_id: session, base_model: 'Qwen/Qwen3-8B' });
    expect(run.body.run.base_url).toBe(`http://mock.example:9000/trainer/${run.body.run.id}`);
    cli.child.kill('SIGINT');
    expect((await cli.exit).code).toBe(0);
  });

  it('shuts down on SIGTERM with exit 0, state flushed to the data dir', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'loops-mock-cli-'));
    dirs.push(dataDir);
    const first = runCli(['--port', '0', '--data-dir', dataDir]);
    await first.ready;
    const base = first.vars.LOOPS_BASE_URL!;
    const session = (await call(`${base}/v1/loops/sessions`, 'k', 'POST')).body.session.id;
    const run = (await call(`${base}/v1/loops/runs`, 'k', 'POST', { session_id: session, base_model: 'Qwen/Qwen3-8B' })).body.run;
    first.child.kill('SIGTERM');
    expect((await first.exit).code).toBe(0);

    const second = runCli(['--port', '0', '--data-dir', dataDir]);
    await second.ready;
    const again = await call(`${second.vars.LOOPS_BASE_URL}/v1/loops/runs/${run.id}`, 'k');
    expect(again.body.run.status.name).toBe('INACTIVE');
    second.child.kill('SIGTERM');
    expect((await second.exit).code).toBe(0);
  });

  it('rejects an unknown flag or a bad value with one line and exit code 2', async () => {
    for (const [args, fragment] of [
      [['--prot', '8787'], 'unknown flag --prot'],
      [['--port', 'eighty'], '--port must be a whole number'],
      [['--log-level', 'loud'], '--log-level must be one of'],
      [['--api-key', 'k::team'], '--api-key must be KEY'],
      [['launch'], "unknown command 'launch'"],
      [['--device', 'tpu'], '--device must be cpu or cuda'],
      [['--unembedding-rank', '0'], '--unembedding-rank must be a whole number from 1 to 128'],
      [['--device', 'cuda'], 'CUDA execution provider is not available'],
      [['--tokenizer', 'Qwen/Qwen3-8B=/no/such/tokenizer.json'], 'no such file'],
      [['--tokenizer', 'acme/Model-1=./x.json'], "'acme/Model-1' is not a supported base model"],
      [['--tokenizer', 'just-a-path.json'], '--tokenizer must be NAME=PATH'],
      [['--clock', 'sundial'], '--clock must be real or virtual'],
      [['--clock', 'virtual'], '--clock virtual needs --admin'],
      [['--admin=maybe'], '--admin is a switch'],
      [['--admin', '--api-key', 'k1'], '--admin with --api-key needs --admin-token'],
      [['--admin', '--scenario', 'no-such-scenario'], 'no shipped scenario of that name'],
      [['--journal', '/no/such/dir/journal.ndjson'], 'cannot append'],
      [['--proxy', '--ca-dir', '/dev/null/ca'], 'cannot create the CA folder /dev/null/ca'],
      [['export-model', 'acme/Model-1', '/tmp/x'], "'acme/Model-1' is not a supported base model"],
      [['export-model', 'Qwen/Qwen3.5-2B'], 'export-model needs BASE_MODEL and DIR'],
      [['ca', '--ca-dir'], '--ca-dir needs a value'],
      [['--port', '0', '--write-env', '/dev/null/loops.env'], '--write-env /dev/null/loops.env: cannot write it'],
    ] as [string[], string][]) {
      const cli = runCli(args);
      const { code, stderr } = await cli.exit;
      expect(code, args.join(' ')).toBe(2);
      expect(stderr.trim().split('\n'), args.join(' ')).toHaveLength(1);
      expect(stderr).toContain(fragment);
    }
  }, 90_000);

  it('logs one line per request (with the reason of a 4xx) and each lifecycle event, pretty or as JSON', async () => {
    for (const format of ['pretty', 'json'] as const) {
      const cli = runCli(['--port', '0', '--log-format', format]);
      await cli.ready;
      const base = cli.vars.LOOPS_BASE_URL!;
      const session = (await call(`${base}/v1/loops/sessions`, 'k', 'POST')).body.session.id;
      expect((await call(`${base}/v1/loops/runs`, 'k', 'POST', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 500 })).status).toBe(400);
      const run = (await call(`${base}/v1/loops/runs`, 'k', 'POST', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4 })).body.run;
      const forward = (
        await call(`${run.base_url}/forward`, 'k', 'POST', {
          data: [{ model_input: { chunks: [{ type: 'encoded_text', tokens: [1, 2, 3] }] } }],
          loss_fn: 'cross_entropy',
        })
      ).body.operation_id;
      expect((await call(`${run.base_url}/operations/${forward}`, 'k')).body.status).toBe('done');
      const op = (await call(`${run.base_url}/save_weights_for_sampler`, 'k', 'POST', { name: 'logged' })).body.operation_id;
      expect((await call(`${run.base_url}/operations/${op}`, 'k')).body.status).toBe('done');
      await call(`${base}/v1/loops/runs/${run.id}/deactivate`, 'k', 'POST');
      cli.child.kill('SIGTERM');
      const { code, stderr } = await cli.exit;
      expect(code).toBe(0);
      const lines = stderr
        .trim()
        .split('\n')
        .filter((l) => !/ExperimentalWarning|--trace-warnings/.test(l));
      const messages = format === 'json' ? lines.map((l) => (JSON.parse(l) as { msg: string }).msg) : lines;
      const has = (pattern: RegExp) =>
        expect(
          messages.some((m) => pattern.test(m)),
          `${format}: ${pattern}\n${messages.join('\n')}`,
        ).toBe(true);
      has(/POST \/v1\/loops\/sessions 200 [\d.]+ ms/);
      has(/POST \/v1\/loops\/runs 400 [\d.]+ ms invalid_request: lora_rank 500 is too large/);
      has(new RegExp(`Run ${run.id} .* started in session ${session}`));
      has(new RegExp(`Sampler ${run.sampler.id} is ACTIVE`));
      has(new RegExp(`Sampler ${run.sampler.id} replica 0: policy version 0 live`));
      has(new RegExp(`Run ${run.id} INACTIVE: deactivated`));
      // The warm-up builds the forward graph before the first forward: a person waiting on a start is told, and told when it is done.
      has(/Qwen\/Qwen3\.5-2B: building the 'forward' graph \(warm-up\)/);
      has(/Qwen\/Qwen3\.5-2B: 'forward' graph ready \([\d.]+ s to build, ahead of its first use\)/);
      if (format === 'pretty') expect(lines.find((l) => l.includes('/v1/loops/sessions 200'))).toMatch(/^\d\d:\d\d:\d\d\.\d{3} INFO {2}POST/);
    }
  }, 60_000);

  it("--warm builds in the background every graph a train-and-sample loop uses: none is built at a client's first steps", async () => {
    const cli = runCli(['--port', '0', '--log-format', 'pretty']);
    await cli.ready;
    const warmed = /Qwen\/Qwen3\.5-2B: engine warm \(--warm\)/;
    for (let waited = 0; !warmed.test(cli.logged()); waited += 50) {
      if (waited > 30_000) throw new Error(`no warm-up line:\n${cli.logged()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    const base = cli.vars.LOOPS_BASE_URL!;
    const session = (await call(`${base}/v1/loops/sessions`, 'k', 'POST')).body.session.id;
    const run = (await call(`${base}/v1/loops/runs`, 'k', 'POST', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 16 })).body.run;
    const tokens = Array.from({ length: 24 }, (_, i) => 100 + i);
    const datum = {
      model_input: { chunks: [{ type: 'encoded_text', tokens }] },
      loss_fn_inputs: { target_tokens: { data: tokens.map((t, i) => (i < 20 ? -100 : t + 1)), dtype: 'int64' } },
    };
    const op = async (name: string, body: unknown) => {
      const id = (await call(`${run.base_url}/${name}`, 'k', 'POST', body)).body.operation_id;
      expect((await call(`${run.base_url}/operations/${id}`, 'k')).body.status).toBe('done');
    };
    await op('forward', { data: [datum], loss_fn: 'cross_entropy' });
    await op('forward_backward', { data: [datum], loss_fn: 'cross_entropy' });
    await op('optim_step', { adam_params: { learning_rate: 1e-3 } });
    await op('save_weights_for_sampler', { name: 'warm' });
    for (const temperature of [0, 1]) {
      const res = await call(`${run.sampler.base_url}/sample`, 'k', 'POST', {
        prompt: { chunks: [{ type: 'encoded_text', tokens }] },
        num_samples: 2,
        sampling_params: { max_tokens: 4, temperature },
      });
      expect(res.status).toBe(200);
    }
    cli.child.kill('SIGTERM');
    const { stderr } = await cli.exit;
    const after = stderr.slice(stderr.search(warmed));
    expect(after.match(/building the '[a-z_]+' graph/g) ?? []).toEqual([]);
    expect(stderr).not.toMatch(/warming the engine failed/);
  }, 60_000);

  it('npm start builds only when a source is newer than the last build', () => {
    // In a copy of the checkout: rebuilding this one's dist/ would pull files from under the tests that run at the same time.
    const copy = mkdtempSync(join(tmpdir(), 'build-if-stale-'));
    dirs.push(copy);
    for (const entry of ['bin', 'scripts', 'server', 'models', 'conformance', 'tsconfig.json', 'tsconfig.build.json', 'package.json'])
      cpSync(join(REPO_ROOT, entry), join(copy, entry), { recursive: true });
    symlinkSync(join(REPO_ROOT, 'node_modules'), join(copy, 'node_modules'));
    const check = () => spawnSync(process.execPath, [join(copy, 'scripts', 'build-if-stale.mjs')], { cwd: copy, encoding: 'utf8' });
    expect(check().stderr).toMatch(/building/); // no dist/ yet
    const fresh = check();
    expect([fresh.status, fresh.stderr]).toEqual([0, '']);
    const source = join(copy, 'server', 'version.ts');
    const now = new Date();
    utimesSync(source, now, new Date(now.getTime() + 2000));
    const stale = check();
    expect(stale.status).toBe(0);
    expect(stale.stderr).toMatch(/building \(sources changed since the last build\)/);
    expect(check().stderr).toBe('');
  }, 120_000);

  it('export-model writes the Hugging Face folder the Hub mirror serves', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cli-export-'));
    dirs.push(dir);
    const cli = runCli(['export-model', 'Qwen/Qwen3.5-2B', join(dir, 'tiny')]);
    expect((await cli.exit).code).toBe(0);
    expect(readdirSync(join(dir, 'tiny')).sort()).toEqual([
      'config.json',
      'generation_config.json',
      'model.safetensors',
      'tokenizer.json',
      'tokenizer_config.json',
    ]);
    const config = JSON.parse(readFileSync(join(dir, 'tiny', 'config.json'), 'utf8'));
    expect(config).toMatchObject({
      architectures: ['LlamaForCausalLM'],
      num_hidden_layers: 2,
      hidden_size: 64,
      vocab_size: 151669,
      eos_token_id: [151643, 151645],
    });
    const { tensors } = decodeSafetensors(readFileSync(join(dir, 'tiny', 'model.safetensors')));
    expect(tensors.get('model.embed_tokens.weight')!.shape).toEqual([151669, 64]);
    expect(tensors.get('model.layers.1.mlp.down_proj.weight')!.shape).toEqual([64, 128]);
    // The export is the engine's own weights: the first embedding row is embed_t's first column.
    const embedT = baseWeightsFor('Qwen/Qwen3.5-2B', { vocab: 151669, ...DEFAULT_DIMS }).find((w) => w.name === 'embed_t')!;
    expect(tensors.get('model.embed_tokens.weight')!.data.subarray(0, 64)).toEqual(Float32Array.from({ length: 64 }, (_, i) => embedT.data[i * 151669]!));
  }, 60_000);

  it('serves the admin API with --admin, applying a shipped --scenario at start', async () => {
    const cli = runCli(['--port', '0', '--admin', '--admin-token', 'sesame', '--scenario', 'lagging-replica']);
    await cli.ready;
    const base = cli.listening();
    const settings = await fetch(`${base}/_mock/settings`, { headers: { authorization: 'Bearer sesame' } });
    expect(await settings.json()).toMatchObject({ sampler_replicas: 2, weight_sync_delay_ms: [1500, 6000] });
    expect((await fetch(`${base}/_mock/settings`)).status).toBe(401);
    cli.child.kill('SIGTERM');
    expect((await cli.exit).code).toBe(0);
  });

  it('refuses a port that is taken with exit code 2', async () => {
    const first = runCli(['--port', '0']);
    await first.ready;
    const port = new URL(first.vars.LOOPS_BASE_URL!).port;
    const second = runCli(['--port', port]);
    const { code, stderr } = await second.exit;
    expect(code).toBe(2);
    expect(stderr).toContain('cannot listen');
    first.child.kill('SIGTERM');
    await first.exit;
  });
});

describe('option parsing', () => {
  it('reads --flag value and --flag=value, repeatable keys, env fallbacks', () => {
    const o = parseOptions(['--port=9000', '--api-key', 'a:org1', '--api-key=b:org1:team'], { LOOPS_MOCK_HOST: '0.0.0.0', LOOPS_MOCK_COLD_START_MS: '250' });
    expect(o).toMatchObject({
      port: 9000,
      host: '0.0.0.0',
      coldStartMs: 250,
      apiKeys: [
        { key: 'a', org: 'org1' },
        { key: 'b', org: 'org1', team: 'team' },
      ],
    });
    expect(parseOptions([], { LOOPS_MOCK_API_KEY: 'x,y' }).apiKeys.map((k) => k.key)).toEqual(['x', 'y']);
    expect(() => parseOptions(['--port', '70000'])).toThrow(ConfigError);
    // --warm takes supported base models, or none; anything else names the flag and the models it takes.
    expect(parseOptions([]).warmModels).toEqual(['Qwen/Qwen3.5-2B']);
    expect(parseOptions(['--warm', 'none']).warmModels).toEqual([]);
    expect(parseOptions(['--warm', 'Qwen/Qwen3-8B,Qwen/Qwen3.5-2B']).warmModels).toEqual(['Qwen/Qwen3-8B', 'Qwen/Qwen3.5-2B']);
    expect(() => parseOptions(['--warm', 'Nope/Model'])).toThrow(/--warm: 'Nope\/Model' is not a supported base model \(Qwen\/Qwen3-0.6B, .*\), or 'none'/);
    // --batch-runs takes on or off (default on), from the flag or LOOPS_MOCK_BATCH_RUNS; anything else names the flag.
    expect(parseOptions([]).batchRuns).toBe(true);
    expect(parseOptions(['--batch-runs', 'off']).batchRuns).toBe(false);
    expect(parseOptions([], { LOOPS_MOCK_BATCH_RUNS: 'off' }).batchRuns).toBe(false);
    expect(() => parseOptions(['--batch-runs', 'maybe'])).toThrow(/--batch-runs must be on or off, got 'maybe'/);
    expect(() => parseOptions(['--public-url', 'ftp://x'])).toThrow(/http or https/);
    expect(() => parseOptions(['--data-dir'])).toThrow(/needs a value/);
  });

  it('reads switches alone, as --flag=false, and from the environment', () => {
    expect(parseOptions(['--admin', '--port', '1']).admin).toBe(true);
    expect(parseOptions(['--admin=false']).admin).toBe(false);
    expect(parseOptions(['--admin=true']).admin).toBe(true);
    expect(parseOptions(['--admin=false'], { LOOPS_MOCK_ADMIN: '1' }).admin).toBe(false);
    expect(parseOptions([], { LOOPS_MOCK_ADMIN: '1' }).admin).toBe(true);
    expect(parseOptions(['--clock', 'virtual', '--admin-token', 't', '--fault-seed', '9'])).toMatchObject({
      clockMode: 'virtual',
      adminToken: 't',
      faultSeed: 9,
    });
  });

  it('reads no variable whose flag is given: a bad LOOPS_MOCK_PORT does not block --port (issue 28)', () => {
    expect(parseOptions(['--port', '0'], { LOOPS_MOCK_PORT: 'not-a-port' }).port).toBe(0);
    expect(parseOptions(['--warm', 'none'], { LOOPS_MOCK_WARM: 'Nope/Model' }).warmModels).toEqual([]);
    // Without the flag the variable counts, and a bad one is still refused naming the flag.
    expect(() => parseOptions([], { LOOPS_MOCK_PORT: 'not-a-port' })).toThrow(/--port must be a whole number/);
    // A list that adds to its variable (--tokenizer) still reads both; one that replaces it (--api-key) reads the flags alone.
    expect(parseOptions(['--api-key', 'flag-key'], { LOOPS_MOCK_API_KEY: 'env-key' }).apiKeys.map((k) => k.key)).toEqual(['flag-key']);
  });

  it('--exit-with-parent is a switch, off by default, from the flag or LOOPS_MOCK_EXIT_WITH_PARENT', () => {
    expect(parseOptions([]).exitWithParent).toBe(false);
    expect(parseOptions(['--exit-with-parent']).exitWithParent).toBe(true);
    expect(parseOptions([], { LOOPS_MOCK_EXIT_WITH_PARENT: '1' }).exitWithParent).toBe(true);
  });

  it("--version names the mock's version and the Loops API version it tracks", () => {
    const run = spawnSync(process.execPath, ['--import', 'tsx', CLI, '--version'], { cwd: REPO_ROOT, encoding: 'utf8' });
    expect([run.status, run.stdout]).toEqual([0, `loops-mock ${VERSION} (tracks the Baseten Loops API ${LOOPS_API_VERSION})\n`]);
  });
});
