import { afterEach, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { datum, prompt, TICKETS } from '../../models/data/support-tickets.js';
import { ManualClock, type RunningServer, type StartOptions } from '../index.js';
import { startTestServer } from './helpers.js';

const MODEL = 'Qwen/Qwen3.5-2B';
const tok = new EnginePool().tokenizers.get(MODEL);
let server: RunningServer;
afterEach(() => server?.close());

async function start(options: StartOptions = {}) {
  server = await startTestServer(options);
  return api(server.url);
}

function api(base: string) {
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { authorization: 'Bearer sampler-test', ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null, headers: res.headers };
  };
  const op = async (trainer: string, name: string, body: unknown) => {
    const { operation_id } = (await call('POST', `${trainer}/${name}`, body)).body;
    for (;;) {
      const r = await call('GET', `${trainer}/operations/${operation_id}`);
      if (r.status === 408) continue;
      if (r.body.status !== 'done') throw new Error(JSON.stringify(r.body));
      return r.body.result;
    }
  };
  const run = async (extra: Record<string, unknown> = {}) => {
    const session = (await call('POST', '/v1/loops/sessions')).body.session.id;
    const r = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 8, seed: 1, ...extra })).body.run;
    return { run: r, trainer: new URL(r.base_url).pathname, sampler: new URL(r.sampler.base_url).pathname };
  };
  /** One training step and a publish: the sampler's next version. */
  const trainAndPublish = async (trainer: string, name: string) => {
    const data = TICKETS.slice(0, 2).map(([t, l]) => {
      const d = datum(tok, t, l);
      return {
        model_input: { chunks: [{ type: 'encoded_text', tokens: d.tokens }] },
        loss_fn_inputs: { target_tokens: { data: d.targetTokens, dtype: 'int64' } },
      };
    });
    await op(trainer, 'forward_backward', { data, loss_fn: 'cross_entropy' });
    await op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-2 } });
    return op(trainer, 'save_weights_for_sampler', { name });
  };
  return { call, op, run, trainAndPublish };
}

