import type { IncomingMessage, ServerResponse } from 'node:http';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { cutAtStop, EnginePool, type ModelEngine } from '../../models/index.js';
import { datum, prompt, TICKETS } from '../../models/data/support-tickets.js';
import type { RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

/**
 * Streaming on a deployed checkpoint is token by token: chunks leave while the engine is still drawing,
 * add up to the whole answer, never carry a stop string, and a client going away stops the generation.
 */
const MODEL = 'Qwen/Qwen3.5-2B';
const engines = new EnginePool();
const engine: ModelEngine = engines.get(MODEL);
const tok = engines.tokenizers.get(MODEL);
const ticketMessages = [{ role: 'user', content: prompt(TICKETS[0]![0]) }];
let server: RunningServer;
let base: string;

const headers = () => ({ authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' });
const post = async (path: string, body: unknown) =>
  (await fetch(`${server.url}${base}${path}`, { method: 'POST', headers: headers(), body: JSON.stringify(body) })).json() as Promise<any>;

/** The events of a server-sent event stream, as they arrive. */
async function* events(res: Response): AsyncGenerator<any> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    for (let at = buffer.indexOf('\n\n'); at >= 0; at = buffer.indexOf('\n\n')) {
      const data = buffer.slice(0, at).replace(/^data: /, '');
      buffer = buffer.slice(at + 2);
      yield data === '[DONE]' ? data : JSON.parse(data);
    }
  }
}

const streamOf = (path: string, body: unknown, signal?: AbortSignal) =>
  fetch(`${server.url}${base}${path}`, { method: 'POST', headers: headers(), body: JSON.stringify({ ...(body as object), stream: true }), signal });

/** Holds the engine's decode step number `at` (1-based) until `release` is called; counts the steps. */
function holdStep(at: number) {
  const original = engine.decodeRows;
  let steps = 0;
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  let reached!: () => void;
  const reachedP = new Promise<void>((r) => {
    reached = r;
  });
  engine.decodeRows = async (...args) => {
    if (++steps === at) {
      reached();
      await released;
    }
    return original.apply(engine, args);
  };
  return {
    release,
    reached: reachedP,
    steps: () => steps,
    restore: () => {
      engine.decodeRows = original;
      release();
    },
  };
}

beforeAll(async () => {
  server = await startTestServer({ engines });
  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${server.url}${path}`, { method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body) });
    return res.json() as Promise<any>;
  };
  const session = (await call('POST', '/v1/loops/sessions', {})).session.id;
  const run = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 8, seed: 1 })).run;
  const trainer = new URL(run.base_url).pathname;
  const op = async (name: string, body: unknown) => {
    const { operation_id } = await call('POST', `${trainer}/${name}`, body);
    for (;;) {
      const res = await fetch(`${server.url}${trainer}/operations/${operation_id}`, { headers: headers() });
      if (res.status === 408) continue;
      return res.json();
    }
  };
  const data = TICKETS.slice(0, 2).map(([t, l]) => {
    const d = datum(tok, t, l);
    return {
      model_input: { chunks: [{ type: 'encoded_text', tokens: d.tokens }] },
      loss_fn_inputs: { target_tokens: { data: d.targetTokens, dtype: 'int64' } },
    };
  });
  await op('forward_backward', { data, loss_fn: 'cross_entropy' });
  await op('optim_step', { adam_params: { learning_rate: 5e-2 } });
  await op('save_weights_for_sampler', { name: 'step-1' });
  const checkpoint = (await call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).checkpoints.find((c: any) => c.target === 'sampler');
  const d = await call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [checkpoint.id] });
  base = `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1`;
}, 120_000);
afterAll(() => server?.close());

describe('streamed inference, token by token', () => {
  it('sends the first text while the engine is held before the last token, and the chunks add up to the whole answer', async () => {
    const body = { model: 'step-1', messages: ticketMessages, max_tokens: 8, temperature: 0 };
    const whole = await post('/chat/completions', body);
    const text: string = whole.choices[0].message.content;
    // The step drawing the last token: token 1 comes from the prefill, token k from decode step k-1.
    const drawn = whole.usage.completion_tokens + (whole.choices[0].finish_reason === 'stop' ? 1 : 0);
    expect(drawn, 'the greedy answer needs two tokens or more').toBeGreaterThanOrEqual(2);
    expect(text.length).toBeGreaterThan(0);
    const hold = holdStep(drawn - 1);
    const got: any[] = [];
    try {
      const stream = events(await streamOf('/chat/completions', { ...body, stream_options: { include_usage: true } }));
      // Read until the first text while the step drawing the last token is held: text arrives before that
      // token exists (a stream written only once the answer is whole would never get here).
      for (let e = await stream.next(); !e.done; e = await stream.next()) {
        got.push(e.value);
        if (e.value.choices?.[0]?.delta?.content) break;
      }
      expect(hold.steps()).toBeLessThanOrEqual(drawn - 1);
      hold.release();
      for await (const e of stream) got.push(e);
    } finally {
      hold.restore();
    }
    expect(got[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    expect(got.at(-1)).toBe('[DONE]');
    const chunks = got.slice(0, -1);
    expect(chunks.flatMap((c) => c.choices.map((ch: any) => ch.delta.content)).join('')).toBe(text);
    expect(chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].finish_reason)).toEqual([whole.choices[0].finish_reason]);
    expect(chunks.at(-1)).toEqual({
      id: expect.any(String),
      object: 'chat.completion.chunk',
      created: expect.any(Number),
      model: 'step-1',
      choices: [],
      usage: whole.usage,
    });
  }, 60_000);

  it("completions with n and a seed stream each choice's own text, equal to the whole answer's, with logprobs", async () => {
    const ids = tok.encode('Ticket: my invoice is wrong. Category:');
    const body = { model: 'step-1', prompt: ids, max_tokens: 6, temperature: 1, seed: 3, n: 2, logprobs: 1 };
    const whole = await post('/completions', body);
    const got: any[] = [];
    for await (const e of events(await streamOf('/completions', body))) got.push(e);
    expect(got.at(-1)).toBe('[DONE]');
    for (const index of [0, 1]) {
      const mine = got.slice(0, -1).flatMap((c) => c.choices.filter((ch: any) => ch.index === index));
      expect(mine.map((ch: any) => ch.text).join('')).toBe(whole.choices[index].text);
      expect(mine.flatMap((ch: any) => ch.logprobs.token_logprobs)).toEqual(whole.choices[index].logprobs.token_logprobs);
      expect(mine.at(-1).finish_reason).toBe(whole.choices[index].finish_reason);
    }
  }, 60_000);

  it('never sends a stop string split across tokens, nor any of its start', async () => {
    const body = { model: 'step-1', messages: ticketMessages, max_tokens: 8, temperature: 0, logprobs: true };
    const whole = await post('/chat/completions', body);
    const pieces: string[] = whole.choices[0].logprobs.content.map((t: any) => t.token);
    // A stop string made of the end of one token's text and the start of the next one's.
    const k = pieces.findIndex((p, i) => p.length > 0 && (pieces[i + 1]?.length ?? 0) > 0);
    expect(k, `two neighbouring tokens with text in ${JSON.stringify(pieces)}`).toBeGreaterThanOrEqual(0);
    const stop = pieces[k]!.slice(-1) + pieces[k + 1]!.slice(0, 1);
    const expected = cutAtStop(whole.choices[0].message.content, [stop])!;
    const stopped = await post('/chat/completions', { ...body, stop: [stop] });
    expect(stopped.choices[0].message.content).toBe(expected);
    const sent: string[] = [];
    for await (const e of events(await streamOf('/chat/completions', { ...body, stop: [stop] }))) if (e !== '[DONE]') sent.push(e.choices[0].delta.content);
    expect(sent.join('')).toBe(expected);
    expect(sent.join('')).not.toContain(stop);
  }, 60_000);

  it('a failure after the headers went out is an error event, then [DONE]', async () => {
    const original = engine.decodeRows;
    engine.decodeRows = () => Promise.reject(new Error('the graph run failed'));
    const got: any[] = [];
    try {
      for await (const e of events(await streamOf('/chat/completions', { model: 'step-1', messages: ticketMessages, max_tokens: 4, temperature: 0 })))
        got.push(e);
    } finally {
      engine.decodeRows = original;
    }
    expect(got[0].choices[0].delta.role).toBe('assistant');
    expect(got.at(-2)).toEqual({ error: { message: 'the graph run failed', type: 'InternalServerError', param: null, code: 500 } });
    expect(got.at(-1)).toBe('[DONE]');
  }, 60_000);

  it('a client that goes away mid-stream ends the generation: no decode step runs for nobody', async () => {
    const ids = tok.encode('Once upon a time');
    const maxTokens = 200;
    const body = { model: MODEL, prompt: ids, max_tokens: maxTokens, temperature: 0 };
    const whole = await post('/completions', body);
    expect(whole.usage.completion_tokens, 'the base model runs to max_tokens').toBe(maxTokens);
    // The engine is held at step 3 until the server has seen the connection close.
    const hold = holdStep(3);
    const onRequest = (_req: IncomingMessage, res: ServerResponse) => res.once('close', () => setImmediate(hold.release));
    server.app.server.on('request', onRequest);
    const client = new AbortController();
    try {
      const stream = events(await streamOf('/completions', body, client.signal));
      await stream.next();
      await hold.reached;
      client.abort();
      await vi.waitFor(
        async () => {
          const logs = (await (
            await fetch(`${server.url}/v1/models/${base.split('/')[2]}/deployments/${base.split('/')[4]}/logs`, { headers: headers() })
          ).json()) as any;
          const closed = logs.logs.map((l: any) => l.message).find((m: string) => m.includes('stream closed by the client'));
          expect(closed).toBeDefined();
          const [, tokens] = /after (\d+) completion tokens/.exec(closed)!;
          expect(Number(tokens)).toBeLessThan(maxTokens);
        },
        { timeout: 20_000, interval: 50 },
      );
      // The step held when the client left was the last one started.
      expect(hold.steps()).toBeLessThanOrEqual(3);
    } finally {
      server.app.server.off('request', onRequest);
      hold.restore();
    }
    // The engine serves the next request in full.
    expect((await post('/completions', { ...body, max_tokens: 4 })).usage.completion_tokens).toBe(4);
  }, 60_000);
});
