import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import type { RunningServer } from '../index.js';
import { atLeast, differences, format, list, literal, optional, tiny, type Shape } from './docs-shapes.js';
import { client, startTestServer, type Client } from './helpers.js';

/**
 * Every example JSON response on Baseten's Loops pages that a request can reproduce,
 * held against what the mock answers to that request: the same field names (none
 * missing, none extra), the same JSON value types, and the formats the examples show.
 * The shapes are written here from the pages (cited above each); where an example's
 * value cannot hold for the mock's tiny model, `tiny(...)` says why.
 */

const MODEL = 'Qwen/Qwen3.5-2B';

// ---- formats the pages' examples show ----------------------------------------------
const ISO_8601 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$/;
/** `2026-07-01T20:50:39.854Z` (quickstart), `2023-11-07T05:31:56Z` (API reference). */
const isoTime = format('an ISO 8601 time', (s) => ISO_8601.test(s) && !Number.isNaN(Date.parse(s)));
/** Run and session ids: `e3mvjo3`, `k4q95w5` (run), `2qjl22w` (session). */
const lowerId = format('a 7-character lowercase id like e3mvjo3', /^[a-z0-9]{7}$/);
/** Checkpoint global ids: `VqKXRGB` (quickstart). */
const checkpointId = format('a 7-character mixed-case id like VqKXRGB', /^[A-Za-z0-9]{7}$/);
/** model_id and deployment_id go into `https://model-<model_id>.api.baseten.co/deployment/<deployment_id>/...` (quickstart). */
const hostId = format('a host-safe lowercase id', /^[a-z0-9]+$/);
const httpUrl = format('an absolute http(s) URL', (s) => {
  try {
    return /^https?:$/.test(new URL(s).protocol);
  } catch {
    return false;
  }
});
const email = format('an email address', /^[^@\s]+@[^@\s]+$/);

// ---- requests -----------------------------------------------------------------------
let server: RunningServer;
let api: Client;

/** Submits a trainer operation and polls it to its result, as the SDK's `.result()` does. */
async function op(trainer: string, name: string, body: unknown): Promise<any> {
  const submitted = await api.post(`${trainer}/${name}`, body, { 'idempotency-key': `docs-${name}-${Math.random().toString(16).slice(2)}` });
  if (submitted.status !== 200) throw new Error(`${name}: ${submitted.status} ${JSON.stringify(submitted.body)}`);
  for (;;) {
    const polled = await api.get(`${trainer}/operations/${submitted.body.operation_id}`);
    if (polled.status === 408) continue;
    if (polled.status !== 200 || polled.body.status !== 'done') throw new Error(`${name}: ${polled.status} ${JSON.stringify(polled.body)}`);
    return polled.body.result;
  }
}

/** What the quickstart's train_loops.py does, over the wire, with every answer it reads kept. */
const quickstart: Record<string, any> = {};

beforeAll(async () => {
  server = await startTestServer();
  api = client(server);
  quickstart.session = (await api.post('/v1/loops/sessions')).body;
  const created = await api.post('/v1/loops/runs', { session_id: quickstart.session.session.id, base_model: MODEL, lora_rank: 16 });
  if (created.status !== 200) throw new Error(JSON.stringify(created.body));
  quickstart.run = created.body;
  const run = created.body.run;
  const trainer = new URL(run.base_url).pathname;

  // build_sft_datum as the quickstart writes it: shift by hand, mask the prompt.
  const tok = new EnginePool().tokenizers.get(MODEL);
  const p = tok.encode('What is the capital of France?\nAnswer:');
  const a = tok.encode(' Paris');
  const tokens = [...p, ...a].slice(0, -1);
  const targets = [...Array(p.length - 1).fill(-100), ...a];
  const datum = {
    model_input: { chunks: [{ type: 'encoded_text', tokens }] },
    loss_fn_inputs: { target_tokens: { data: targets, dtype: 'int64', shape: [targets.length] } },
  };

  quickstart.forwardBackward = await op(trainer, 'forward_backward', { data: [datum], loss_fn: 'cross_entropy' });
  quickstart.optimStep = await op(trainer, 'optim_step', { adam_params: { learning_rate: 4e-5 } });
  quickstart.save = await op(trainer, 'save_weights_for_sampler', { name: 'step-1' });
  quickstart.checkpoints = (await api.get(`/v1/loops/checkpoints?run_id=${run.id}`)).body;
}, 120_000);
afterAll(() => server?.close());

function expectShape(actual: unknown, shape: Shape) {
  const text = JSON.stringify(actual);
  expect(differences(actual, shape), `the answer was ${text.length > 600 ? `${text.slice(0, 600)}...` : text}`).toEqual([]);
}

