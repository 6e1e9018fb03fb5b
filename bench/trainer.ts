import { EnginePool } from '../models/index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../models/data/support-tickets.js';
import { keepAliveClient, runOperation, startServerProcess, type KeepAliveClient } from './server-process.js';
import { figure } from './figures.js';

/** Trainer-plane figures over HTTP from a real server process: operation overhead, and the campaign round's wall time. */
const MODEL = 'Qwen/Qwen3.5-2B';

function helpers(client: KeepAliveClient) {
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
    (await client.send(method, path, body, headers)).json;
  const op = (trainer: string, name: string, body: unknown) => runOperation(client, trainer, name, body);
  return { call, op };
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

/** The guide's campaign round (campaign.py) against a server: its wall time in ms. */
function campaignRound(client: KeepAliveClient) {
  const { call, op } = helpers(client);
  const { train, evalSet, prompts } = campaignData();
  return async () => {
    const started = performance.now();
    const s = (await call('POST', '/v1/loops/sessions')).session.id;
    const r = (await call('POST', '/v1/loops/trainers', { session_id: s, base_model: MODEL, lora_rank: 16, seed: 42, max_seq_len: 1024, name: 'campaign' }))
      .run;
    const t = new URL(r.base_url).pathname;
    await call('GET', `${t}/health`);
    await op(t, 'forward', { data: evalSet, loss_fn: 'cross_entropy' });
    for (let epoch = 0; epoch < 2; epoch++) {
      await op(t, 'forward_backward', { data: train, loss_fn: 'cross_entropy' });
      await op(t, 'optim_step', { adam_params: { learning_rate: 4e-5 } });
    }
    await op(t, 'forward', { data: evalSet, loss_fn: 'cross_entropy' });
    await op(t, 'save_state', { name: 'final' });
    const published = await op(t, 'save_weights_for_sampler', { name: 'final' });
    // The sampling client of campaign.py: the run's (lazily created) paired sampler, pinned to the published version.
    const sampler = new URL((await call('GET', `/v1/loops/runs/${r.id}`)).run.sampler.base_url).pathname;
    for (const tokens of prompts) {
      const res = await client.send(
        'POST',
        `${sampler}/sample`,
        { prompt: { chunks: [{ type: 'encoded_text', tokens }] }, num_samples: 1, sampling_params: { max_tokens: 16, temperature: 0, stop: ['\n'] } },
        { 'x-min-policy-version': String(published.policy_version) },
      );
      if (res.status !== 200) throw new Error(`sample: ${res.status} ${JSON.stringify(res.json)}`);
    }
    await call('GET', `/v1/loops/checkpoints?run_id=${r.id}`);
    const runs = (await call('GET', '/v1/loops/runs')).runs.filter((x: any) => x.session_id === s);
    for (const x of runs) await call('POST', `/v1/loops/runs/${x.id}/deactivate`);
    return performance.now() - started;
  };
}

/** A fresh server process's first round, `afterMs` after its first 200 (its engine warming in the background meanwhile). */
async function coldRound(root: string, afterMs: number): Promise<{ startupMs: number; ms: number }> {
  const server = await startServerProcess(root);
  const client = keepAliveClient(server.base, 1);
  try {
    const round = campaignRound(client);
    await new Promise((r) => setTimeout(r, afterMs));
    return { startupMs: server.startupMs, ms: await round() };
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
}

/** 16 clients each doing a campaign round at once, on clients of their own: the slowest round against one alone. */
async function concurrentRounds(base: string, alone: number, clients = 16): Promise<number> {
  const own = Array.from({ length: clients }, () => keepAliveClient(base, 1));
  try {
    const rounds = own.map((c) => campaignRound(c));
    // One concurrent round first: graphs for the wider batches are built and sized then.
    await Promise.all(rounds.map((r) => r()));
    const started = performance.now();
    const times = await Promise.all(rounds.map((r) => r()));
    const wall = performance.now() - started;
    times.sort((a, b) => a - b);
    console.log(
      `trainer: ${clients} concurrent campaign rounds: all done in ${wall.toFixed(0)} ms, ${(wall / alone).toFixed(2)}x one client's round (target <= 4x); each round p50 ${times[clients >> 1]!.toFixed(0)} ms`,
    );
    figure(`trainer: ${clients} concurrent campaign rounds / one client's round`, wall / alone, 'x', { op: '<=', value: 4 });
    return wall;
  } finally {
    for (const c of own) c.close();
  }
}

export async function benchTrainer(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const client = keepAliveClient(server.base, 1);
  try {
    const { call, op } = helpers(client);
    const session = (await call('POST', '/v1/loops/sessions')).session.id;
    const run = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 16, seed: 42, max_seq_len: 1024 })).run;
    const trainer = new URL(run.base_url).pathname;

    const oneToken = { data: [{ model_input: { chunks: [{ type: 'encoded_text', tokens: [1] }] } }], loss_fn: 'cross_entropy' };
    for (let i = 0; i < 20; i++) await op(trainer, 'forward', oneToken);
    const times: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t = performance.now();
      await op(trainer, 'forward', oneToken);
      times.push(performance.now() - t);
    }
    times.sort((a, b) => a - b);
    const plain: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t = performance.now();
      await client.send('GET', `${trainer}/policy_version`);
      plain.push(performance.now() - t);
    }
    plain.sort((a, b) => a - b);
    console.log(`trainer: one plain GET /policy_version with the same client: p50 ${plain[100]!.toFixed(2)} ms (the floor of one request/response here)`);
    console.log(
      `trainer: operation overhead (submit + retrieve a one-token forward, HTTP): p50 ${times[100]!.toFixed(2)} ms, p99 ${times[198]!.toFixed(2)} ms (target p50 < 2 ms)`,
    );
    figure('trainer: operation overhead p50', times[100]!, 'ms', { op: '<', value: 2 });

    const round = campaignRound(client);
    await round();
    const warm: number[] = [];
    for (let i = 0; i < 3; i++) warm.push(await round());
    warm.sort((a, b) => a - b);
    const steady = warm[1]!;
    console.log(
      `trainer: campaign round through HTTP (trainer created, baseline, 2 steps, eval, save_state, save_weights_for_sampler, 2 pinned samples of 16 tokens, cleanup): ${steady.toFixed(0)} ms, median of 3 warm rounds (target < 1000 ms)`,
    );
    figure('trainer: campaign round through HTTP, warm', steady, 'ms', { op: '<', value: 1000 });
    await concurrentRounds(server.base, steady);
    const cold = await coldRound(root, 1000);
    const immediate = await coldRound(root, 0);
    figure('trainer: cold start, first round 1 s after start / a warm round', cold.ms / steady, 'x', { op: '<=', value: 1.5 });
    figure('trainer: cold start, first round right after the first 200 / a warm round', immediate.ms / steady, 'x');
    figure('trainer: cold start, start to first 200', cold.startupMs, 'ms', { op: '<', value: 500 });
    console.log(
      `trainer: cold start: a fresh process's first round 1 s after its first 200: ${cold.ms.toFixed(0)} ms, ${(cold.ms / steady).toFixed(2)}x a warm round (target <= 1.5x); right after its first 200, waiting for the --warm build: ${immediate.ms.toFixed(0)} ms (${(immediate.ms / steady).toFixed(2)}x); start to first 200 ${cold.startupMs.toFixed(0)} / ${immediate.startupMs.toFixed(0)} ms (target < 500 ms)`,
    );
  } finally {
    client.close();
    server.stop();
  }
}
