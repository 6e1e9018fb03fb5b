import { afterEach, describe, expect, it } from 'vitest';
import { decodeSafetensors, EnginePool } from '../../models/index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../../models/data/support-tickets.js';
import { ManualClock, type RunningServer } from '../index.js';
import { http, startTestServer, wireDatum } from './helpers.js';

const MODEL = 'Qwen/Qwen3.5-2B';
const tok = new EnginePool().tokenizers.get(MODEL);
let server: RunningServer;
afterEach(() => server?.close());

const ticketData = (list: [string, string][]) =>
  list.map(([t, l]) => {
    const d = datum(tok, t, l);
    return wireDatum(d.tokens, d.targetTokens!);
  });
const trainSet = ticketData(TICKETS);
const evalSet = ticketData(EVAL_TICKETS);
const ce = (data: unknown[]) => ({ data, loss_fn: 'cross_entropy' });

async function newRun(api: ReturnType<typeof http>, extra: Record<string, unknown> = {}) {
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 16, seed: 42, max_seq_len: 1024, ...extra });
  if (res.status !== 200) throw new Error(JSON.stringify(res.body));
  return { session, run: res.body.run, trainer: new URL(res.body.run.base_url).pathname };
}

describe('--unembedding-rank', () => {
  it("lifts the cap on the unembedding's rank: a run's lora_rank reaches lm_head too", async () => {
    server = await startTestServer({ unembeddingRank: 32 });
    const api = http(server.url);
    const { run, trainer } = await newRun(api);
    await api.op(trainer, 'save_weights_for_sampler', { name: 'wide' });
    const [checkpoint] = (await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
    expect(checkpoint.lora_adapter_config).toEqual({ r: 16 });
    const files = (await api.call('GET', `/v1/loops/checkpoints/${checkpoint.id}/files`)).body.presigned_urls;
    const config = await (await fetch(files.find((f: any) => f.relative_file_name === 'adapter_config.json').url)).json();
    expect(config).toMatchObject({ r: 16, rank_pattern: {}, alpha_pattern: {} });
    const bytes = new Uint8Array(await (await fetch(files.find((f: any) => f.relative_file_name === 'adapter_model.safetensors').url)).arrayBuffer());
    expect(decodeSafetensors(bytes).tensors.get('base_model.model.lm_head.lora_B.weight')!.shape).toEqual([151669, 16]);
  });
});

describe('the campaign round of the programmatic-training guide, over HTTP', () => {
  it('runs end to end: baseline, 2 epochs at 4e-5, lower trained loss, saves, checkpoints listed and downloaded, cleanup', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const caps = (await api.call('GET', '/v1/loops/capabilities')).body.supported_models.map((m: any) => m.model_name);
    expect(caps).toContain(MODEL);
    const { session, run, trainer } = await newRun(api, { name: 'campaign' });
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(200);

    const baseline = await api.op(trainer, 'forward', ce(evalSet));
    expect(baseline.loss_fn_outputs).toHaveLength(evalSet.length);
    expect(baseline.loss_fn_outputs[0].logprobs.data).toHaveLength(evalSet[0]!.model_input.chunks[0]!.tokens.length);
    for (let epoch = 0; epoch < 2; epoch++) {
      const fb = await api.op(trainer, 'forward_backward', ce(trainSet));
      expect(fb.metrics.active_tokens).toBeGreaterThan(0);
      const step = await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 4e-5 } });
      expect(step.metrics.step).toBe(epoch + 1);
      expect(step.policy_version).toBe(epoch + 1);
    }
    expect((await api.call('GET', `${trainer}/policy_version`)).body).toEqual({ policy_version: 2 });
    const trained = await api.op(trainer, 'forward', ce(evalSet));
    expect(trained.loss).toBeLessThan(baseline.loss);

    expect(await api.op(trainer, 'save_state', { name: 'final' })).toEqual({ path: `bt://loops:${run.id}/weights/final` });
    const published = await api.op(trainer, 'save_weights_for_sampler', { name: 'final' });
    expect(published).toEqual({ path: `bt://loops:${run.id}/sampler_weights/final`, policy_version: 2 });
    expect(server.core.samplerWeights.version(run.sampler.id)).toBe(2);

    const listed = (await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
    // As the quickstart lists them: the bare name for both, told apart by target.
    expect(listed.map((c: any) => [c.checkpoint_id, c.target]).sort()).toEqual([
      ['final', 'sampler'],
      ['final', 'trainer'],
    ]);
    const sampler = listed.find((c: any) => c.target === 'sampler');
    expect(sampler.lora_adapter_config).toEqual({ r: 16 });
    const files = (await api.call('GET', `/v1/loops/checkpoints/${sampler.id}/files`)).body.presigned_urls;
    expect(files.map((f: any) => f.relative_file_name).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    // The unembedding's rank is capped (4 by default), as the adapter's own config says.
    const config = await (await fetch(files.find((f: any) => f.relative_file_name === 'adapter_config.json').url)).json();
    expect(config).toMatchObject({ r: 16, lora_alpha: 32, rank_pattern: { lm_head: 4 }, alpha_pattern: { lm_head: 8 }, base_model_name_or_path: MODEL });
    const weights = files.find((f: any) => f.relative_file_name === 'adapter_model.safetensors');
    const bytes = new Uint8Array(await (await fetch(weights.url)).arrayBuffer());
    expect(bytes.length).toBe(weights.size_bytes);
    const { tensors } = decodeSafetensors(bytes);
    expect(tensors.get('base_model.model.lm_head.lora_B.weight')!.shape).toEqual([151669, 4]);
    expect(tensors.get('base_model.model.model.layers.0.mlp.down_proj.lora_B.weight')!.shape).toEqual([64, 16]);

    const mine = (await api.call('GET', '/v1/loops/runs')).body.runs.filter((r: any) => r.session_id === session);
    for (const r of mine) expect((await api.call('POST', `/v1/loops/runs/${r.id}/deactivate`)).status).toBe(200);
    expect((await api.call('GET', `/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
    expect((await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints).toHaveLength(2);
  });
});

describe('the operation protocol', () => {
  it('runs operations submitted before any is awaited in submission order', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const { trainer } = await newRun(api);
    const ids: string[] = [];
    for (const [op, body] of [
      ['forward_backward', ce(trainSet)],
      ['optim_step', {}],
      ['forward_backward', ce(trainSet)],
      ['optim_step', {}],
    ] as const) {
      ids.push((await api.call('POST', `${trainer}/${op}`, body)).body.operation_id);
    }
    expect(new Set(ids).size).toBe(4);
    const results = [];
    for (const id of ids) {
      let polled: Awaited<ReturnType<typeof api.call>>;
      do polled = await api.call('GET', `${trainer}/operations/${id}`);
      while (polled.status === 408);
      results.push(polled.body.result);
    }
    expect(results[1].policy_version).toBe(1);
    expect(results[3].policy_version).toBe(2);
    expect(results[2].loss).toBeLessThan(results[0].loss);
  });

  it('returns the same operation for a repeated Idempotency-Key, 409 for another body, and never steps twice', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const { trainer } = await newRun(api);
    await api.op(trainer, 'forward_backward', ce(trainSet));
    const key = 'a'.repeat(32);
    const first = await api.call('POST', `${trainer}/optim_step`, { adam_params: { learning_rate: 1e-3 } }, { 'idempotency-key': key });
    const again = await api.call('POST', `${trainer}/optim_step`, { adam_params: { learning_rate: 1e-3 } }, { 'idempotency-key': key });
    expect(again.body.operation_id).toBe(first.body.operation_id);
    const other = await api.call('POST', `${trainer}/optim_step`, { adam_params: { learning_rate: 2e-3 } }, { 'idempotency-key': key });
    expect(other.status).toBe(409);
    expect(other.body.error.operation_id).toBe(first.body.operation_id);
    await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } }, key);
    expect((await api.call('GET', `${trainer}/policy_version`)).body.policy_version).toBe(1);
    // Without a key each submit is new.
    await api.op(trainer, 'optim_step', {});
    expect((await api.call('GET', `${trainer}/policy_version`)).body.policy_version).toBe(2);
  });

  it('answers 408 when a long poll outlasts its window, 404 for unknown and expired operations', async () => {
    server = await startTestServer({ longPollMs: 50, operationTtlMs: 400 });
    const api = http(server.url);
    const { trainer } = await newRun(api, { max_seq_len: 4096 });
    const long = Array.from({ length: 4 }, (_, i) =>
      wireDatum(
        Array.from({ length: 512 }, (_, t) => (t * 31 + i) % 1000),
        Array.from({ length: 512 }, (_, t) => (t * 17 + i) % 1000),
      ),
    );
    const slow = (await api.call('POST', `${trainer}/forward_backward`, ce(long))).body.operation_id;
    const behind = (await api.call('POST', `${trainer}/optim_step`, {})).body.operation_id;
    const pending = await api.call('GET', `${trainer}/operations/${behind}`);
    expect(pending.status).toBe(408);
    expect(pending.body.error).toMatchObject({ type: 'operation_pending', operation_id: behind });
    expect((await api.call('GET', `${trainer}/operations/not-an-operation`)).status).toBe(404);
    let done: Awaited<ReturnType<typeof api.call>>;
    do done = await api.call('GET', `${trainer}/operations/${behind}`);
    while (done.status === 408);
    expect(done.body.status).toBe('done');
    expect((await api.call('GET', `${trainer}/operations/${slow}`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 600));
    const expired = await api.call('GET', `${trainer}/operations/${behind}`);
    expect(expired.status).toBe(404);
    expect(expired.body.error.message).toContain('expired');
  });

  it('answers a waiting long poll with 503 when the server shuts down', async () => {
    server = await startTestServer({ longPollMs: 20_000 });
    const api = http(server.url);
    const { trainer } = await newRun(api, { max_seq_len: 4096 });
    const long = Array.from({ length: 4 }, (_, i) =>
      wireDatum(
        Array.from({ length: 512 }, (_, t) => (t + i) % 999),
        Array.from({ length: 512 }, (_, t) => (t + 1) % 999),
      ),
    );
    await api.call('POST', `${trainer}/forward_backward`, ce(long));
    const behind = (await api.call('POST', `${trainer}/optim_step`, {})).body.operation_id;
    const poll = api.call('GET', `${trainer}/operations/${behind}`);
    await new Promise((r) => setTimeout(r, 100));
    const closing = server.close();
    const answer = await poll;
    expect(answer.status).toBe(503);
    expect(answer.body.error.type).toBe('shutting_down');
    await closing;
  });

  it('fails queued operations with RunDeactivated on deactivation, then answers 409 at once', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const { run, trainer } = await newRun(api);
    const fb = (await api.call('POST', `${trainer}/forward_backward`, ce(trainSet))).body.operation_id;
    const step = (await api.call('POST', `${trainer}/optim_step`, {})).body.operation_id;
    await api.call('POST', `/v1/loops/runs/${run.id}/deactivate`);
    for (const id of [fb, step]) {
      const polled = await api.call('GET', `${trainer}/operations/${id}`);
      expect(polled.status).toBe(200);
      if (polled.body.status === 'error') expect(polled.body.error.error_class).toBe('RunDeactivated');
    }
    expect((await api.call('GET', `${trainer}/operations/${step}`)).body.error.error_class).toBe('RunDeactivated');
    const later = await api.call('POST', `${trainer}/forward`, ce(evalSet));
    expect(later.status).toBe(409);
    expect(later.body.error.message).toContain('INACTIVE');
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(409);
  });

  it('reports 503 on /health during the cold start, 200 after', async () => {
    const clock = new ManualClock();
    server = await startTestServer({ clock, coldStartMs: 5000 });
    const api = http(server.url);
    const { trainer } = await newRun(api);
    const starting = await api.call('GET', `${trainer}/health`);
    expect(starting.status).toBe(503);
    expect(starting.body.error.retry_after_s).toBe(5);
    clock.advance(5000);
    expect((await api.call('GET', `${trainer}/health`)).status).toBe(200);
  });
});

describe('checkpoints and resume', () => {
  it('continues bit-identically after save_state and load_state_with_optimizer on a new run', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const a = await newRun(api);
    const step = async (trainer: string) => {
      const fb = await api.op(trainer, 'forward_backward', ce(trainSet));
      await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
      return fb.loss;
    };
    await step(a.trainer);
    await api.op(a.trainer, 'save_state', { name: 'step-1' });
    const continued = [await step(a.trainer), await step(a.trainer)];
    const b = await newRun(api, { seed: 7 });
    expect(await api.op(b.trainer, 'load_state_with_optimizer', { path: `bt://loops:${a.run.id}/weights/step-1` })).toEqual({
      path: `bt://loops:${a.run.id}/weights/step-1`,
    });
    expect((await api.call('GET', `${b.trainer}/policy_version`)).body.policy_version).toBe(1);
    expect([await step(b.trainer), await step(b.trainer)]).toEqual(continued);

    // A run created with `path` starts from those weights (optimizer fresh).
    const c = await newRun(api, { path: `bt://loops:${a.run.id}/weights/step-1` });
    const fromPath = await api.op(c.trainer, 'forward', ce(trainSet));
    const d = await newRun(api);
    await api.op(d.trainer, 'load_state', { path: `bt://loops:${a.run.id}/weights/step-1` });
    expect((await api.op(d.trainer, 'forward', ce(trainSet))).loss).toBe(fromPath.loss);
  });

  it('resets to a fresh adapter with init_trainer_server', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const { trainer } = await newRun(api);
    const fresh = (await api.op(trainer, 'forward', ce(evalSet))).loss;
    await api.op(trainer, 'forward_backward', ce(trainSet));
    await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-2 } });
    expect((await api.op(trainer, 'forward', ce(evalSet))).loss).not.toBe(fresh);
    // A fresh adapter is a change of weights: the version moves on (it never goes back, so a publication reaches the sampler).
    expect(await api.op(trainer, 'init_trainer_server', { lora_rank: 16, lora_alpha: 32 })).toEqual({ lora_rank: 16, lora_alpha: 32, policy_version: 2 });
    expect((await api.op(trainer, 'forward', ce(evalSet))).loss).toBe(fresh);
  });
});

