import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { deployTrainedCheckpoint } from './deployed-checkpoint.js';
import { startTestServer } from './helpers.js';

const MODEL = 'Qwen/Qwen3.5-2B';
let server: RunningServer;
afterEach(() => server?.close());

// The query texts as truss/remote/baseten/api.py sends them.
const INSTANCES = `
  query Instances {
    listedInstances: listed_instances {
      id name millicpuLimit: millicpu_limit memoryLimit: memory_limit gpuCount: gpu_count gpuType: gpu_type
      gpuMemory: gpu_memory default displayName: display_name nodeCount: node_count price limitedCapacity: limited_capacity
    }
  }`;
const DEPLOY = `
  mutation ($request: CreateModelVersionFromInferenceTemplateRequest!) {
    create_model_version_from_inference_template(request: $request) {
      model_version { id name model_id }
      truss_config
    }
  }`;

const graphql = async (query: string, variables?: unknown, url = '/graphql/') => {
  const res = await server.app.inject({
    method: 'POST',
    url,
    headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
    payload: JSON.stringify(variables === undefined ? { query } : { query, variables }),
  });
  return { status: res.statusCode, body: res.json() };
};

const request = (checkpointId: string, dryRun: boolean, instance = 'H100:1x') => ({
  metadata: { oracle_name: 'tickets' },
  weights_sources: [
    { weight_source_type: 'B10_LOOPS_CHECKPOINTING', b10_loops_checkpoint_weights_source: { checkpoint: { loops_checkpoint_id: checkpointId } } },
  ],
  inference_stack: { stack_type: 'VLLM', environment_variables: [{ name: 'HF_TOKEN', value: 'hf_access_token', is_secret_reference: true }] },
  instance_type_id: instance,
  dry_run: dryRun,
});

