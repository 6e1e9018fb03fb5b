import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { datum, prompt, TICKETS } from '../../models/data/support-tickets.js';
import { ManualClock, type RunningServer, type StartOptions } from '../index.js';
import { appPathOf } from '../proxy/baseten-hosts.js';
import { startTestServer } from './helpers.js';

const MODEL = 'Qwen/Qwen3.5-2B';
const engines = new EnginePool();
const tok = engines.tokenizers.get(MODEL);
let server: RunningServer;
afterEach(() => server?.close());

function api(base: string, key = 'inference-test') {
  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let parsed: any = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      /* an event stream */
    }
    return { status: res.status, body: parsed, headers: res.headers };
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
  /** A run trained one step on two support tickets, saved as sampler checkpoint `name` (and a trainer checkpoint). */
  const trained = async (name = 'step-1') => {
    const session = (await call('POST', '/v1/loops/sessions')).body.session.id;
    const run = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 8, seed: 1 })).body.run;
    const trainer = new URL(run.base_url).pathname;
    const data = TICKETS.slice(0, 2).map(([t, l]) => {
      const d = datum(tok, t, l);
      return {
        model_input: { chunks: [{ type: 'encoded_text', tokens: d.tokens }] },
        loss_fn_inputs: { target_tokens: { data: d.targetTokens, dtype: 'int64' } },
      };
    });
    await op(trainer, 'forward_backward', { data, loss_fn: 'cross_entropy' });
    await op(trainer, 'optim_step', { adam_params: { learning_rate: 5e-2 } });
    await op(trainer, 'save_weights_for_sampler', { name });
    await op(trainer, 'save_state', { name });
    const listed = (await call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
    return { run, sampler: listed.find((c: any) => c.target === 'sampler'), trainerCheckpoint: listed.find((c: any) => c.target === 'trainer') };
  };
  return { call, trained };
}

async function start(options: StartOptions = {}) {
  server = await startTestServer({ engines, ...options });
  return api(server.url);
}

const ticketMessages = [{ role: 'user', content: prompt(TICKETS[0]![0]) }];

