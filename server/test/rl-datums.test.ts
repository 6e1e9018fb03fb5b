import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { datum, prompt, TICKETS } from '../../models/data/support-tickets.js';
import type { RunningServer } from '../index.js';
import { http, startTestServer, wireDatum } from './helpers.js';

// The trainer plane's datums as Baseten's RL guide builds them (docs/protocol.md, "Alignment"), loss_fn's
// default and top_k_logprobs, all through the routes against one run whose sampler serves the trainer's weights.
const MODEL = 'Qwen/Qwen3.5-2B';
const tok = new EnginePool().tokenizers.get(MODEL);
const promptTokens = tok.encode(prompt(TICKETS[0]![0]));
const POLICY_LOSSES = ['importance_sampling', 'ppo', 'cispo', 'dppo', 'dro'] as const;

let server: RunningServer;
let api: ReturnType<typeof http>;
let trainer: string;
let sampler: string;
/** Completions the sampler drew from the published weights, with its logprob of each token. */
let samples: { tokens: number[]; logprobs: number[] }[];

const tensor = (data: number[], dtype: 'int64' | 'float32' = 'float32') => ({ data, dtype, shape: [data.length] });

/** The RL guide's datum: prompt + completion, no target_tokens, logprobs and advantages at each completion token's own index, prompt positions 0.0. */
function guideDatum(s: { tokens: number[]; logprobs: number[] }, advantage: number) {
  const tokens = [...promptTokens, ...s.tokens];
  return {
    model_input: { chunks: [{ type: 'encoded_text', tokens }] },
    loss_fn_inputs: {
      logprobs: tensor([...promptTokens.map(() => 0), ...s.logprobs]),
      advantages: tensor([...promptTokens.map(() => 0), ...s.tokens.map(() => advantage)]),
    },
  };
}

beforeAll(async () => {
  server = await startTestServer();
  api = http(server.url, 'rl-datums-test');
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const run = (await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 8, seed: 5 })).body.run;
  trainer = new URL(run.base_url).pathname;
  sampler = new URL(run.sampler.base_url).pathname;
  // One step first, so the weights are not the base model's alone; then publish them and sample from them.
  const sft = TICKETS.slice(0, 2).map(([t, l]) => {
    const d = datum(tok, t, l);
    return wireDatum(d.tokens, d.targetTokens!);
  });
  await api.op(trainer, 'forward_backward', { data: sft, loss_fn: 'cross_entropy' });
  await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-2 } });
  await api.op(trainer, 'save_weights_for_sampler', { name: 'rollout' });
  const res = await api.call(
    'POST',
    `${sampler}/sample`,
    { prompt: { chunks: [{ type: 'encoded_text', tokens: promptTokens }] }, num_samples: 4, sampling_params: { max_tokens: 8, temperature: 1, seed: 11 } },
    { 'x-min-policy-version': '1' },
  );
  expect(res.status).toBe(200);
  samples = res.body.sequences;
  expect(samples.every((s) => s.tokens.length > 1)).toBe(true);
}, 120_000);
afterAll(() => server?.close());

