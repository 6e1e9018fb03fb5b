import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { client, newRun, newSession, startTestServer, type Client } from './helpers.js';

let server: RunningServer;
let api: Client;
beforeEach(async () => {
  server = await startTestServer({ bodyLimit: 4096 });
  api = client(server);
});
afterEach(() => server.close());

describe('schema violations answer 400 with the field and what was expected', () => {
  it('covers each kind of violation', async () => {
    const session = await newSession(api);
    const base = { session_id: session, base_model: 'Qwen/Qwen3-8B' };
    const cases: [unknown, string, RegExp][] = [
      [{ base_model: 'Qwen/Qwen3-8B' }, 'body.session_id', /is required/],
      [{ ...base, lora_rank: 'sixteen' }, 'body.lora_rank', /must be integer \(got "sixteen"\)/],
      [{ ...base, lora_rank: 16.5 }, 'body.lora_rank', /must be integer/],
      [{ ...base, seed: 'x' }, 'body.seed', /must be integer or null/],
      [{ ...base, lora_rnak: 16 }, 'body.lora_rnak', /not a known field; allowed fields here: .*lora_rank/],
      [{ ...base, availability_model: 'cheap' }, 'body.availability_model', /must be one of "dedicated", "spot"/],
      [{ ...base, scale_down_delay_seconds: 0 }, 'body.scale_down_delay_seconds', /must be > 0/],
      [{ ...base, name: 'x'.repeat(256) }, 'body.name', /at most 255 characters/],
      [[base], 'body', /must be object/],
      ['"text"', 'body', /must be object/],
    ];
    for (const [body, field, message] of cases) {
      const res = await api.post('/v1/loops/runs', body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.error.type).toBe('invalid_request');
      expect(res.body.error.field, JSON.stringify(body)).toBe(field);
      expect(res.body.error.message, JSON.stringify(body)).toMatch(message);
    }
  });

  it('checks query strings and rejects unknown query parameters', async () => {
    const run = await newRun(api);
    const res = await api.get(`/v1/loops/checkpoints/x/files?page_size=lots`);
    expect(res.status).toBe(400);
    expect(res.body.error.field).toBe('query.page_size');
    const unknown = await api.get(`/v1/loops/runs?runid=${run.id}`);
    expect(unknown.status).toBe(400);
    expect(unknown.body.error.message).toContain('run_id');
  });

  it('answers a missing body on a route that needs one', async () => {
    const res = await api.post('/v1/loops/runs');
    expect(res.status).toBe(400);
    expect(res.body.error.field).toBe('body');
  });
});

describe('transport errors', () => {
  it('answers malformed JSON with 400', async () => {
    const res = await api.post('/v1/loops/runs', '{"session_id": ');
    expect(res.status).toBe(400);
    expect(res.body.error.message).toContain('not valid JSON');
  });

  it('answers bodies over the limit with 413', async () => {
    const res = await api.post('/v1/loops/runs', { session_id: 'x'.repeat(5000), base_model: 'Qwen/Qwen3-8B' });
    expect(res.status).toBe(413);
    expect(res.body.error).toMatchObject({ type: 'payload_too_large', limit_bytes: 4096 });
  });

  it('answers a non-JSON content type with 415', async () => {
    const res = await api.send('POST', '/v1/loops/runs', 'session_id=x', { 'content-type': 'application/x-www-form-urlencoded' });
    expect(res.status).toBe(415);
    expect(res.body.error.type).toBe('unsupported_media_type');
  });

  it('answers unknown routes with 404 naming the nearest route', async () => {
    const cases: [string, string, string][] = [
      ['GET', '/v1/loops/run/abc1234', 'GET /v1/loops/runs/{run_id}'],
      ['POST', '/v1/loops/session', 'POST /v1/loops/sessions'],
      ['GET', '/v1/loops/checkpoint', 'GET /v1/loops/checkpoints'],
      ['DELETE', '/v1/loops/runs/abc1234', 'GET /v1/loops/runs/{run_id}'],
    ];
    for (const [method, url, nearest] of cases) {
      const res = await api.send(method, url);
      expect(res.status).toBe(404);
      expect(res.body.error.type).toBe('route_not_found');
      expect(res.body.error.nearest_route, url).toBe(nearest);
    }
  });

  it('answers 404 for an unknown route that gets a JSON body, not a 400 about the body', async () => {
    const run = await newRun(api);
    const sampler = new URL(run.sampler.base_url).pathname;
    const cases: [string, unknown, string][] = [
      ['/v1/loops/checkpoints/publish', { checkpoint_ids: ['VqKXRGB'], model_name: 'm' }, 'POST /v1/loops/checkpoints/deploy'],
      [`${sampler}/v1/chat/completion`, { model: 'step-1', messages: [{ role: 'user', content: 'hi' }] }, 'POST /sampler/{sampler_id}/v1/completions'],
    ];
    for (const [url, body, nearest] of cases) {
      const res = await api.post(url, body);
      expect([res.status, res.body.error.type], url).toEqual([404, 'route_not_found']);
      expect(res.body.error.nearest_route, url).toBe(nearest);
    }
  });
});

