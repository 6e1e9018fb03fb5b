import { afterEach, describe, expect, it } from 'vitest';
import { STOP_MAX_CHARS, STOP_MAX_STRINGS } from '../../models/sampling.js';
import type { RunningServer } from '../index.js';
import { deployTrainedCheckpoint } from './deployed-checkpoint.js';
import { client, newRun, startTestServer } from './helpers.js';

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

// Issue 31 item 3: every generated token is matched against each stop string, so a request's stop list is
// bounded (200,000 strings held other clients up for half a minute): a 400 naming the limit.
describe('stop strings are bounded', () => {
  const strings = (n: number, length = 3) => Array.from({ length: n }, (_, i) => `${'s'.repeat(length - 1)}${i}`);

  it('on the sampler: at most STOP_MAX_STRINGS strings of at most STOP_MAX_CHARS characters', async () => {
    server = await startTestServer();
    const api = client(server);
    const run = await newRun(api);
    const sampler = new URL(run.sampler.base_url).pathname;
    const body = (stop: unknown) => ({
      prompt: { chunks: [{ type: 'encoded_text', tokens: [9707, 11, 1879] }] },
      num_samples: 1,
      sampling_params: { max_tokens: 4, temperature: 0, stop },
    });
    expect((await api.post(`${sampler}/sample`, body(strings(STOP_MAX_STRINGS)))).status).toBe(200);
    for (const stop of [strings(STOP_MAX_STRINGS + 1), strings(200_000), ['x'.repeat(STOP_MAX_CHARS + 1)]]) {
      const res = await api.post(`${sampler}/sample`, body(stop));
      expect(res.status).toBe(400);
      expect(res.body.error.field).toMatch(/^body\.sampling_params\.stop/);
      expect(res.body.error.message).toMatch(new RegExp(`at most (${STOP_MAX_STRINGS} items|${STOP_MAX_CHARS} characters)`));
    }
    const completions = await api.post(`${sampler}/v1/completions`, { prompt: 'Hello', max_tokens: 4, stop: strings(STOP_MAX_STRINGS + 1) });
    expect([completions.status, completions.body.error.field]).toEqual([400, 'body.stop']);
  });

  it("on a deployed checkpoint: the same bounds, in OpenAI's error shape", async () => {
    server = await startTestServer();
    const d = await deployTrainedCheckpoint(server, 'Qwen/Qwen3.5-2B', 4);
    const call = async (stop: unknown) => {
      const res = await server!.app.inject({
        method: 'POST',
        url: `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`,
        headers: { authorization: `Bearer ${server!.apiKey}`, 'content-type': 'application/json' },
        payload: JSON.stringify({ model: d.model, messages: d.cases[0]!.messages, max_tokens: 4, temperature: 0, stop }),
      });
      return { status: res.statusCode, body: res.json() };
    };
    expect((await call(strings(STOP_MAX_STRINGS))).status).toBe(200);
    const many = await call(strings(STOP_MAX_STRINGS + 1));
    expect([many.status, many.body.error.param]).toEqual([400, 'stop']);
    expect(many.body.error.message).toMatch(new RegExp(`at most ${STOP_MAX_STRINGS}`));
    const long = await call(['x'.repeat(STOP_MAX_CHARS + 1)]);
    expect([long.status, long.body.error.param]).toEqual([400, 'stop']);
  }, 120_000);
});
