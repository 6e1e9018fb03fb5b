import { EnginePool } from '../models/index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../models/data/support-tickets.js';
import { runOperation, type KeepAliveClient } from './server-process.js';

/** The rounds the trainer and first-round benches send: the guide's campaign round, and the RL guide's step with every sampling kind. */
export const MODEL = 'Qwen/Qwen3.5-2B';

/** Each call of a round with its wall time, in order (`label` repeats where a round repeats a call). */
export type CallTimes = [label: string, ms: number][];

function helpers(client: KeepAliveClient, times?: CallTimes) {
  let last = performance.now();
  const mark = (label: string) => {
    const now = performance.now();
    times?.push([label, now - last]);
    last = now;
  };
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await client.send(method, path, body, headers);
    if (res.status !== 200) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(res.json).slice(0, 300)}`);
    return res.json;
  };
  const op = (trainer: string, name: string, body: unknown) => runOperation(client, trainer, name, body);
  return { call, op, mark };
}

let data: { train: unknown[]; evalSet: unknown[]; prompts: number[][] } | null = null;

/** The campaign's datums and prompts, tokenized once for every client of the bench (a tokenizer each would cost the load generator ~85 MB). */
function campaignData() {
  if (data) return data;
  const tok = new EnginePool().tokenizers.get(MODEL);
  const wire = (list: [string, string][]) =>
    list.map(([t, l]) => {
      const d = datum(tok, t, l);
      return {
        model_input: { chunks: [{ type: 'encoded_text', tokens: d.tokens }] },
        loss_fn_inputs: { target_tokens: { data: d.targetTokens, dtype: 'int64', shape: [d.tokens.length] } },
      };
    });
  data = { train: wire(TICKETS), evalSet: wire(EVAL_TICKETS), prompts: EVAL_TICKETS.map(([ticket]) => tok.encode(prompt(ticket))) };
  return data;
}

/** A session and run of the guide's shape: its trainer path and run id. */
async function newRun(call: ReturnType<typeof helpers>['call'], name: string) {
  const s = (await call('POST', '/v1/loops/sessions')).session.id;
  const r = (await call('POST', '/v1/loops/trainers', { session_id: s, base_model: MODEL, lora_rank: 16, seed: 42, max_seq_len: 1024, name })).run;
  return { session: s, run: r.id as string, trainer: new URL(r.base_url).pathname };
}

async function cleanUp(call: ReturnType<typeof helpers>['call'], session: string) {
  const runs = (await call('GET', '/v1/loops/runs')).runs.filter((x: any) => x.session_id === session);
  for (const x of runs) await call('POST', `/v1/loops/runs/${x.id}/deactivate`);
}

/**
 * The guide's campaign round (campaign.py): a session and run, an eval forward, two steps, a second eval,
 * save_state, save_weights_for_sampler, greedy samples of 16 tokens with a stop string, cleanup. Its wall time in ms;
 * with `times`, each call's.
 */
export function campaignRound(client: KeepAliveClient) {
  const { train, evalSet, prompts } = campaignData();
  return async (times?: CallTimes) => {
    const { call, op, mark } = helpers(client, times);
    const started = performance.now();
    const { session, run, trainer } = await newRun(call, 'campaign');
    await call('GET', `${trainer}/health`);
    mark('create session and run');
    await op(trainer, 'forward', { data: evalSet, loss_fn: 'cross_entropy' });
    mark('eval forward');
    for (let epoch = 0; epoch < 2; epoch++) {
      await op(trainer, 'forward_backward', { data: train, loss_fn: 'cross_entropy' });
      mark('forward_backward');
      await op(trainer, 'optim_step', { adam_params: { learning_rate: 4e-5 } });
      mark('optim_step');
    }
    await op(trainer, 'forward', { data: evalSet, loss_fn: 'cross_entropy' });
    mark('eval forward');
    await op(trainer, 'save_state', { name: 'final' });
    mark('save_state');
    const published = await op(trainer, 'save_weights_for_sampler', { name: 'final' });
    mark('save_weights_for_sampler');
    // The sampling client of campaign.py: the run's (lazily created) paired sampler, pinned to the published version.
    const sampler = new URL((await call('GET', `/v1/loops/runs/${run}`)).run.sampler.base_url).pathname;
    for (const tokens of prompts) {
      await call(
        'POST',
        `${sampler}/sample`,
        { prompt: { chunks: [{ type: 'encoded_text', tokens }] }, num_samples: 1, sampling_params: { max_tokens: 16, temperature: 0, stop: ['\n'] } },
        { 'x-min-policy-version': String(published.policy_version) },
      );
      mark('greedy sample, stop string');
    }
    await call('GET', `/v1/loops/checkpoints?run_id=${run}`);
    await cleanUp(call, session);
    mark('list checkpoints, deactivate');
    return performance.now() - started;
  };
}

/**
 * The RL guide's step, with every sampling kind its flows use: rollouts at temperature 1 (with and without a stop
 * string, with top_p), the sampler's prompt logprobs, then the policy losses on the rollouts' datums and a step.
 */
export function policyRound(client: KeepAliveClient) {
  const { train, prompts } = campaignData();
  const promptTokens = prompts[0]!;
  const tensor = (values: number[]) => ({ data: values, dtype: 'float32', shape: [values.length] });
  return async (times?: CallTimes) => {
    const { call, op, mark } = helpers(client, times);
    const started = performance.now();
    const { session, run, trainer } = await newRun(call, 'policy');
    await op(trainer, 'forward_backward', { data: train, loss_fn: 'cross_entropy' });
    await op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
    const published = await op(trainer, 'save_weights_for_sampler', { name: 'rollout' });
    mark('create, one step, publish');
    const sampler = new URL((await call('GET', `/v1/loops/runs/${run}`)).run.sampler.base_url).pathname;
    const pin = { 'x-min-policy-version': String(published.policy_version) };
    const input = { chunks: [{ type: 'encoded_text', tokens: promptTokens }] };
    const rollouts = await call(
      'POST',
      `${sampler}/sample`,
      { prompt: input, num_samples: 4, sampling_params: { max_tokens: 12, temperature: 1, seed: 7 } },
      pin,
    );
    mark('sample x4, temperature 1');
    await call(
      'POST',
      `${sampler}/sample`,
      { prompt: input, num_samples: 4, sampling_params: { max_tokens: 12, temperature: 0.8, seed: 8, stop: ['\n'] } },
      pin,
    );
    mark('sample x4, temperature, stop string');
    await call('POST', `${sampler}/sample`, { prompt: input, num_samples: 2, sampling_params: { max_tokens: 12, temperature: 1, top_p: 0.9, seed: 9 } }, pin);
    mark('sample x2, top_p');
    await call('POST', `${sampler}/compute_logprobs`, { prompt: input }, pin);
    mark('compute_logprobs');
    const datums = rollouts.sequences.map((s: { tokens: number[]; logprobs: number[] }, i: number) => ({
      model_input: { chunks: [{ type: 'encoded_text', tokens: [...promptTokens, ...s.tokens] }] },
      loss_fn_inputs: {
        logprobs: tensor([...promptTokens.map(() => 0), ...s.logprobs]),
        advantages: tensor([...promptTokens.map(() => 0), ...s.tokens.map(() => [1, -1, 0.5, -0.5][i]!)]),
      },
    }));
    for (const loss of ['importance_sampling', 'ppo', 'cispo', 'dppo', 'dro']) {
      await op(trainer, 'forward', { data: datums, loss_fn: loss });
      mark(`forward, ${loss}`);
    }
    await op(trainer, 'forward_backward', { data: datums, loss_fn: 'ppo' });
    mark('forward_backward, ppo');
    await op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-4 } });
    mark('optim_step');
    await cleanUp(call, session);
    mark('deactivate');
    return performance.now() - started;
  };
}
