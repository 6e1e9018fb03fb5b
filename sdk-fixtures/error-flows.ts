/**
 * The error cases of the protocol as short scripted flows. Run through
 * `loops-mock record` (sdk-fixtures/record.ts), each becomes a fixture; the
 * happy-path flows come from the conformance driver's tasks instead.
 */

type Call = (method: string, url: string, body?: unknown, headers?: Record<string, string>) => Promise<{ status: number; body: any }>;

export function caller(base: string, key: string): Call {
  return async (method, url, body, headers = {}) => {
    const res = await fetch(url.startsWith('/') ? `${base}${url}` : url, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null };
  };
}

async function newRun(call: Call) {
  const session = (await call('POST', '/v1/loops/sessions')).body.session.id;
  const run = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 8 })).body.run;
  return { run, trainer: run.base_url as string, sampler: run.sampler.base_url as string };
}

async function poll(call: Call, trainer: string, id: string) {
  for (;;) {
    const r = await call('GET', `${trainer}/operations/${id}`);
    if (r.status !== 408) return r;
  }
}

const datum = {
  model_input: { chunks: [{ type: 'encoded_text', tokens: [1, 2, 3, 4] }] },
  loss_fn_inputs: { target_tokens: { data: [2, 3, 4, 5], dtype: 'int64', shape: [4] } },
};

export const ERROR_FLOWS: Record<string, { description: string; run: (call: Call) => Promise<void> }> = {
  'errors-control-plane': {
    description:
      'Control-plane refusals: a mistyped field (400 naming it), an unknown model (400), an unknown run (404), an unknown route (404 with the nearest route).',
    run: async (call) => {
      const session = (await call('POST', '/v1/loops/sessions')).body.session.id;
      await call('POST', '/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: '16' });
      await call('POST', '/v1/loops/runs', { session_id: session, base_model: 'acme/NoSuchModel' });
      await call('GET', '/v1/loops/runs/nosuchrun');
      await call('GET', '/v1/loops/runz');
    },
  },
  'errors-trainer': {
    description:
      'Trainer refusals: a token beyond the vocabulary at submit (400), an unknown operation (404), an Idempotency-Key reused with another body (409), an operation ending with a user error, and a deactivated run (409 run_inactive).',
    run: async (call) => {
      const { run, trainer } = await newRun(call);
      await call(
        'POST',
        `${trainer}/forward`,
        { data: [{ ...datum, model_input: { chunks: [{ type: 'encoded_text', tokens: [1, 999999999] }] } }], loss_fn: 'cross_entropy' },
        { 'Idempotency-Key': 'k-vocab' },
      );
      await call('GET', `${trainer}/operations/nosuchoperation`);
      const first = await call('POST', `${trainer}/forward`, { data: [datum], loss_fn: 'cross_entropy' }, { 'Idempotency-Key': 'k-reused' });
      await poll(call, trainer, first.body.operation_id);
      await call('POST', `${trainer}/forward_backward`, { data: [datum], loss_fn: 'cross_entropy' }, { 'Idempotency-Key': 'k-reused' });
      const saved = await call('POST', `${trainer}/save_state`, { name: 'rank8' }, { 'Idempotency-Key': 'k-save' });
      await poll(call, trainer, saved.body.operation_id);
      const other = await newRun(call);
      await call('POST', `${other.trainer}/init_trainer_server`, { lora_rank: 4 }, { 'Idempotency-Key': 'k-init' }).then((r) =>
        poll(call, other.trainer, r.body.operation_id),
      );
      const load = await call('POST', `${other.trainer}/load_state`, { path: `bt://loops:${run.id}/weights/rank8` }, { 'Idempotency-Key': 'k-load' });
      if (load.status === 200) await poll(call, other.trainer, load.body.operation_id);
      await call('POST', `/v1/loops/runs/${run.id}/deactivate`);
      await call('POST', `${trainer}/forward`, { data: [datum], loss_fn: 'cross_entropy' }, { 'Idempotency-Key': 'k-late' });
      await call('POST', `/v1/loops/runs/${other.run.id}/deactivate`);
    },
  },
  'errors-sampler-floor': {
    description:
      'Sampler floors: a floor above anything published is a prompt 408 (unreachable); after a publish, a floor at the published version is served and reports it.',
    run: async (call) => {
      const { run, trainer, sampler } = await newRun(call);
      const prompt = { chunks: [{ type: 'encoded_text', tokens: [1, 2, 3] }] };
      await call('POST', `${sampler}/sample`, { prompt, num_samples: 1, sampling_params: { max_tokens: 2 } }, { 'X-Min-Policy-Version': '5' });
      for (const [op, body] of [
        ['forward_backward', { data: [datum], loss_fn: 'cross_entropy' }],
        ['optim_step', {}],
        ['save_weights_for_sampler', { name: 'v1' }],
      ] as const) {
        const r = await call('POST', `${trainer}/${op}`, body, { 'Idempotency-Key': `k-${op}` });
        await poll(call, trainer, r.body.operation_id);
      }
      await call('POST', `${sampler}/sample`, { prompt, num_samples: 1, sampling_params: { max_tokens: 2 } }, { 'X-Min-Policy-Version': '1' });
      await call('GET', `${sampler}/policy_version`);
      await call('POST', `/v1/loops/runs/${run.id}/deactivate`);
    },
  },
};