describe('GraphQL as truss sends it', () => {
  it('lists instance types with the 12 keys truss reads, under its aliases', async () => {
    server = await startTestServer();
    const r = await graphql(INSTANCES);
    expect(r.status).toBe(200);
    const types = r.body.data.listedInstances;
    expect(Object.keys(types[0]).sort()).toEqual([
      'default',
      'displayName',
      'gpuCount',
      'gpuMemory',
      'gpuType',
      'id',
      'limitedCapacity',
      'memoryLimit',
      'millicpuLimit',
      'name',
      'nodeCount',
      'price',
    ]);
    // truss picks the smallest single-node type of the asked GPU.
    const h100 = types.filter((t: any) => t.gpuType === 'H100' && t.nodeCount === 1).sort((a: any, b: any) => a.gpuCount - b.gpuCount)[0];
    expect(h100.id).toBe('H100:1x');
    const who = await graphql('query { organization { workspace_name } user { email } }');
    expect(who.body.data.user.email).toMatch(/@/);
    expect(typeof who.body.data.organization.workspace_name).toBe('string');
  });

  it('the inference-template mutation: a dry run deploys nothing, a real one makes a deployment served by checkpoint name', async () => {
    server = await startTestServer();
    const call = async (url: string) => (await server.app.inject({ method: 'GET', url, headers: { authorization: `Bearer ${server.apiKey}` } })).json();
    const seed = await deployTrainedCheckpoint(server, MODEL);
    const checkpoint = (await call('/v1/loops/checkpoints?base_model=Qwen/Qwen3.5-2B')).checkpoints.find((c: any) => c.target === 'sampler');
    const before = (await call('/v1/models')).models.length;

    const dry = await graphql(DEPLOY, { request: request(checkpoint.id, true) });
    expect(dry.status).toBe(200);
    expect(dry.body.errors).toBeUndefined();
    expect(dry.body.data.create_model_version_from_inference_template.model_version).toBeNull();
    const config = JSON.parse(dry.body.data.create_model_version_from_inference_template.truss_config);
    expect(config.weights).toEqual([
      { source: `bt://loops:${checkpoint.run_id}/sampler_weights/step-1`, loops_checkpoint_id: checkpoint.id, served_model_name: 'step-1' },
    ]);
    expect((await call('/v1/models')).models.length).toBe(before);

    const real = await graphql(DEPLOY, { request: request(checkpoint.id, false) });
    const version = real.body.data.create_model_version_from_inference_template.model_version;
    expect(version).toMatchObject({ name: 'tickets', model_id: expect.stringMatching(/^[a-z0-9]{8}$/) });
    expect((await call(`/v1/models/${version.model_id}/deployments/${version.id}`)).status).toBe('ACTIVE');
    const models = await call(`/model/${version.model_id}/deployment/${version.id}/sync/v1/models`);
    expect(models.data[0].id).toBe('step-1');
    expect(seed.model_id).not.toBe(version.model_id);

    // Metrics of the deployment: a chat request made on it is counted.
    const chat = await server.app.inject({
      method: 'POST',
      url: `/model/${version.model_id}/deployment/${version.id}/sync/v1/chat/completions`,
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      payload: JSON.stringify({ model: 'step-1', messages: [{ role: 'user', content: 'hello' }], max_tokens: 2 }),
    });
    expect(chat.statusCode).toBe(200);
    const metrics = await graphql(
      `query { range_model_metrics(model_version_id: "${version.id}", step_seconds: 3600) { inference_volume { timestamp value } model_concurrent_requests { timestamp value } } }`,
    );
    expect(metrics.body.errors).toBeUndefined();
    expect(metrics.body.data.range_model_metrics.inference_volume.reduce((n: number, p: any) => n + p.value, 0)).toBe(1);
    expect(Math.max(...metrics.body.data.range_model_metrics.model_concurrent_requests.map((p: any) => p.value))).toBe(1);

    // Errors: 200 with errors[0].message and extensions.code.
    const unknownInstance = await graphql(DEPLOY, { request: request(checkpoint.id, false, 'TPU:1x') });
    expect(unknownInstance.status).toBe(200);
    expect(unknownInstance.body.errors[0]).toMatchObject({ extensions: { code: 'BAD_USER_INPUT', field: 'instance_type_id' } });
    const unknownCheckpoint = await graphql(DEPLOY, { request: request('NoSuchId', true) });
    expect(unknownCheckpoint.body.errors[0].extensions.code).toBe('NOT_FOUND');
  }, 120_000);

  it('a malformed query, an unknown field and a bad body are GraphQL errors naming what is wrong', async () => {
    server = await startTestServer();
    const malformed = await graphql('query { listed_instances { id ');
    expect(malformed.status).toBe(200);
    expect(malformed.body.errors[0].extensions.code).toBe('GRAPHQL_PARSE_FAILED');
    expect(malformed.body.errors[0].message).toMatch(/Syntax Error/);
    const unknown = await graphql('query { training_jobs { id } }');
    expect(unknown.body.errors[0]).toMatchObject({ extensions: { code: 'GRAPHQL_VALIDATION_FAILED' } });
    expect(unknown.body.errors[0].message).toMatch(/training_jobs/);
    const noQuery = await server.app.inject({
      method: 'POST',
      url: '/graphql',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      payload: '{"variables": {}}',
    });
    // Not a GraphQL request at all: a 400 with GraphQL's errors list, naming what is wrong.
    expect(noQuery.statusCode).toBe(400);
    expect(noQuery.json().errors[0].message).toMatch(/query must be a string/);
    const extra = await server.app.inject({
      method: 'POST',
      url: '/graphql/',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      payload: '{"query": "query { user { email } }", "zz_unknown": 1}',
    });
    expect([extra.statusCode, extra.json().errors[0].extensions.code]).toEqual([400, 'BAD_REQUEST']);
    expect(extra.json().errors[0].message).toMatch(/zz_unknown is not a field of a GraphQL request/);
  });
});