describe('concurrent runs (--batch-runs)', () => {
  /** Four runs of different ranks and seeds, each a forward_backward and an optim_step, then an eval: their losses. */
  async function fourRuns(api: ReturnType<typeof http>, together: boolean): Promise<number[][]> {
    const runs = await Promise.all(
      [
        [4, 1],
        [8, 2],
        [16, 3],
        [32, 4],
      ].map(([lora_rank, seed]) => newRun(api, { lora_rank, seed })),
    );
    const round = async ({ trainer }: { trainer: string }, i: number) => {
      const fb = await api.op(trainer, 'forward_backward', ce(trainSet.slice(i, i + 3)));
      await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-2 } });
      return [fb.loss, (await api.op(trainer, 'forward', ce(evalSet))).loss];
    };
    if (together) return Promise.all(runs.map(round));
    const out = [];
    for (const [i, r] of runs.entries()) out.push(await round(r, i));
    return out;
  }

  it("batches different runs' steps that arrive together into shared graph runs: each run's losses as alone", async () => {
    server = await startTestServer();
    const api = http(server.url);
    const alone = await fourRuns(api, false);
    const engine = server.core.engines.get(MODEL);
    const before = { ...engine.graphRuns };
    const together = await fourRuns(api, true);
    expect(engine.graphRuns.mixed - before.mixed).toBeGreaterThan(0);
    // Fewer graph runs than the 8 (a forward_backward and an eval per run) that the runs alone take.
    expect(engine.graphRuns.total - before.total).toBeLessThan(8);
    together.flat().forEach((loss, i) => {
      expect(Math.abs(loss - alone.flat()[i]!)).toBeLessThan(1e-5 * Math.abs(alone.flat()[i]!));
    });
  });

  it('with --batch-runs off runs each run apart: the same losses to the bit', async () => {
    server = await startTestServer({ batchRuns: false });
    const api = http(server.url);
    const alone = await fourRuns(api, false);
    const engine = server.core.engines.get(MODEL);
    const before = { ...engine.graphRuns };
    expect(await fourRuns(api, true)).toEqual(alone);
    expect(engine.graphRuns.mixed - before.mixed).toBe(0);
    expect(engine.graphRuns.total - before.total).toBe(8);
  });
});