describe("the RL guide's datums (no target_tokens): position k scores token k", () => {
  it('shows no divergence from the sampler that drew them, for every policy loss', async () => {
    const data = samples.map((s, i) => guideDatum(s, [1, -1, 0.5, -0.5][i]!));
    for (const loss of POLICY_LOSSES) {
      const r = await api.op(trainer, 'forward', { data, loss_fn: loss });
      expect(Math.abs(r.metrics.ratio_mean - 1), loss).toBeLessThan(1e-4);
      expect(r.metrics.kl_sampler_trainer, loss).toBeLessThan(1e-4);
      expect(r.metrics.active_tokens).toBe(samples.reduce((n, s) => n + s.tokens.length, 0));
    }
    const fb = await api.op(trainer, 'forward_backward', { data, loss_fn: 'ppo' });
    expect(Math.abs(fb.metrics.ratio_mean - 1)).toBeLessThan(1e-4);
    expect(fb.metrics.kl_sampler_trainer).toBeLessThan(1e-4);
    // The logprobs come back in the same alignment: the sampler's at each completion token's own index, 0.0 at position 0.
    fb.loss_fn_outputs.forEach((out: any, i: number) => {
      const lp: number[] = out.logprobs.data;
      expect(lp).toHaveLength(promptTokens.length + samples[i]!.tokens.length);
      expect(lp[0]).toBe(0);
      samples[i]!.logprobs.forEach((q, k) => {
        expect(Math.abs(lp[promptTokens.length + k]! - q)).toBeLessThan(1e-4);
      });
    });
  });

  it('is cross_entropy without target_tokens shifted by one: cross_entropy keeps next-token scoring', async () => {
    const tokens = [...promptTokens, ...samples[0]!.tokens];
    const plain = { model_input: { chunks: [{ type: 'encoded_text', tokens }] } };
    const nextToken = (await api.op(trainer, 'forward', { data: [plain], loss_fn: 'cross_entropy' })).loss_fn_outputs[0].logprobs.data;
    const guide = guideDatum(samples[0]!, 1);
    const tokenAligned = (await api.op(trainer, 'forward', { data: [guide], loss_fn: 'importance_sampling' })).loss_fn_outputs[0].logprobs.data;
    expect(nextToken.at(-1)).toBe(0);
    expect(tokenAligned[0]).toBe(0);
    for (let t = 0; t + 1 < tokens.length; t++) expect(Math.abs(tokenAligned[t + 1] - nextToken[t])).toBeLessThan(1e-5);
  });

  it("with explicit target_tokens keeps Tinker's convention: position k scores target_tokens[k] given inputs 0..k", async () => {
    const s = samples[1]!;
    const tokens = [...promptTokens, ...s.tokens.slice(0, -1)];
    const targets = [...promptTokens.slice(1), ...s.tokens];
    const pad = promptTokens.length - 1;
    const d = {
      model_input: { chunks: [{ type: 'encoded_text', tokens }] },
      loss_fn_inputs: {
        target_tokens: tensor(targets, 'int64'),
        logprobs: tensor([...Array(pad).fill(0), ...s.logprobs]),
        advantages: tensor([...Array(pad).fill(0), ...s.tokens.map(() => 1)]),
      },
    };
    const r = await api.op(trainer, 'forward', { data: [d], loss_fn: 'importance_sampling' });
    expect(Math.abs(r.metrics.ratio_mean - 1)).toBeLessThan(1e-4);
    expect(r.metrics.kl_sampler_trainer).toBeLessThan(1e-4);
    s.logprobs.forEach((q, k) => {
      expect(Math.abs(r.loss_fn_outputs[0].logprobs.data[pad + k] - q)).toBeLessThan(1e-4);
    });
  });

  it('refuses a non-zero advantage at position 0 with a 400 naming the field, the position and the fix', async () => {
    const bad = guideDatum(samples[0]!, 1);
    bad.loss_fn_inputs.advantages.data[0] = 0.5;
    for (const op of ['forward', 'forward_backward']) {
      const res = await api.call('POST', `${trainer}/${op}`, { data: [guideDatum(samples[1]!, 1), bad], loss_fn: 'ppo' });
      expect(res.status).toBe(400);
      expect(res.body.error.field).toBe('data[1].loss_fn_inputs.advantages');
      expect(res.body.error.message).toMatch(/advantages\[0\] is 0\.5.*position 0 scores nothing.*Set advantages\[0\].*to 0.*or send target_tokens/);
    }
    // cross_entropy reads no advantages, and target_tokens give position 0 a prediction: both fine.
    expect((await api.call('POST', `${trainer}/forward`, { data: [bad], loss_fn: 'cross_entropy' })).status).toBe(200);
  });
});

describe('loss_fn is optional', () => {
  it('defaults to cross_entropy on forward and forward_backward, as the SDK does', async () => {
    const d = wireDatum(promptTokens, [...promptTokens.slice(1), -100]);
    const named = await api.op(trainer, 'forward', { data: [d], loss_fn: 'cross_entropy' });
    const bare = await api.op(trainer, 'forward', { data: [d] });
    expect(bare.loss).toBe(named.loss);
    expect(bare.loss_fn_outputs[0].logprobs.data).toEqual(named.loss_fn_outputs[0].logprobs.data);
    const fb = await api.op(trainer, 'forward_backward', { data: [d] });
    expect(fb.loss).toBeCloseTo(named.loss, 5);
    expect(Object.keys(fb.metrics).sort()).toEqual(['active_tokens', 'loss']);
  });
});