const promptTokens = tok.encode(prompt(TICKETS[0]![0]));
const sampleBody = (extra: Record<string, unknown> = {}) => ({
  prompt: { chunks: [{ type: 'encoded_text', tokens: promptTokens }] },
  num_samples: 2,
  sampling_params: { max_tokens: 6, temperature: 1, seed: 3 },
  ...extra,
});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('version floors', () => {
  it('a pinned client gets 408 while the replica lags, then a sample at or above its floor', async () => {
    const c = await start({ weightSyncDelayMs: [300], floorWaitMs: 50 });
    const { trainer, sampler } = await c.run();
    expect((await c.call('POST', `${sampler}/sample`, sampleBody())).body.policy_version).toBe(0);
    const published = await c.trainAndPublish(trainer, 'v1');
    expect(published.policy_version).toBe(1);
    const lagging = await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '1' });
    expect(lagging.status).toBe(408);
    expect(lagging.body.error).toMatchObject({
      type: 'policy_version_floor',
      floor: 1,
      published_version: 1,
      unreachable: false,
      replicas: [{ replica: 0, policy_version: 0 }],
    });
    expect(lagging.headers.get('retry-after')).toBe('1');
    await sleep(350);
    const served = await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '1' });
    expect(served.status).toBe(200);
    expect(served.body.policy_version).toBeGreaterThanOrEqual(1);
    expect(served.headers.get('x-policy-version')).toBe('1');
    // No floor: served at once by whatever is live.
    expect((await c.call('POST', `${sampler}/sample`, sampleBody())).status).toBe(200);
  });

  it("says in Retry-After when the soonest replica reaches the floor, not the slowest one's whole delay", async () => {
    const clock = new ManualClock();
    const c = await start({ clock, samplerReplicas: 2, weightSyncDelayMs: [1500, 6000], floorWaitMs: 0 });
    const { trainer, sampler } = await c.run();
    await c.trainAndPublish(trainer, 'v1');
    const first = await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '1' });
    expect(first.status).toBe(408);
    expect(first.headers.get('retry-after')).toBe('2');
    clock.advance(1000);
    const later = await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '1' });
    expect(later.headers.get('retry-after')).toBe('1');
    expect(later.body.error.retry_after_s).toBe(1);
    clock.advance(500);
    expect((await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '1' })).status).toBe(200);
  });

  it('waits up to the floor wait for a replica that catches up in time', async () => {
    const c = await start({ weightSyncDelayMs: [200], floorWaitMs: 2000 });
    const { trainer, sampler } = await c.run();
    await c.trainAndPublish(trainer, 'v1');
    const started = performance.now();
    const served = await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '1' });
    expect(served.status).toBe(200);
    expect(served.body.policy_version).toBe(1);
    expect(performance.now() - started).toBeGreaterThan(100);
  });

  it('answers an unreachable floor with 408 at once, saying so', async () => {
    const c = await start({ floorWaitMs: 5000 });
    const { sampler } = await c.run();
    const started = performance.now();
    const res = await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': '7' });
    expect(res.status).toBe(408);
    expect(res.body.error.unreachable).toBe(true);
    expect(res.body.error.message).toContain('above anything published');
    expect(performance.now() - started).toBeLessThan(1000);
    expect((await c.call('POST', `${sampler}/sample`, sampleBody(), { 'x-min-policy-version': 'abc' })).status).toBe(400);
  });

  it('serves floors correctly from two replicas with different delays; affinity keeps a key on one replica', async () => {
    const c = await start({ samplerReplicas: 2, weightSyncDelayMs: [0, 400], floorWaitMs: 50 });
    const { trainer, sampler } = await c.run();
    // Affinity: the same key always lands on the same replica.
    const replicaOf = async (key: string) =>
      (await c.call('POST', `${sampler}/compute_logprobs`, { prompt: sampleBody().prompt }, { 'x-affinity-key': key })).headers.get('x-loops-mock-replica');
    const keys = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta'];
    const first = await Promise.all(keys.map(replicaOf));
    expect(await Promise.all(keys.map(replicaOf))).toEqual(first);
    expect(new Set(first).size).toBe(2);
    await c.trainAndPublish(trainer, 'v1');
    expect((await c.call('GET', `${sampler}/policy_version`)).body).toEqual({
      policy_version: 1,
      replicas: [
        { replica: 0, policy_version: 1 },
        { replica: 1, policy_version: 0 },
      ],
      published_version: 1,
    });
    // Without affinity, the up-to-date replica serves the floor.
    for (let i = 0; i < 3; i++) {
      const r = await c.call('POST', `${sampler}/compute_logprobs`, { prompt: sampleBody().prompt }, { 'x-min-policy-version': '1' });
      expect(r.status).toBe(200);
      expect(r.headers.get('x-loops-mock-replica')).toBe('0');
    }
    // A key pinned to the lagging replica waits for it (then 408): affinity is never broken to meet a floor.
    const laggingKey = keys[first.indexOf('1')]!;
    expect(
      (await c.call('POST', `${sampler}/compute_logprobs`, { prompt: sampleBody().prompt }, { 'x-min-policy-version': '1', 'x-affinity-key': laggingKey }))
        .status,
    ).toBe(408);
    await sleep(450);
    const caughtUp = await c.call(
      'POST',
      `${sampler}/compute_logprobs`,
      { prompt: sampleBody().prompt },
      { 'x-min-policy-version': '1', 'x-affinity-key': laggingKey },
    );
    expect(caughtUp.status).toBe(200);
    expect(caughtUp.headers.get('x-loops-mock-replica')).toBe('1');
  });
});

