import { datum, prompt, TICKETS } from '../../models/data/support-tickets.js';
import type { RunningServer } from '../index.js';

/** What a client test needs to call a deployed checkpoint, and the greedy answers it must get. */
export interface DeployedCheckpoint {
  model_id: string;
  deployment_id: string;
  /** The OpenAI base URL the deploy answered (Baseten's host in proxy mode). */
  base_url: string;
  model: string;
  max_tokens: number;
  /** Per support-ticket prompt: the chat messages and the Loops sampler's greedy answer to their rendered ids. */
  cases: { messages: { role: string; content: string }[]; expected: string }[];
}

/**
 * Trains a run one step on two support tickets, saves sampler checkpoint
 * `step-1`, deploys it, and asks the run's own sampler for the greedy answer
 * to each ticket's chat prompt (rendered by the base model's template): what
 * the deployed checkpoint must answer to an unmodified OpenAI client.
 */
export async function deployTrainedCheckpoint(server: RunningServer, baseModel: string, maxTokens = 8): Promise<DeployedCheckpoint> {
  const call = async (method: string, url: string, body?: unknown) => {
    const res = await server.app.inject({
      method: method as 'POST',
      url,
      headers: { authorization: `Bearer ${server.apiKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      payload: body === undefined ? undefined : JSON.stringify(body),
    });
    if (res.statusCode !== 200) throw new Error(`${method} ${url}: ${res.statusCode} ${res.body}`);
    return res.json();
  };
  const op = async (path: string, body: unknown) => {
    const { operation_id } = await call('POST', path, body);
    for (;;) {
      const res = await server.app.inject({
        method: 'GET',
        url: `${path.replace(/\/[^/]+$/, '')}/operations/${operation_id}`,
        headers: { authorization: `Bearer ${server.apiKey}` },
      });
      if (res.statusCode === 408) continue;
      const r = res.json();
      if (r.status !== 'done') throw new Error(res.body);
      return r.result;
    }
  };
  const tok = server.core.engines.tokenizers.get(baseModel);
  const session = (await call('POST', '/v1/loops/sessions')).session.id;
  const run = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: baseModel, lora_rank: 8, seed: 1 })).run;
  const trainer = `/trainer/${run.id}`;
  const data = TICKETS.slice(0, 2).map(([t, l]) => {
    const d = datum(tok, t, l);
    return {
      model_input: { chunks: [{ type: 'encoded_text', tokens: d.tokens }] },
      loss_fn_inputs: { target_tokens: { data: d.targetTokens, dtype: 'int64' } },
    };
  });
  await op(`${trainer}/forward_backward`, { data, loss_fn: 'cross_entropy' });
  await op(`${trainer}/optim_step`, { adam_params: { learning_rate: 5e-2 } });
  await op(`${trainer}/save_weights_for_sampler`, { name: 'step-1' });
  const checkpoint = (await call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).checkpoints.find((c: { target: string }) => c.target === 'sampler');
  const deployed = await call('POST', '/v1/loops/checkpoints/deploy', {
    checkpoint_ids: [checkpoint.id],
    model_name: 'support-tickets',
    instance_type_id: 'H100:1x',
    hf_secret_name: 'hf_access_token',
  });
  const eos = server.core.engines.sampleCodec(baseModel).eosTokenIds;
  const cases = [];
  for (const [ticket] of TICKETS.slice(0, 2)) {
    const messages = [{ role: 'user', content: prompt(ticket) }];
    const ids = tok.encode(server.core.inference.template(baseModel).render(messages, { addGenerationPrompt: true }));
    const sampled = await call('POST', `/sampler/${run.sampler.id}/sample`, {
      prompt: { chunks: [{ type: 'encoded_text', tokens: ids }] },
      num_samples: 1,
      sampling_params: { max_tokens: maxTokens, temperature: 0 },
    });
    const seq = sampled.sequences[0];
    const tokens: number[] = seq.stop_reason === 'stop' && eos.includes(seq.tokens.at(-1)) ? seq.tokens.slice(0, -1) : seq.tokens;
    cases.push({ messages, expected: tok.decode(tokens) });
  }
  return {
    model_id: deployed.model_id,
    deployment_id: deployed.deployment_id,
    base_url: deployed.inference.base_url,
    model: 'step-1',
    max_tokens: maxTokens,
    cases,
  };
}

/** Chat-template cases for transformers' apply_chat_template to check: the mock's rendered prompt ids for each. */
export function chatTemplateCases(server: RunningServer, models: string[]) {
  const tools = [
    {
      type: 'function',
      function: {
        name: 'lookup_account',
        description: 'Find a customer account by email',
        parameters: { type: 'object', properties: { email: { type: 'string' } }, required: ['email'] },
      },
    },
  ];
  const messages = [
    { role: 'system', content: 'You sort support tickets.' },
    { role: 'user', content: 'I cannot log in to my account.' },
    { role: 'assistant', content: 'access' },
    { role: 'user', content: 'I was charged twice this month.' },
  ];
  const out = [];
  for (const model of models) {
    const tok = server.core.engines.tokenizers.get(model);
    for (const withTools of [false, true]) {
      for (const kwargs of [{}, { enable_thinking: false }, { enable_thinking: true }]) {
        const text = server.core.inference.template(model).render(messages, { addGenerationPrompt: true, tools: withTools ? tools : null, kwargs });
        out.push({ model, messages, tools: withTools ? tools : null, kwargs, ids: tok.encode(text) });
      }
    }
  }
  return out;
}
