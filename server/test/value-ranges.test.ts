import { afterEach, describe, expect, it } from 'vitest';
import { decodeSafetensors, encodeSafetensors } from '../../models/safetensors.js';
import {
  MAX_ABS_LOSS_SCALE,
  MAX_LEARNING_RATE,
  MAX_LOSS_CONFIG_VALUE,
  MAX_LORA_ALPHA,
  MIN_ADAM_EPS,
  MIN_COUNTED_LOGPROB,
  MIN_TEMPERATURE,
} from '../core/value-ranges.js';
import type { RunningServer } from '../index.js';
import { deployTrainedCheckpoint } from './deployed-checkpoint.js';
import { client, newRun, startTestServer, wireDatum, type Client } from './helpers.js';

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

// Issue 31 item 11: finite numbers that overflow float32 once the model uses them (lora_alpha 1e308, a
// learning rate of 1e308) made operations end `done` with nulls. Each is a 400 naming the field now, and an
// operation whose result would hold a non-finite number ends in an error naming it.

/** Submits an operation: the submit's reply, and when accepted the operation's end. */
async function submit(api: Client, trainer: string, op: string, body: unknown): Promise<{ status: number; body: any }> {
  const res = await api.post(`${trainer}/${op}`, body);
  if (res.status !== 200) return res;
  for (;;) {
    const polled = await api.get(`${trainer}/operations/${res.body.operation_id}`);
    if (polled.status !== 408) return polled;
  }
}

const tokens = [9707, 11, 1879, 0, 4242];
const ratioDatum = (logprobs: number[], advantages: number[]) => ({
  model_input: { chunks: [{ type: 'encoded_text', tokens }] },
  loss_fn_inputs: {
    logprobs: { data: logprobs, dtype: 'float32', shape: [tokens.length] },
    advantages: { data: advantages, dtype: 'float32', shape: [tokens.length] },
  },
});