describe('versions after a load', () => {
  it('a publication after load_state goes live on both replicas and serves the next floor; versions never go back', async () => {
    const c = await start({ samplerReplicas: 2, weightSyncDelayMs: [0, 300], floorWaitMs: 50 });
    const { run, trainer, sampler } = await c.run();
    const tokens = promptTokens;
    const promptLogprobs = async (floor: number) => {
      const r = await c.call(
        'POST',
        `${sampler}/compute_logprobs`,
        { prompt: { chunks: [{ type: 'encoded_text', tokens }] } },
        { 'x-min-policy-version': String(floor) },
      );
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      return r.body as { logprobs: (number | null)[]; policy_version: number };
    };
    const trainerLogprobs = async () => {
      const targets = tokens.map((_, i) => (i + 1 < tokens.length ? tokens[i + 1]! : -100));
      const fwd = await c.op(trainer, 'forward', {
        data: [{ model_input: { chunks: [{ type: 'encoded_text', tokens }] }, loss_fn_inputs: { target_tokens: { data: targets, dtype: 'int64' } } }],
        loss_fn: 'cross_entropy',
      });
      return (fwd.loss_fn_outputs[0].logprobs.data as number[]).slice(0, tokens.length - 1);
    };
    const versions: number[] = [];
    const trainerVersion = async () => {
      const v = (await c.call('GET', `${trainer}/policy_version`)).body.policy_version;
      versions.push(v);
      return v;
    };

    expect((await c.trainAndPublish(trainer, 'step-1')).policy_version).toBe(1);
    await c.op(trainer, 'save_state', { name: 'step-1' });
    expect((await c.trainAndPublish(trainer, 'step-2')).policy_version).toBe(2);
    await trainerVersion();
    const beforeLoad = await promptLogprobs(2);

    await c.op(trainer, 'load_state', { path: `bt://loops:${run.id}/weights/step-1` });
    // A load changes the weights: a new version, above everything published so far.
    expect(await trainerVersion()).toBe(3);
    const published = await c.trainAndPublish(trainer, 'after-load');
    expect(published.policy_version).toBe(4);
    expect(await trainerVersion()).toBe(4);

    // The next floor-pinned request gets the post-load weights, not the v2 ones.
    const afterLoad = await promptLogprobs(published.policy_version);
    expect(afterLoad.policy_version).toBe(4);
    const expected = await trainerLogprobs();
    expected.forEach((lp, i) => {
      expect(Math.abs(afterLoad.logprobs[i + 1]! - lp)).toBeLessThan(1e-4);
    });
    expect(Math.max(...expected.map((lp, i) => Math.abs(beforeLoad.logprobs[i + 1]! - lp)))).toBeGreaterThan(1e-3);

    // Both replicas go live at the new version.
    await sleep(350);
    expect((await c.call('GET', `${sampler}/policy_version`)).body).toMatchObject({
      policy_version: 4,
      replicas: [
        { replica: 0, policy_version: 4 },
        { replica: 1, policy_version: 4 },
      ],
      published_version: 4,
    });
    for (const key of ['alpha', 'beta', 'gamma', 'delta']) {
      const r = await c.call(
        'POST',
        `${sampler}/compute_logprobs`,
        { prompt: { chunks: [{ type: 'encoded_text', tokens }] } },
        { 'x-min-policy-version': '4', 'x-affinity-key': key },
      );
      expect(r.status).toBe(200);
      expected.forEach((lp, i) => {
        expect(Math.abs(r.body.logprobs[i + 1] - lp)).toBeLessThan(1e-4);
      });
    }

    // init_trainer_server is a new adapter too: the version moves on, never back.
    const init = await c.op(trainer, 'init_trainer_server', { lora_rank: 8 });
    expect(init.policy_version).toBe(5);
    await trainerVersion();
    expect(versions).toEqual([...versions].sort((a, b) => a - b));
  });
});

