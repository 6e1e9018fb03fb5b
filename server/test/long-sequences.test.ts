import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { http, startTestServer, wireDatum } from './helpers.js';

// Long inputs on default settings (issue 14 item 2): 4,096 positions work on every route, computed in blocks
// so that memory per request stays bounded (bench/memory.ts has the figures); beyond the server's limit, a 400
// that names it and the flag that raises it.

const MODEL = 'Qwen/Qwen3.5-2B';
let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

const ids = (n: number, salt = 0) => Array.from({ length: n }, (_, i) => (i * 7919 + 13 + salt) % 150_000);

async function newRun(api: ReturnType<typeof http>, extra: Record<string, unknown> = {}) {
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 8, ...extra });
  return {
    res,
    run: res.body.run,
    trainer: res.body.run && new URL(res.body.run.base_url).pathname,
    sampler: res.body.run && new URL(res.body.run.sampler.base_url).pathname,
  };
}

describe('4,096-token sequences on default settings', () => {
  it('train, score and sample: forward_backward, forward, compute_logprobs and sample all answer', async () => {
    server = await startTestServer();
    const api = http(server.url);
    const { trainer, sampler } = await newRun(api);
    const tokens = ids(4096);
    const datum = wireDatum(tokens, tokens.slice(1).concat(0));
    const fb = await api.op(trainer, 'forward_backward', { data: [datum], loss_fn: 'cross_entropy' });
    expect(fb.loss_fn_outputs[0].logprobs.data).toHaveLength(4096);
    expect(Number.isFinite(fb.loss)).toBe(true);
    // The same positions scored in one sequence or in blocks: a forward of the same datum gives the same loss.
    const fwd = await api.op(trainer, 'forward', { data: [datum], loss_fn: 'cross_entropy' });
    expect(fwd.loss).toBeCloseTo(fb.loss, 5);
    const step = await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
    expect(step.metrics.grad_norm).toBeGreaterThan(0);

    const prompt = { chunks: [{ type: 'encoded_text', tokens: tokens.slice(0, 4080) }] };
    const scored = await api.call('POST', `${sampler}/compute_logprobs`, { prompt });
    expect(scored.status).toBe(200);
    expect(scored.body.logprobs).toHaveLength(4080);
    const sampled = await api.call('POST', `${sampler}/sample`, { prompt, num_samples: 1, sampling_params: { max_tokens: 16, temperature: 1, seed: 1 } });
    expect(sampled.status).toBe(200);
    expect(sampled.body.sequences[0].tokens).toHaveLength(16);
  }, 120_000);
});

describe("the server's sequence limit (--max-seq-len-limit, 8192 by default)", () => {
  it("takes any declared max_seq_len up to the model's maximum (its default); a request whose tokens pass the limit is the 400 naming the flag", async () => {
    server = await startTestServer();
    const api = http(server.url);
    // The docs default max_seq_len to the model's maximum: 131,072 for Qwen3.5-2B.
    const { run } = await newRun(api);
    expect(server.core.fleet.findRun(run.id)!.max_seq_len).toBe(131_072);
    const declared = await newRun(api, { max_seq_len: 32_768 });
    expect(declared.res.status).toBe(200);
    expect(server.core.fleet.findRun(declared.run.id)!.max_seq_len).toBe(32_768);
    const sampler = await api.call('POST', '/v1/loops/samplers', { session_id: run.session_id, base_model: MODEL, max_seq_length: 100_000 });
    expect(sampler.status).toBe(200);
    // Beyond the model's own maximum is still out of range.
    const tooLong = (await newRun(api, { max_seq_len: 131_073 })).res;
    expect([tooLong.status, tooLong.body.error.field]).toEqual([400, 'max_seq_len']);
    expect(tooLong.body.error.message).toMatch(/use 1\.\.131072/);
    // What a request sends is bounded by the server's --max-seq-len-limit (8,192 by default), at that request.
    const long = ids(8200);
    const fb = await api.call('POST', `${declared.trainer}/forward`, { data: [wireDatum(long, long)], loss_fn: 'cross_entropy' });
    expect(fb.status).toBe(400);
    expect(fb.body.error.message).toMatch(/data\[0\]\.model_input has 8200 tokens; the server's --max-seq-len-limit \(raise it to allow longer\) is 8192/);
  });

  it('refuses longer inputs with a 400 naming the limit, also for runs made before it was lowered', async () => {
    server = await startTestServer({ admin: true, maxSeqLenLimit: 100_000 });
    const api = http(server.url);
    const { trainer, sampler } = await newRun(api, { max_seq_len: 50_000 });
    server.core.settings.maxSeqLenLimit = 4096;
    const long = ids(5000);
    const fb = await api.call('POST', `${trainer}/forward_backward`, { data: [wireDatum(long, long)], loss_fn: 'cross_entropy' });
    expect(fb.status).toBe(400);
    expect(fb.body.error.message).toMatch(/data\[0\]\.model_input has 5000 tokens; the server's --max-seq-len-limit \(raise it to allow longer\) is 4096/);
    const sample = await api.call('POST', `${sampler}/sample`, {
      prompt: { chunks: [{ type: 'encoded_text', tokens: long }] },
      num_samples: 1,
      sampling_params: { max_tokens: 4 },
    });
    expect(sample.status).toBe(400);
    expect(sample.body.error.message).toMatch(/prompt has 5000 tokens; the server's --max-seq-len-limit/);
    // Sampling's token budget counts against the same limit.
    const budget = await api.call('POST', `${sampler}/sample`, {
      prompt: { chunks: [{ type: 'encoded_text', tokens: ids(4090) }] },
      num_samples: 1,
      sampling_params: { max_tokens: 16 },
    });
    expect(budget.status).toBe(400);
    expect(budget.body.error).toMatchObject({ field: 'max_tokens' });
    expect(budget.body.error.message).toMatch(/limit of 6 \(max_seq_length 4096 minus the 4090-token prompt/);
  });
});