describe('the quickstart (https://docs.baseten.co/loops/quickstart)', () => {
  it('lists the step-1 checkpoint as its GET /v1/loops/checkpoints?run_id= output shows', () => {
    const run = quickstart.run.run;
    expectShape(quickstart.checkpoints, {
      checkpoints: list(
        {
          checkpoint_id: literal('step-1'),
          created_at: isoTime,
          checkpoint_type: literal('lora'),
          base_model: literal(MODEL),
          lora_adapter_config: { r: literal(16) },
          size_bytes: tiny('integer', '33,638,400 is a rank-16 adapter of the real Qwen3.5-2B; the mock trains a tiny model of that vocabulary'),
          sync_status: 'null',
          id: checkpointId,
          run_id: literal(run.id),
          target: literal('sampler'),
        },
        1,
      ),
    });
    expect(quickstart.checkpoints.checkpoints[0].size_bytes).toBeGreaterThan(0);
  });

  it('prints what its script reads off the wire: session and run ids, the loss, optimizer metrics, the saved path', () => {
    expectShape(quickstart.session, { session: { id: lowerId } });
    expectShape(quickstart.run.run.id, lowerId);
    // `loss=2.456638`: a number; its value is the tiny model's, not Qwen3.5-2B's.
    expectShape(quickstart.forwardBackward, atLeast({ loss: tiny('number', "2.456638 is the real model's loss on this datum; the tiny model's differs") }));
    // `optim_metrics={'step': 1.0, 'learning_rate': 4e-05, 'lr': 4e-05, 'grad_norm': 74.11, ...}`: the page elides the rest.
    expectShape(
      quickstart.optimStep,
      atLeast({
        metrics: atLeast({
          step: literal(1),
          learning_rate: literal(4e-5),
          lr: literal(4e-5),
          grad_norm: tiny('number', "74.11 is the real model's gradient norm; the tiny model's differs"),
        }),
      }),
    );
    // `saved checkpoint at bt://loops:e3mvjo3/sampler_weights/step-1`
    expectShape(quickstart.save, atLeast({ path: literal(`bt://loops:${quickstart.run.run.id}/sampler_weights/step-1`) }));
  });
});

describe('the API reference route pages (https://docs.baseten.co/reference/loops-api/*)', () => {
  /** LoopsSamplerV1 as the create-a-run and create-a-sampler examples show it. */
  const samplerShape = (baseModel: string): Shape => ({
    id: lowerId,
    base_url: httpUrl,
    base_model: literal(baseModel),
    created_at: isoTime,
    model_id: hostId,
    deployment_id: hostId,
    // The example renders `status: {}`; the published schema (LoopsSamplerStatusV1) gives it one field, name.
    status: { name: 'string' },
    // The example page renders a subset; the published schema adds user (required), instance_type and node_count.
    user: { email },
    instance_type: optional({
      id: 'string',
      name: 'string',
      memory_limit_mib: 'integer',
      millicpu_limit: 'integer',
      gpu_count: 'integer',
      gpu_type: tiny('null', 'the mock samples on CPU, so no GPU type; a real sampler names its GPU (a string)'),
      gpu_memory_limit_mib: tiny('null', 'the mock samples on CPU, so no GPU memory; a real sampler gives it (an integer)'),
    }),
    node_count: optional('integer'),
  });

  it('sessions/create-a-session and get-a-session: {"session": {"id"}}', async () => {
    const created = await api.post('/v1/loops/sessions', {});
    expectShape(created.body, { session: { id: lowerId } });
    expectShape((await api.get(`/v1/loops/sessions/${created.body.session.id}`)).body, { session: { id: literal(created.body.session.id) } });
  });

  /** LoopsRunV1 as the create-a-run example shows it. */
  const runShape = (): Shape => ({
    id: lowerId,
    session_id: literal(quickstart.session.session.id),
    base_model: literal(MODEL),
    base_url: httpUrl,
    created_at: isoTime,
    sampler: samplerShape(MODEL),
    // Not in the page's rendered example; required (name, status, user) or optional (deployment_id) in the published schema.
    name: literal(MODEL), // the name defaults to the base model (baseten loops run create --name)
    status: { name: literal('ACTIVE') },
    user: { email },
    deployment_id: optional(lowerId),
  });

  it('runs/create-a-run: {"run": {id, session_id, base_model, base_url, created_at, sampler}}', () => {
    expectShape(quickstart.run, { run: runShape() });
  });

  it('runs/get-a-run and runs/list-runs answer the same run object', async () => {
    const id = quickstart.run.run.id;
    expectShape((await api.get(`/v1/loops/runs/${id}`)).body, { run: runShape() });
    expectShape((await api.get(`/v1/loops/runs?run_id=${id}`)).body, { runs: list(runShape(), 1) });
  });

  it('samplers/create-a-sampler: {"sampler": {id, base_url, base_model, created_at, model_id, deployment_id}}', async () => {
    const session = (await api.post('/v1/loops/sessions')).body.session.id;
    const res = await api.post('/v1/loops/samplers', { session_id: session, base_model: 'Qwen/Qwen3-8B' });
    expectShape(res.body, { sampler: samplerShape('Qwen/Qwen3-8B') });
  });

  it('checkpoints/get-checkpoint-files: {presigned_urls: [{url, relative_file_name, node_rank, size_bytes, last_modified}], total_count, next_page_token}', async () => {
    const id = quickstart.checkpoints.checkpoints[0].id;
    // One file a page, so that next_page_token is the integer the example shows (null only on the last page).
    const res = await api.get(`/v1/loops/checkpoints/${id}/files?page_size=1`);
    expectShape(res.body, {
      presigned_urls: list({ url: httpUrl, relative_file_name: 'string', node_rank: 'integer', size_bytes: 'integer', last_modified: 'string' }, 1),
      total_count: 'integer',
      next_page_token: 'integer',
    });
  });

  it('checkpoints/validate-a-checkpoint: {} for a sampler checkpoint', async () => {
    const res = await api.post('/v1/loops/checkpoints/validate', { checkpoint_path: `bt://loops:${quickstart.run.run.id}/sampler_weights/step-1` });
    expect(res.status).toBe(200);
    expectShape(res.body, {});
  });

  it('runs/deactivate-a-run: {id, base_model, user}; then the run and its sampler read INACTIVE (deactivate-a-run guide, troubleshooting page)', async () => {
    const session = (await api.post('/v1/loops/sessions')).body.session.id;
    const run = (await api.post('/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3-0.6B' })).body.run;
    const res = await api.post(`/v1/loops/runs/${run.id}/deactivate`);
    expectShape(res.body, { id: literal(run.id), base_model: literal('Qwen/Qwen3-0.6B'), user: { email } });
    const after = (await api.get(`/v1/loops/runs/${run.id}`)).body.run;
    expectShape(after.status, { name: literal('INACTIVE') });
    expectShape(after.sampler.status, { name: literal('INACTIVE') });
  });
});