describe('sampling routes', () => {
  it("reports the trainer's logprobs for sampled tokens at the same version, and compute_logprobs agrees", async () => {
    const c = await start();
    const { trainer, sampler } = await c.run();
    await c.trainAndPublish(trainer, 'v1');
    const { sequences, policy_version } = (
      await c.call('POST', `${sampler}/sample`, sampleBody({ sampling_params: { max_tokens: 8, temperature: 1, seed: 9 } }))
    ).body;
    expect(policy_version).toBe(1);
    for (const s of sequences) {
      const tokens = [...promptTokens, ...s.tokens];
      const targets = tokens.map((_, i) => (i >= promptTokens.length - 1 && i + 1 < tokens.length ? tokens[i + 1]! : -100));
      const fwd = await c.op(trainer, 'forward', {
        data: [{ model_input: { chunks: [{ type: 'encoded_text', tokens }] }, loss_fn_inputs: { target_tokens: { data: targets, dtype: 'int64' } } }],
        loss_fn: 'cross_entropy',
      });
      const trainerLp = fwd.loss_fn_outputs[0].logprobs.data.slice(promptTokens.length - 1, tokens.length - 1);
      s.logprobs.forEach((lp: number, k: number) => {
        expect(Math.abs(lp - trainerLp[k])).toBeLessThan(1e-4);
      });
      const cl = (await c.call('POST', `${sampler}/compute_logprobs`, { prompt: { chunks: [{ type: 'encoded_text', tokens }] } })).body;
      expect(cl.logprobs[0]).toBeNull();
      expect(cl.logprobs).toHaveLength(tokens.length);
      s.logprobs.forEach((lp: number, k: number) => {
        expect(Math.abs(lp - cl.logprobs[promptTokens.length + k])).toBeLessThan(1e-4);
      });
    }
  });

  it('is reproducible with a seed; stops on stop tokens and strings; gives prompt logprobs on request', async () => {
    const c = await start();
    const { sampler } = await c.run();
    const a = (await c.call('POST', `${sampler}/sample`, sampleBody())).body;
    const b = (await c.call('POST', `${sampler}/sample`, sampleBody())).body;
    expect(b.sequences).toEqual(a.sequences);
    const greedy = { max_tokens: 6, temperature: 0 };
    const free = (await c.call('POST', `${sampler}/sample`, sampleBody({ num_samples: 1, sampling_params: greedy }))).body.sequences[0];
    const byId = (await c.call('POST', `${sampler}/sample`, sampleBody({ num_samples: 1, sampling_params: { ...greedy, stop: [free.tokens[1]] } }))).body
      .sequences[0];
    expect(byId.stop_reason).toBe('stop');
    expect(byId.tokens.length).toBeLessThanOrEqual(2);
    const text = tok.decode(free.tokens.slice(0, 3));
    const byText = (await c.call('POST', `${sampler}/sample`, sampleBody({ num_samples: 1, sampling_params: { ...greedy, stop: text.slice(-2) } }))).body
      .sequences[0];
    expect(byText.stop_reason).toBe('stop');
    const withPrompt = (await c.call('POST', `${sampler}/sample`, sampleBody({ include_prompt_logprobs: true, topk_prompt_logprobs: 3 }))).body;
    expect(withPrompt.prompt_token_ids).toEqual(promptTokens);
    expect(withPrompt.prompt_logprobs[0]).toBeNull();
    expect(withPrompt.prompt_logprobs).toHaveLength(promptTokens.length);
    expect(withPrompt.topk_prompt_logprobs[0]).toBeNull();
    expect(withPrompt.topk_prompt_logprobs[1]).toHaveLength(3);
  });

  it("serves OpenAI-style completions and lists models in vLLM's format", async () => {
    const c = await start();
    const { trainer, sampler, run } = await c.run();
    const base = (await c.call('GET', `${sampler}/v1/models`)).body;
    expect(base.data).toEqual([expect.objectContaining({ id: MODEL, parent: null })]);
    await c.trainAndPublish(trainer, 'v1');
    const models = (await c.call('GET', `${sampler}/v1/models`)).body.data;
    expect(models[1]).toMatchObject({ id: `${run.sampler.id}/policy-v1`, parent: MODEL });
    const res = await c.call('POST', `${sampler}/v1/completions`, { model: MODEL, prompt: 'Hello', max_tokens: 5, temperature: 0, logprobs: 1, echo: true });
    expect(res.status).toBe(200);
    expect(res.body.choices[0].text.startsWith('Hello')).toBe(true);
    expect(res.body.choices[0].logprobs.token_logprobs[0]).toBeNull();
    expect(res.body.usage.completion_tokens).toBe(5);
    expect(res.body.policy_version).toBe(1);
    expect((await c.call('POST', `${sampler}/v1/completions`, { prompt: [1, 2, 3], n: 2, max_tokens: 2 })).body.choices).toHaveLength(2);
    expect((await c.call('POST', `${sampler}/v1/completions`, { model: 'gpt-4', prompt: 'x' })).status).toBe(404);
    expect((await c.call('POST', `${sampler}/v1/completions`, { prompt: 'x', stream: true })).status).toBe(400);
    // Nothing asked for, nothing given: an empty completion, not a 500.
    const none = await c.call('POST', `${sampler}/v1/completions`, { prompt: 'Hello', max_tokens: 0 });
    expect([none.status, none.body.choices[0].text, none.body.choices[0].finish_reason, none.body.usage.completion_tokens]).toEqual([200, '', 'length', 0]);
  });

  it('refuses bad input with a 400 naming the field', async () => {
    const c = await start();
    const { sampler } = await c.run({ max_seq_len: 128 });
    const cases: [unknown, string][] = [
      [{ num_samples: 1 }, 'body.prompt'],
      [sampleBody({ prompt: { chunks: [{ type: 'encoded_text', tokens: [151669] }] } }), 'prompt'],
      [sampleBody({ sampling_params: { max_tokens: 500 } }), 'max_tokens'],
      [sampleBody({ sampling_params: { top_p: 0 } }), 'body.sampling_params.top_p'],
      [sampleBody({ sampling_params: { top_p: 1.5 } }), 'body.sampling_params.top_p'],
      [sampleBody({ sampling_params: { temperature: 'hot' } }), 'body.sampling_params.temperature'],
      [sampleBody({ sampling_params: { top_k: 0 } }), 'top_k'],
      [sampleBody({ num_samples: 0 }), 'body.num_samples'],
      [sampleBody({ prompt: { chunks: [{ type: 'image_asset_pointer', location: 'a.png', format: 'png' }] } }), 'prompt.chunks[0].type'],
      [sampleBody({ prompt: { chunks: [{ type: 'image', data: 'x', format: 'png', expected_tokens: 4 }] } }), 'prompt.chunks[0].data'],
    ];
    for (const [body, field] of cases) {
      const res = await c.call('POST', `${sampler}/sample`, body);
      expect(res.status, field).toBe(400);
      expect(res.body.error.field, field).toBe(field);
    }
  });
});