describe('top_k_logprobs', () => {
  const k = 5;
  const active = (weights: number[]) => weights.map((w) => w !== 0);

  it('gives [L, k] token ids and logprobs at each active position, sentinels elsewhere, consistent with the target logprobs', async () => {
    const tokens = [...promptTokens, ...samples[0]!.tokens];
    // Half the positions weighted 0: only the others are active.
    const weights = tokens.map((_, t) => (t % 2 === 0 ? 1 : 0));
    const d = { model_input: { chunks: [{ type: 'encoded_text', tokens }] }, loss_fn_inputs: { weights: tensor(weights) } };
    for (const op of ['forward', 'forward_backward']) {
      const r = await api.op(trainer, op, { data: [d], top_k_logprobs: k });
      const out = r.loss_fn_outputs[0];
      expect(out.top_k_token_ids).toMatchObject({ dtype: 'int64', shape: [tokens.length, k] });
      expect(out.top_k_logprobs).toMatchObject({ dtype: 'float32', shape: [tokens.length, k] });
      const isActive = active(weights).map((a, t) => a && t + 1 < tokens.length);
      const top1: number[] = [];
      for (let t = 0; t < tokens.length; t++) {
        const ids = out.top_k_token_ids.data.slice(t * k, (t + 1) * k);
        const lps = out.top_k_logprobs.data.slice(t * k, (t + 1) * k);
        if (!isActive[t]) {
          expect(ids, `${op} position ${t}`).toEqual(Array(k).fill(0));
          expect(lps).toEqual(Array(k).fill(-99999));
          top1.push(-100);
          continue;
        }
        expect(new Set(ids).size).toBe(k);
        expect([...lps].sort((a, b) => b - a)).toEqual(lps);
        // The target's logprob is at most the most likely token's, and equal to its own entry when it is among them.
        const target = out.logprobs.data[t];
        expect(target).toBeLessThanOrEqual(lps[0] + 1e-6);
        const hit = ids.indexOf(tokens[t + 1]);
        if (hit >= 0) expect(Math.abs(lps[hit] - target)).toBeLessThan(1e-5);
        top1.push(ids[0]);
      }
      // The most likely token's logprob is the one reported when that token is the target.
      const asTarget = await api.op(trainer, 'forward', { data: [wireDatum(tokens, top1)] });
      top1.forEach((id, t) => {
        if (id !== -100) expect(Math.abs(asTarget.loss_fn_outputs[0].logprobs.data[t] - out.top_k_logprobs.data[t * k])).toBeLessThan(1e-5);
      });
    }
  });

  it("follows the guide's token alignment for a policy loss: position k's top tokens are the candidates for token k", async () => {
    const s = samples[2]!;
    for (const op of ['forward', 'forward_backward']) {
      const r = await api.op(trainer, op, { data: [guideDatum(s, 1)], loss_fn: 'importance_sampling', top_k_logprobs: 20 });
      const out = r.loss_fn_outputs[0];
      const L = promptTokens.length + s.tokens.length;
      expect(out.top_k_logprobs.shape).toEqual([L, 20]);
      // Prompt positions carry advantage 0: not active.
      expect(out.top_k_token_ids.data.slice(0, promptTokens.length * 20).every((id: number) => id === 0)).toBe(true);
      s.tokens.forEach((token, j) => {
        const t = promptTokens.length + j;
        const ids = out.top_k_token_ids.data.slice(t * 20, (t + 1) * 20);
        const lps = out.top_k_logprobs.data.slice(t * 20, (t + 1) * 20);
        expect(s.logprobs[j]!).toBeLessThanOrEqual(lps[0] + 1e-4);
        const hit = ids.indexOf(token);
        if (hit >= 0) expect(Math.abs(lps[hit] - s.logprobs[j]!)).toBeLessThan(1e-4);
      });
    }
  });

  it('leaves loss_fn_outputs as they were without it, and refuses values outside 0..20 naming the field', async () => {
    const d = wireDatum(promptTokens, [...promptTokens.slice(1), -100]);
    expect(Object.keys((await api.op(trainer, 'forward', { data: [d] })).loss_fn_outputs[0])).toEqual(['logprobs']);
    expect(Object.keys((await api.op(trainer, 'forward', { data: [d], top_k_logprobs: 0 })).loss_fn_outputs[0])).toEqual(['logprobs']);
    for (const [value, field, message] of [
      [21, 'top_k_logprobs', /0\.\.20/],
      [-1, 'top_k_logprobs', /0\.\.20/],
      [2.5, 'body.top_k_logprobs', /integer/],
    ] as const) {
      for (const op of ['forward', 'forward_backward']) {
        const res = await api.call('POST', `${trainer}/${op}`, { data: [d], top_k_logprobs: value });
        expect(res.status, `${op} ${value}`).toBe(400);
        expect(res.body.error.field).toBe(field);
        expect(res.body.error.message).toMatch(message);
      }
    }
  });
});