describe('the supported-models page (https://docs.baseten.co/loops/supported-models)', () => {
  it('GET /v1/loops/capabilities answers {"supported_models": [{model_name, max_context_length}, ...]} with the rows it shows', async () => {
    const res = await api.get('/v1/loops/capabilities');
    expectShape(res.body, {
      supported_models: list({
        model_name: 'string',
        max_context_length: 'integer',
        // The page's example elides these; get-capabilities (published schema) requires supports_vision_language,
        // and the serverless page says each model in the response has a serverless field.
        supports_vision_language: 'boolean',
        serverless: 'boolean',
      }),
    });
    const rows = new Map(res.body.supported_models.map((m: any) => [m.model_name, m.max_context_length]));
    // The two rows the example prints, with their values.
    expect(rows.get('Qwen/Qwen3-0.6B')).toBe(8192);
    expect(rows.get('Qwen/Qwen3-30B-A3B-Instruct-2507')).toBe(131072);
  });
});

describe('the shape comparison itself', () => {
  it('names the path of each missing, extra, mistyped or misformatted field', () => {
    const shape: Shape = { a: 'integer', b: { c: lowerId }, d: list('string', 1), e: 'null' };
    expect(differences({ a: 1, b: { c: 'e3mvjo3' }, d: ['x'], e: null }, shape)).toEqual([]);
    expect(differences({ a: 1.5, b: { c: 'VqKXRGB', z: 0 }, d: [1, 'y'], f: true }, shape)).toEqual([
      '$.a: expected integer, got number 1.5',
      '$.b.c: expected a 7-character lowercase id like e3mvjo3, got "VqKXRGB"',
      '$.b.z: not in the documented example (value 0)',
      '$.d: expected 1 item(s), got 2',
      '$.d[0]: expected string, got integer 1',
      '$.e: missing',
      '$.f: not in the documented example (value true)',
    ]);
    expect(differences({ x: 1 }, atLeast({ x: literal(2) }))).toEqual(['$.x: expected 2, got 1']);
    expect(differences({}, { x: optional('string') })).toEqual([]);
    expect(differences('2026-07-01T20:50:39.854Z', isoTime)).toEqual([]);
    expect(differences('2026-07-01 20:50:39', isoTime)).toHaveLength(1);
  });
});