describe('sampler lifecycle', () => {
  it('a standalone sampler of a checkpoint serves that adapter', async () => {
    const c = await start();
    const { trainer, sampler, run } = await c.run();
    await c.trainAndPublish(trainer, 'v1');
    const greedy = sampleBody({ num_samples: 1, sampling_params: { max_tokens: 6, temperature: 0 } });
    const paired = (await c.call('POST', `${sampler}/sample`, greedy)).body.sequences[0].tokens;
    const standalone = (
      await c.call('POST', '/v1/loops/samplers', { session_id: run.session_id, base_model: MODEL, model_path: `bt://loops:${run.id}/sampler_weights/v1` })
    ).body.sampler;
    const fromCheckpoint = (await c.call('POST', `${new URL(standalone.base_url).pathname}/sample`, greedy)).body.sequences[0].tokens;
    expect(fromCheckpoint).toEqual(paired);
    const base = (await c.call('POST', '/v1/loops/samplers', { session_id: run.session_id, base_model: MODEL })).body.sampler;
    expect((await c.call('POST', `${new URL(base.base_url).pathname}/sample`, greedy)).body.sequences[0].tokens).not.toEqual(paired);
  });

  it('a scaled-to-zero sampler wakes on the next request; a deactivated one answers 409 at once', async () => {
    const clock = new ManualClock();
    const c = await start({ clock, coldStartMs: 1000 });
    const { run, sampler } = await c.run({ scale_down_delay_seconds: 60 });
    expect((await c.call('GET', `${sampler}/health`)).status).toBe(503);
    clock.advance(1000);
    expect((await c.call('GET', `${sampler}/health`)).status).toBe(200);
    clock.advance(61_000);
    expect((await c.call('GET', `/v1/loops/samplers/${run.sampler.id}`)).body.sampler.status.name).toBe('SCALED_TO_ZERO');
    const waking = await c.call('POST', `${sampler}/sample`, sampleBody());
    expect(waking.status).toBe(503);
    expect(waking.body.error.status).toBe('WAKING_UP');
    expect(waking.headers.get('retry-after')).toBe('1');
    clock.advance(1000);
    expect((await c.call('POST', `${sampler}/sample`, sampleBody())).status).toBe(200);
    const other = await c.run();
    await c.call('POST', `/v1/loops/runs/${other.run.id}/deactivate`);
    const gone = await c.call('POST', `${other.sampler}/sample`, sampleBody());
    expect(gone.status).toBe(409);
    expect(gone.body.error.type_detail).toBe('sampler_inactive');
  });
});