describe('numbers that reach the model are range-checked', () => {
  it('the trainer: lora_alpha, adam_params, loss_fn_config and the loss inputs, each a 400 naming the field', async () => {
    server = await startTestServer();
    const api = client(server);
    const trainer = new URL((await newRun(api, { lora_rank: 4 })).base_url).pathname;
    const refused = async (op: string, body: unknown, field: string) => {
      const res = await api.post(`${trainer}/${op}`, body);
      expect([res.status, res.body.error?.field], `${op} ${JSON.stringify(body).slice(0, 120)}`).toEqual([400, field]);
      return res.body.error.message as string;
    };
    expect(await refused('init_trainer_server', { lora_rank: 4, lora_alpha: 1e308 }, 'lora_alpha')).toContain(String(MAX_LORA_ALPHA));
    await refused('init_trainer_server', { lora_rank: 4, lora_alpha: MAX_LORA_ALPHA * 1.01 }, 'lora_alpha');
    expect((await submit(api, trainer, 'init_trainer_server', { lora_rank: 4, lora_alpha: MAX_LORA_ALPHA })).body.status).toBe('done');

    expect(await refused('optim_step', { adam_params: { learning_rate: 1e308 } }, 'adam_params.learning_rate')).toContain(`[0, ${MAX_LEARNING_RATE}]`);
    await refused('optim_step', { adam_params: { learning_rate: MAX_LEARNING_RATE * 2 } }, 'adam_params.learning_rate');
    await refused('optim_step', { adam_params: { eps: MIN_ADAM_EPS / 10 } }, 'adam_params.eps');
    await refused('optim_step', { adam_params: { eps: 1e-300 } }, 'adam_params.eps');
    await refused('optim_step', { adam_params: { learning_rate: 1e-3, weight_decay: 1e308 } }, 'adam_params.weight_decay');
    await refused('optim_step', { adam_params: { learning_rate: 0.5, weight_decay: 3 } }, 'adam_params.weight_decay');

    expect(
      await refused(
        'forward_backward',
        { data: [ratioDatum([0, -1, -1, -1, -1], [0, 1, 1, 1, 1])], loss_fn: 'dro', loss_fn_config: { beta: 1e308 } },
        'loss_fn_config.beta',
      ),
    ).toContain(String(MAX_LOSS_CONFIG_VALUE));
    await refused(
      'forward_backward',
      { data: [ratioDatum([0, -1, -1, -1, -1], [0, 1, 1, 1, 1])], loss_fn: 'ppo', loss_fn_config: { clip_low_threshold: 0.8, clip_high_threshold: 1e300 } },
      'loss_fn_config.clip_high_threshold',
    );

    const weighted = (w: number) => ({
      ...wireDatum(tokens, tokens),
      loss_fn_inputs: { ...wireDatum(tokens, tokens).loss_fn_inputs, weights: { data: [1, 1, w, 1, 1], dtype: 'float32' } },
    });
    expect(await refused('forward_backward', { data: [weighted(1e30)] }, 'data[0].loss_fn_inputs.weights')).toContain('[2] is 1e+30');
    await refused('forward_backward', { data: [weighted(-MAX_ABS_LOSS_SCALE * 2)] }, 'data[0].loss_fn_inputs.weights');
    await refused(
      'forward_backward',
      { data: [ratioDatum([0, -1, -1, -1, -1], [0, 1, 3e38, 1, 1])], loss_fn: 'importance_sampling' },
      'data[0].loss_fn_inputs.advantages',
    );
    // A sampler logprob the ratio cannot take where it counts; the same value where the advantage is 0 does not count, and passes.
    expect(
      await refused('forward_backward', { data: [ratioDatum([0, -1, -1e6, -1, -1], [0, 1, 1, 1, 1])], loss_fn: 'ppo' }, 'data[0].loss_fn_inputs.logprobs'),
    ).toContain(String(MIN_COUNTED_LOGPROB));
    await refused(
      'forward',
      { data: [ratioDatum([0, -1, MIN_COUNTED_LOGPROB - 1, -1, -1], [0, 1, 1, 1, 1])], loss_fn: 'importance_sampling' },
      'data[0].loss_fn_inputs.logprobs',
    );
    const placeholder = await submit(api, trainer, 'forward_backward', { data: [ratioDatum([-1e6, -1, -1, -1, -1], [0, 1, 1, 1, 1])], loss_fn: 'ppo' });
    expect(placeholder.body.status).toBe('done');
    // The largest values allowed all together still train to finite numbers.
    const edge = await submit(api, trainer, 'forward_backward', {
      data: [ratioDatum([0, MIN_COUNTED_LOGPROB, MIN_COUNTED_LOGPROB, -1, -1], [0, MAX_ABS_LOSS_SCALE, -MAX_ABS_LOSS_SCALE, 1, 1])],
      loss_fn: 'importance_sampling',
    });
    expect(edge.body.status).toBe('done');
    expect(Number.isFinite(edge.body.result.loss)).toBe(true);
    const step = await submit(api, trainer, 'optim_step', {
      adam_params: { learning_rate: MAX_LEARNING_RATE, eps: MIN_ADAM_EPS, weight_decay: 1 / MAX_LEARNING_RATE },
    });
    expect(step.body.status).toBe('done');
    for (const v of Object.values(step.body.result.metrics)) expect(Number.isFinite(v)).toBe(true);
  });

  it('the sampler and a deployed checkpoint: a temperature too small to divide by is a 400; 0 is greedy', async () => {
    server = await startTestServer();
    const api = client(server);
    const run = await newRun(api, { lora_rank: 4 });
    const sampler = new URL(run.sampler.base_url).pathname;
    const sample = (temperature: number) =>
      api.post(`${sampler}/sample`, { prompt: { chunks: [{ type: 'encoded_text', tokens }] }, sampling_params: { max_tokens: 3, temperature } });
    for (const t of [1e-300, MIN_TEMPERATURE / 2]) {
      const res = await sample(t);
      expect([res.status, res.body.error.field]).toEqual([400, 'sampling_params.temperature']);
      expect(res.body.error.message).toMatch(/use 0 for greedy/);
    }
    for (const t of [0, MIN_TEMPERATURE]) {
      const res = await sample(t);
      expect(res.status).toBe(200);
      for (const s of res.body.sequences) for (const lp of s.logprobs) expect(Number.isFinite(lp)).toBe(true);
    }
    const completion = await api.post(`${sampler}/v1/completions`, { prompt: tokens, max_tokens: 2, temperature: 1e-40 });
    expect([completion.status, completion.body.error.field]).toEqual([400, 'temperature']);

    const d = await deployTrainedCheckpoint(server, 'Qwen/Qwen3.5-2B', 4);
    const chat = await server.app.inject({
      method: 'POST',
      url: `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`,
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ model: d.model, messages: d.cases[0]!.messages, max_tokens: 2, temperature: 1e-300 }),
    });
    expect([chat.statusCode, chat.json().error.param]).toEqual([400, 'temperature']);
  }, 120_000);

  it('an operation whose numbers overflow ends in an error naming where, not done with nulls; its gradients are dropped', async () => {
    server = await startTestServer();
    const api = client(server);
    const run = await newRun(api, { lora_rank: 4 });
    const trainer = new URL(run.base_url).pathname;
    // A checkpoint whose adapter holds finite float32 weights too large to compute with (1e30): as a file from elsewhere might.
    expect((await submit(api, trainer, 'save_state', { name: 'fine' })).body.status).toBe('done');
    const core = server.core;
    const record = core.fleet.findRun(run.id)!;
    const fine = core.checkpoints.find(run.id, 'trainer', 'fine')!;
    const files = core.checkpoints.readFiles(fine);
    const { tensors, metadata } = decodeSafetensors(files.get('adapter_model.safetensors')!);
    for (const [name, t] of tensors) if (name.includes('lora_B') || name.includes('lora_A')) t.data.fill(1e30);
    files.set('adapter_model.safetensors', encodeSafetensors(tensors, metadata));
    core.checkpoints.save(
      record,
      'trainer',
      'huge',
      [...files].map(([relative_file_name, data]) => ({ relative_file_name, data })),
      fine.lora_adapter_config,
    );
    expect((await submit(api, trainer, 'load_state', { path: `bt://loops:${run.id}/weights/huge` })).body.status).toBe('done');

    const datum = wireDatum(tokens, tokens);
    for (const op of ['forward', 'forward_backward']) {
      const failed = await submit(api, trainer, op, { data: [datum] });
      expect(failed.body.status, op).toBe('error');
      expect(failed.body.error.error_class).toBe('ValueError');
      expect(failed.body.error.message).toMatch(new RegExp(`^${op} overflowed float32: result\\.(loss|loss_fn_outputs|metrics)[^ ]* is (NaN|-?Infinity)`));
      expect(JSON.stringify(failed.body)).not.toContain('null');
    }
    // The failed forward_backward left no gradient behind: the step sees none (grad_norm 0), not NaN.
    const step = await submit(api, trainer, 'optim_step', { adam_params: { learning_rate: 1e-4 } });
    expect(step.body.status).toBe('done');
    expect(step.body.result.metrics.grad_norm).toBe(0);
    // Sane weights back: training works again.
    expect((await submit(api, trainer, 'load_state', { path: `bt://loops:${run.id}/weights/fine` })).body.status).toBe('done');
    const good = await submit(api, trainer, 'forward_backward', { data: [datum] });
    expect(good.body.status).toBe('done');
    expect(Number.isFinite(good.body.result.loss)).toBe(true);
  });
});