describe('never a 500 for client input', () => {
  it('survives junk bodies, parameters and headers on every control-plane route', async () => {
    const doc = (await api.get('/openapi.json')).body;
    const junkBodies: unknown[] = [
      undefined,
      null,
      [],
      0,
      'null',
      '""',
      '[1,2',
      '{"__proto__": {"polluted": true}}',
      { a: { b: { c: [1, { d: null }] } } },
      { session_id: 7, base_model: ['x'] },
      { checkpoint_path: null },
      { name: '\u0000' },
      { trainer_accelerator_priority: [1] },
    ];
    const junkIds = ['x', '%00', '..%2F..%2Fetc', 'a'.repeat(300), '💥'];
    let requests = 0;
    for (const [template, methods] of Object.entries<any>(doc.paths)) {
      for (const method of Object.keys(methods)) {
        for (const id of junkIds) {
          const url = `${template.replace(/\{[^}]+\}/g, id)}?page_size=-1&limit=abc&scope=%FF`;
          for (const body of method === 'get' || method === 'delete' ? [undefined] : junkBodies) {
            const res = await api.send(method.toUpperCase(), url, body);
            requests++;
            expect(res.status, `${method} ${url} ${JSON.stringify(body)}`).toBeLessThan(500);
            expect(res.status).toBeGreaterThanOrEqual(200);
            // A deployed checkpoint's inference door answers its edge errors as Baseten's gateway does: {"error": "<message>"}.
            // GraphQL refuses a body that is not a GraphQL request with its own errors list.
            const message =
              url.startsWith('/model/') && typeof res.body.error === 'string'
                ? res.body.error
                : url.startsWith('/graphql') && Array.isArray(res.body.errors)
                  ? res.body.errors[0]?.message
                  : res.body.error?.message;
            if (res.status >= 400) expect(typeof message, `${method} ${url} ${JSON.stringify(body)} -> ${JSON.stringify(res.body)}`).toBe('string');
          }
        }
      }
    }
    expect(requests).toBeGreaterThan(300);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});

describe('numbers and sizes a client can send that once broke the server', () => {
  it('refuses a JSON number beyond float64 (1e400 reads as Infinity) on any route, naming where it is', async () => {
    const big = await startTestServer();
    try {
      const run = await newRun(client(big));
      const cases: [string, string, string][] = [
        ['/v1/loops/runs', `{"session_id":"x","base_model":"Qwen/Qwen3-8B","lora_rank":1e400}`, 'body.lora_rank'],
        [`/trainer/${run.id}/init_trainer_server`, '{"lora_rank":4,"lora_alpha":1e400}', 'body.lora_alpha'],
        [
          `/trainer/${run.id}/forward`,
          '{"data":[{"model_input":{"chunks":[{"type":"encoded_text","tokens":[1,2,3]}]},"loss_fn_inputs":{"weights":{"data":[1,-1e999,1],"dtype":"float32"}}}],"loss_fn":"cross_entropy"}',
          'body.data[0].loss_fn_inputs.weights.data[1]',
        ],
        [
          `/sampler/${run.sampler.id}/sample`,
          '{"prompt":{"chunks":[{"type":"encoded_text","tokens":[1]}]},"sampling_params":{"temperature":1e400}}',
          'body.sampling_params.temperature',
        ],
      ];
      for (const [url, payload, field] of cases) {
        const res = await big.app.inject({
          method: 'POST',
          url,
          headers: { authorization: `Bearer ${big.apiKey}`, 'content-type': 'application/json' },
          payload,
        });
        expect(res.statusCode, url).toBe(400);
        expect(res.json().error.field, url).toBe(field);
        expect(res.json().error.message, url).toMatch(/not a finite number/);
      }
    } finally {
      await big.close();
    }
  });

  it('answers 400, not 500, for a token list of 200,000 ids and for metrics at epochs no Date can show', async () => {
    const big = await startTestServer();
    try {
      const api2 = client(big);
      const run = await newRun(api2, { max_seq_len: 64 });
      const tokens = Array.from({ length: 200_000 }, (_, i) => i % 1000);
      const res = await api2.post(`/trainer/${run.id}/forward`, {
        data: [{ model_input: { chunks: [{ type: 'encoded_text', tokens }] } }],
        loss_fn: 'cross_entropy',
      });
      expect([res.status, res.body.error.field]).toEqual([400, 'data[0].model_input']);
      expect(res.body.error.message).toMatch(/200000 tokens; the run's max_seq_len is 64/);
      const deployment = run.deployment_id;
      for (const body of [
        { start_epoch_millis: 2 ** 70, end_epoch_millis: 2 ** 70 + 1 },
        { start_epoch_millis: 0, end_epoch_millis: 9e15 },
      ]) {
        const m = await api2.post(`/v1/loops/deployments/${deployment}/metrics`, body);
        expect(m.status, JSON.stringify(body)).toBe(400);
        expect(m.body.error.message).toMatch(/epoch milliseconds from 0 to 253402300799999/);
      }
    } finally {
      await big.close();
    }
  });
});

describe('answers that say what is really wrong', () => {
  it('a long id is an unknown id, a union names the branch meant, __proto__ is a name like any other, a body where none is taken is refused', async () => {
    const s = await startTestServer({ admin: true });
    try {
      const api2 = client(s);
      const run = await newRun(api2, { lora_rank: 4 });
      const longId = await api2.get(`/v1/loops/runs/${'r'.repeat(150)}`);
      expect([longId.status, longId.body.error.type]).toEqual([404, 'not_found']);

      // {scenario: ...} is the branch meant, not {name}: the error is inside it.
      const scenario = await fetch(`${s.url}/_mock/scenario`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ scenario: { settings: { cold_start_ms: 'slow' } } }),
      });
      const scenarioError = ((await scenario.json()) as any).error;
      expect(scenario.status).toBe(400);
      expect(scenarioError.field).toMatch(/^(body\.)?scenario\.settings\.cold_start_ms$/);
      // An array prompt is the token-id branch: it needs an item, it need not be a string.
      const completions = await api2.post(`/sampler/${run.sampler.id}/v1/completions`, { prompt: [] });
      expect([completions.status, completions.body.error.field]).toEqual([400, 'body.prompt']);
      expect(completions.body.error.message).toMatch(/must have at least 1 item/);

      const proto = await s.app.inject({
        method: 'POST',
        url: `/trainer/${run.id}/forward`,
        headers: { authorization: `Bearer ${s.apiKey}`, 'content-type': 'application/json' },
        payload:
          '{"data":[{"model_input":{"chunks":[{"type":"encoded_text","tokens":[1,2]}]},"loss_fn_inputs":{"__proto__":{"data":[1,1],"dtype":"float32"}}}],"loss_fn":"cross_entropy"}',
      });
      expect(proto.statusCode).toBe(400);
      expect(proto.json().error.message).toMatch(/__proto__ is not an input of Loops losses/);

      const withBody = await api2.post(`/v1/loops/runs/${run.id}/deactivate`, { force: true });
      expect([withBody.status, withBody.body.error.field]).toEqual([400, 'body']);
      expect(withBody.body.error.message).toMatch(/takes no body/);
      expect((await api2.post(`/v1/loops/runs/${run.id}/deactivate`, {})).status).toBe(200);
    } finally {
      await s.close();
    }
  });
});
