import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { deployTrainedCheckpoint } from './deployed-checkpoint.js';
import { startTestServer } from './helpers.js';

const MODEL = 'Qwen/Qwen3.5-2B';
let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

// Issue 27: a deployed checkpoint's start can be held by the existing progress control, as operations are:
// a rule naming match.op deploy_checkpoint keeps it in LOADING_MODEL past its cold start until released.
describe('progress rules hold a deployed checkpoint in LOADING_MODEL', () => {
  const inject = async (method: string, url: string, body?: unknown) => {
    const res = await server!.app.inject({
      method: method as 'GET',
      url,
      headers: { authorization: `Bearer ${server!.apiKey}`, 'x-loops-mock-admin': '1', ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      payload: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.statusCode, body: res.json() };
  };
  const statusOf = async (mid: string, did: string) => (await inject('GET', `/v1/models/${mid}/deployments/${did}`)).body.status;

  it('manual: held until POST /_mock/deployments/{id}/release; calls meanwhile are 503', async () => {
    server = await startTestServer({ admin: true });
    expect((await inject('POST', '/_mock/progress', { match: { op: 'deploy_checkpoint' }, mode: 'manual', times: 1 })).status).toBe(200);
    const d = await deployTrainedCheckpoint(server, MODEL, 4);
    expect(await statusOf(d.model_id, d.deployment_id)).toBe('LOADING_MODEL');
    const held = (await inject('GET', '/_mock/deployments')).body.held;
    expect(held).toMatchObject([{ model_id: d.model_id, deployment_id: d.deployment_id, status: 'LOADING_MODEL', mode: 'manual' }]);
    const early = await inject('POST', `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`, {
      model: d.model,
      messages: d.cases[0]!.messages,
      max_tokens: 4,
      temperature: 0,
    });
    expect(early.status).toBe(503);
    const released = await inject('POST', `/_mock/deployments/${d.deployment_id}/release`);
    expect(released.body).toEqual({ model_id: d.model_id, deployment_id: d.deployment_id, status: 'ACTIVE' });
    expect(await statusOf(d.model_id, d.deployment_id)).toBe('ACTIVE');
    const answered = await inject('POST', `/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`, {
      model: d.model,
      messages: d.cases[0]!.messages,
      max_tokens: 4,
      temperature: 0,
    });
    expect(answered.status, JSON.stringify(answered.body)).toBe(200);
    expect(answered.body.choices[0].message.content).toBe(d.cases[0]!.expected);
    // Nothing left to release: 409 naming the deployment; an unknown one is 404.
    const again = await inject('POST', `/_mock/deployments/${d.deployment_id}/release`);
    expect([again.status, again.body.error.field]).toEqual([409, 'deployment_id']);
    expect((await inject('POST', '/_mock/deployments/nosuchd/release')).status).toBe(404);
  }, 120_000);

  it('after_polls counts status polls; a rule for every operation does not hold deployments', async () => {
    server = await startTestServer({ admin: true });
    const first = await deployTrainedCheckpoint(server, MODEL, 4);
    expect(await statusOf(first.model_id, first.deployment_id)).toBe('ACTIVE');
    const [checkpoint] = (await inject('GET', `/v1/loops/checkpoints?base_model=${encodeURIComponent(MODEL)}`)).body.checkpoints.filter(
      (c: { target: string }) => c.target === 'sampler',
    );
    const deploy = async () =>
      (await inject('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [checkpoint.id], model_name: 'again' })).body as {
        model_id: string;
        deployment_id: string;
      };
    // No match.op: a rule meant for operations never holds a deployment.
    expect((await inject('POST', '/_mock/progress', { mode: 'manual' })).status).toBe(200);
    const free = await deploy();
    expect(await statusOf(free.model_id, free.deployment_id)).toBe('ACTIVE');
    await inject('DELETE', '/_mock/progress');
    expect((await inject('POST', '/_mock/progress', { match: { op: 'deploy_checkpoint' }, mode: 'after_polls', polls: 2 })).status).toBe(200);
    const held = await deploy();
    expect(await statusOf(held.model_id, held.deployment_id)).toBe('LOADING_MODEL');
    expect(await statusOf(held.model_id, held.deployment_id)).toBe('ACTIVE');
  }, 120_000);
});