describe('deploying a checkpoint to inference', () => {
  it("serves the adapter through the chat template: greedy equals the sampler's greedy sample of the same prompt ids", async () => {
    const c = await start();
    const { run, sampler } = await c.trained();
    const deployed = await c.call('POST', '/v1/loops/checkpoints/deploy', {
      checkpoint_ids: [sampler.id],
      model_name: 'tickets',
      instance_type_id: 'H100:1x',
      hf_secret_name: 'hf_access_token',
    });
    expect(deployed.status).toBe(200);
    expect(deployed.body.model_id).toMatch(/^[a-z0-9]{8}$/);
    expect(deployed.body.deployment_id).toMatch(/^[a-z0-9]{7}$/);
    expect(deployed.body.checkpoints).toEqual([{ id: sampler.id, checkpoint_id: 'step-1', model: 'step-1' }]);
    const base = new URL(deployed.body.inference.base_url).pathname;
    expect(base).toBe(`/model/${deployed.body.model_id}/deployment/${deployed.body.deployment_id}/sync/v1`);

    const chat = await c.call('POST', `${base}/chat/completions`, { model: 'step-1', messages: ticketMessages, max_tokens: 8, temperature: 0 });
    expect(chat.status, JSON.stringify(chat.body)).toBe(200);
    expect(chat.body).toMatchObject({ object: 'chat.completion', model: 'step-1', choices: [{ index: 0, message: { role: 'assistant' } }] });

    // The same prompt ids, rendered as transformers would, through the run's own sampler.
    const rendered = server.core.inference.template(MODEL).render(ticketMessages, { addGenerationPrompt: true });
    const ids = tok.encode(rendered);
    expect(chat.body.usage.prompt_tokens).toBe(ids.length);
    const samplerPath = new URL(run.sampler.base_url).pathname;
    const sampled = await c.call('POST', `${samplerPath}/sample`, {
      prompt: { chunks: [{ type: 'encoded_text', tokens: ids }] },
      num_samples: 1,
      sampling_params: { max_tokens: 8, temperature: 0 },
    });
    const seq = sampled.body.sequences[0];
    const eos = engines.sampleCodec(MODEL).eosTokenIds;
    const answerTokens = seq.stop_reason === 'stop' && eos.includes(seq.tokens.at(-1)) ? seq.tokens.slice(0, -1) : seq.tokens;
    expect(chat.body.choices[0].message.content).toBe(tok.decode(answerTokens));
    expect(chat.body.usage.completion_tokens).toBe(answerTokens.length);
    expect(chat.body.choices[0].finish_reason).toBe(seq.stop_reason);

    // Streaming: vLLM's chunks, the same text, usage last when asked, then [DONE].
    const streamed = await c.call('POST', `${base}/chat/completions`, {
      model: 'step-1',
      messages: ticketMessages,
      max_tokens: 8,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(streamed.headers.get('content-type')).toMatch(/^text\/event-stream/);
    const events = (streamed.body as string)
      .split('\n\n')
      .filter(Boolean)
      .map((e) => e.replace(/^data: /, ''));
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks[0].choices[0].delta.role).toBe('assistant');
    expect(chunks.flatMap((k) => k.choices.map((ch: any) => ch.delta.content ?? '')).join('')).toBe(chat.body.choices[0].message.content);
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: chat.body.usage });

    // /v1/models: each checkpoint name, then the base model; /v1/completions beside it.
    const models = await c.call('GET', `${base}/models`);
    expect(models.body.data.map((m: any) => m.id)).toEqual(['step-1', MODEL]);
    const completion = await c.call('POST', `${base}/completions`, { model: 'step-1', prompt: ids, max_tokens: 8, temperature: 0 });
    expect(completion.body.choices[0].text).toBe(chat.body.choices[0].message.content);

    // The model shows in Baseten's model API, and its deployment on the generic route.
    expect((await c.call('GET', '/v1/models')).body.models.map((m: any) => m.id)).toContain(deployed.body.model_id);
    expect((await c.call('GET', `/v1/models/${deployed.body.model_id}`)).body).toMatchObject({
      id: deployed.body.model_id,
      name: 'tickets',
      production_deployment_id: deployed.body.deployment_id,
    });
    const dep = await c.call('GET', `/v1/models/${deployed.body.model_id}/deployments/${deployed.body.deployment_id}`);
    expect(dep.body).toMatchObject({ id: deployed.body.deployment_id, status: 'ACTIVE', is_development: false });
    // The sampler's own deployment still answers on the same route.
    expect((await c.call('GET', `/v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}`)).body.status).toBe('ACTIVE');

    const source = await c.call('GET', `/v1/loops/checkpoints/${sampler.id}/source`);
    expect(source.body).toMatchObject({
      id: sampler.id,
      checkpoint_id: 'step-1',
      source_type: 's3',
      checkpoint_path: `bt://loops:${run.id}/sampler_weights/step-1`,
    });
  }, 120_000);

  it('walks BUILDING, DEPLOYING, LOADING_MODEL over the cold start, answers 503 until ACTIVE and 404 after deactivation', async () => {
    const clock = new ManualClock();
    const c = await start({ clock, modelColdStartMs: 3000 });
    const { sampler } = await c.trained();
    const d = (await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id] })).body;
    const route = `/v1/models/${d.model_id}/deployments/${d.deployment_id}`;
    const chatPath = `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`;
    const seen: string[] = [];
    for (let i = 0; i < 4; i++) {
      seen.push((await c.call('GET', route)).body.status);
      if (i < 3) {
        const early = await c.call('POST', chatPath, { model: 'step-1', messages: ticketMessages, max_tokens: 2 });
        expect(early.status).toBe(503);
        expect(typeof early.body.error).toBe('string');
      }
      clock.advance(1000);
    }
    expect(seen).toEqual(['BUILDING', 'DEPLOYING', 'LOADING_MODEL', 'ACTIVE']);
    expect((await c.call('POST', chatPath, { model: 'step-1', messages: ticketMessages, max_tokens: 2 })).status).toBe(200);
    // Its log lines on both log routes: the deploy and the request it served.
    for (const logs of [await c.call('GET', `${route}/logs`), await c.call('POST', `${route}/logs`, {})]) {
      const messages = logs.body.logs.map((l: any) => l.message);
      expect(messages.some((m: string) => m.startsWith('Deploying step-1'))).toBe(true);
      expect(messages.some((m: string) => /^step-1: \d+ prompt tokens, \d+ completion tokens$/.test(m))).toBe(true);
    }
    expect((await c.call('POST', `${route}/deactivate`)).body).toEqual({ success: true });
    expect((await c.call('GET', route)).body.status).toBe('INACTIVE');
    const stopped = await c.call('POST', chatPath, { model: 'step-1', messages: ticketMessages, max_tokens: 2 });
    expect(stopped.status).toBe(404);
    expect(stopped.body.error).toMatch(/deactivated/);
    expect((await c.call('DELETE', `/v1/models/${d.model_id}`)).body).toEqual({ id: d.model_id, deleted: true });
    expect((await c.call('GET', `/v1/models/${d.model_id}`)).status).toBe(404);
  }, 120_000);

  it("refuses trainer checkpoints, unknown ids and other organisations' checkpoints, and answers bad inference input in OpenAI's shape", async () => {
    const c = await start({
      apiKeys: [
        { key: 'inference-test', org: 'org-a' },
        { key: 'other-org', org: 'org-b' },
      ] as never,
    });
    const { sampler, trainerCheckpoint } = await c.trained();
    const trainer = await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [trainerCheckpoint.id] });
    expect(trainer.status).toBe(400);
    expect(trainer.body.error).toMatchObject({ field: 'checkpoint_ids[0]' });
    expect(trainer.body.error.message).toMatch(/trainer checkpoint/);
    expect((await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: ['NoSuchId'] })).status).toBe(404);
    const other = api(server.url, 'other-org');
    expect((await other.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id] })).status).toBe(404);
    expect((await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [] })).status).toBe(400);
    const instance = await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id], instance_type_id: 'TPU:1x' });
    expect([instance.status, instance.body.error.field]).toEqual([400, 'instance_type_id']);

    const d = (await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id] })).body;
    const base = `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1`;
    const unknown = await c.call('POST', `${base}/chat/completions`, { model: 'step-9', messages: ticketMessages });
    expect(unknown.status).toBe(404);
    expect(unknown.body.error).toMatchObject({ type: 'NotFoundError', param: 'model', code: 404 });
    for (const [body, param] of [
      [{ model: 'step-1', messages: [] }, 'messages'],
      [{ model: 'step-1', messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role'],
      [{ model: 'step-1', messages: ticketMessages, temperature: 5 }, 'temperature'],
      [{ model: 'step-1', messages: ticketMessages, max_tokens: 10_000_000 }, 'max_tokens'],
      [{ model: 'step-1', messages: ticketMessages, top_logprobs: 3 }, 'top_logprobs'],
      [{ model: 'step-1', messages: ticketMessages, stream_options: { include_usage: true } }, 'stream_options'],
    ] as const) {
      const r = await c.call('POST', `${base}/chat/completions`, body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.error).toMatchObject({ type: 'BadRequestError', param, code: 400 });
    }
    // Another organisation's key does not reach the deployment.
    expect((await other.call('POST', `${base}/chat/completions`, { model: 'step-1', messages: ticketMessages })).status).toBe(404);
  }, 120_000);

  it('n, seed, stop and logprobs as vLLM takes them', async () => {
    const c = await start();
    const { sampler } = await c.trained();
    const d = (await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id] })).body;
    const base = `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1`;
    const body = { model: 'step-1', messages: ticketMessages, max_tokens: 6, temperature: 1, seed: 7, n: 2, logprobs: true, top_logprobs: 2 };
    const a = await c.call('POST', `${base}/chat/completions`, body);
    const b = await c.call('POST', `${base}/chat/completions`, body);
    expect(a.body.choices).toHaveLength(2);
    expect(a.body.choices.map((x: any) => x.message.content)).toEqual(b.body.choices.map((x: any) => x.message.content));
    const lp = a.body.choices[0].logprobs.content;
    expect(lp.length).toBeGreaterThan(0);
    expect(lp[0].top_logprobs).toHaveLength(2);
    expect(lp.map((t: any) => t.token).join('')).toBe(a.body.choices[0].message.content);
    // tools and chat_template_kwargs reach the template: the prompt is what it renders with them.
    const tools = [{ type: 'function', function: { name: 'lookup_account', description: 'Find an account', parameters: { type: 'object', properties: {} } } }];
    const withTools = await c.call('POST', `${base}/chat/completions`, {
      model: 'step-1',
      messages: ticketMessages,
      max_tokens: 1,
      tools,
      chat_template_kwargs: { enable_thinking: false },
    });
    const rendered = server.core.inference.template(MODEL).render(ticketMessages, { addGenerationPrompt: true, tools, kwargs: { enable_thinking: false } });
    expect(rendered).toContain('lookup_account');
    expect(withTools.body.usage.prompt_tokens).toBe(tok.encode(rendered).length);
    const plain = await c.call('POST', `${base}/chat/completions`, { model: 'step-1', messages: ticketMessages, max_tokens: 1 });
    expect(withTools.body.usage.prompt_tokens).toBeGreaterThan(plain.body.usage.prompt_tokens);
    // A stop string ends the answer before it.
    const greedy = await c.call('POST', `${base}/chat/completions`, { model: 'step-1', messages: ticketMessages, max_tokens: 6, temperature: 0 });
    const text: string = greedy.body.choices[0].message.content;
    if (text.length >= 2) {
      const stop = text.slice(1, 2);
      const stopped = await c.call('POST', `${base}/chat/completions`, {
        model: 'step-1',
        messages: ticketMessages,
        max_tokens: 6,
        temperature: 0,
        stop: [stop],
      });
      expect(stopped.body.choices[0].message.content).toBe(text.slice(0, text.indexOf(stop)));
      expect(stopped.body.choices[0].finish_reason).toBe('stop');
    }
  }, 120_000);

  it('keeps deployed checkpoints across a restart with --data-dir, serving the same greedy answer', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'deployed-'));
    try {
      let c = await start({ dataDir });
      const { sampler } = await c.trained();
      const d = (await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id] })).body;
      const chatPath = `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`;
      const body = { model: 'step-1', messages: ticketMessages, max_tokens: 6, temperature: 0 };
      const before = (await c.call('POST', chatPath, body)).body.choices[0].message.content;
      await server.close();
      c = await start({ dataDir });
      expect((await c.call('GET', `/v1/models/${d.model_id}/deployments/${d.deployment_id}`)).body.status).toBe('ACTIVE');
      expect((await c.call('POST', chatPath, body)).body.choices[0].message.content).toBe(before);
    } finally {
      await server?.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 120_000);

  it('proxy mode routes model-<id>.api.baseten.co, by deployment and by the production environment, to the deployment', async () => {
    const c = await start();
    const { sampler } = await c.trained();
    const d = (await c.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [sampler.id] })).body;
    const host = `model-${d.model_id}.api.baseten.co`;
    const direct = `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`;
    expect(appPathOf(server.core, host, `/deployment/${d.deployment_id}/sync/v1/chat/completions`)).toBe(direct);
    expect(appPathOf(server.core, host, '/environments/production/sync/v1/chat/completions')).toBe(direct);
    expect(appPathOf(server.core, host, '/deployment/zzzzzzz/sync/v1/chat/completions')).toBeUndefined();
  }, 120_000);
});