describe('submit-time validation', () => {
  it('refuses each kind of bad request with a 400 naming the datum and field', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const { run, trainer } = await newRun(api, { max_seq_len: 64 });
    const other = await newRun(http(server.url, 'another-org'));
    await api.op(trainer, 'save_state', { name: 'ok' });
    const good = trainSet[0]!;
    const n = good.model_input.chunks[0]!.tokens.length;
    const withInput = (name: string, tensor: unknown) => ({ ...good, loss_fn_inputs: { ...good.loss_fn_inputs, [name]: tensor } });
    const cases: [string, unknown, string, RegExp][] = [
      ['forward', { data: [good], loss_fn: 'mse' }, 'loss_fn', /not a loss of Loops/],
      ['forward', { data: [good], loss_fn: 'ppo', loss_fn_config: { clip: 1 } }, 'loss_fn_config.clip', /not a setting of 'ppo'/],
      ['forward', { data: [good], loss_fn: 'cross_entropy', loss_fn_config: { beta: 1 } }, 'loss_fn_config', /takes no loss_fn_config/],
      ['forward', ce([good, wireDatum([1, 151669], [2, 3])]), 'data[1].model_input', /151669 at position 1 is outside/],
      ['forward', ce([wireDatum(Array(65).fill(1), Array(65).fill(1))]), 'data[0].model_input', /max_seq_len is 64/],
      ['forward', ce([withInput('weights', { data: [1, 2], dtype: 'float32' })]), 'data[0].loss_fn_inputs.weights', /needs one per position/],
      ['forward', ce([withInput('weights', { data: Array(n).fill(1), dtype: 'int64' })]), 'data[0].loss_fn_inputs.weights.dtype', /dtype 'float32'/],
      [
        'forward',
        ce([withInput('weights', { data: Array(n).fill(1), dtype: 'float32', shape: [n + 1] })]),
        'data[0].loss_fn_inputs.weights.shape',
        /does not fit/,
      ],
      ['forward', ce([withInput('weights', { data: Array(n).fill(1e39), dtype: 'float32' })]), 'data[0].loss_fn_inputs.weights', /finite float32/],
      ['forward', ce([withInput('reward', { data: Array(n).fill(1), dtype: 'float32' })]), 'data[0].loss_fn_inputs.reward', /not an input of Loops losses/],
      [
        'forward',
        ce([withInput('target_tokens', { data: Array(n).fill(200000), dtype: 'int64' })]),
        'data[0].loss_fn_inputs.target_tokens',
        /outside the vocabulary/,
      ],
      [
        'forward',
        { data: [good], loss_fn: 'importance_sampling' },
        'data[0].loss_fn_inputs',
        /data\[0\]: loss_fn 'importance_sampling' needs loss_fn_inputs.logprobs/,
      ],
      [
        'forward',
        ce([{ model_input: { chunks: [{ type: 'image_asset_pointer', location: 'a.png', format: 'png' }] } }]),
        'data[0].model_input.chunks[0].type',
        /loops-mock takes \{"type": "encoded_text"/,
      ],
      ['forward', ce([]), 'body.data', /at least 1/],
      ['optim_step', { adam_params: { learning_rate: -1 } }, 'adam_params.learning_rate', /in \[0, 1\]/],
      ['optim_step', { adam_params: { beta2: 1 } }, 'adam_params.beta2', /in \[0, 1\)/],
      ['optim_step', { adam_params: { lr: 1 } }, 'body.adam_params.lr', /not a known field/],
      ['save_state', { name: '../../escape' }, 'name', /not a safe checkpoint name/],
      ['save_weights_for_sampler', { name: 'a/b' }, 'name', /not a safe checkpoint name/],
      ['load_state', { path: `bt://loops:${other.run.id}/weights/ok` }, 'path', /does not name a checkpoint you can access/],
      ['load_state', { path: '/etc/passwd' }, 'path', /not a Loops checkpoint path/],
      ['load_state_with_optimizer', { path: `bt://loops:${run.id}/sampler_weights/ok` }, 'path', /trainer checkpoint/],
      ['init_trainer_server', { lora_rank: 0 }, 'lora_rank', /out of range/],
    ];
    for (const [op, body, field, message] of cases) {
      const res = await api.call('POST', `${trainer}/${op}`, body);
      expect(res.status, `${op} ${field}`).toBe(400);
      expect(res.body.error.field, `${op} ${field}`).toBe(field);
      expect(res.body.error.message, `${op} ${field}`).toMatch(message);
    }
    // A checkpoint of another base model.
    const qwen8 = await newRun(api, { base_model: 'Qwen/Qwen3-8B' });
    await api.op(qwen8.trainer, 'save_state', { name: 'other-model' });
    const mismatch = await api.call('POST', `${trainer}/load_state`, { path: `bt://loops:${qwen8.run.id}/weights/other-model` });
    expect(mismatch.status).toBe(400);
    expect(mismatch.body.error.message).toContain('Qwen/Qwen3-8B');
    const unknown = await api.call('POST', `${trainer}/no_such_op`, {});
    expect(unknown.status).toBe(404);
    expect(unknown.body.error.nearest_route).toMatch(/^POST \/trainer\/\{run_id\}\//);
  });
});

void prompt;
