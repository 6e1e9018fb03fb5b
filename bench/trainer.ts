import { randomUUID } from 'node:crypto';
import { EnginePool } from '../models/index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../models/data/support-tickets.js';
import { keepAliveClient, startServerProcess } from './server-process.js';

/** Trainer-plane figures over HTTP from a real server process: operation overhead, and the campaign round's wall time. */
const MODEL = 'Qwen/Qwen3.5-2B';

export async function benchTrainer(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const base = server.base;
  const { send: rawSend, close } = keepAliveClient(base, 1);
  const send = (_base: string, method: string, path: string, body?: string, headers: Record<string, string> = {}) => rawSend(method, path, body === undefined ? undefined : JSON.parse(body), headers);
  try {
    const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
      (await send(base, method, path, body === undefined ? (method === 'POST' ? '{}' : undefined) : JSON.stringify(body), headers)).json;
    const op = async (trainer: string, name: string, body: unknown) => {
      const { operation_id } = await call('POST', `${trainer}/${name}`, body, { 'idempotency-key': randomUUID() });
      for (;;) {
        const res = await send(base, 'GET', `${trainer}/operations/${operation_id}`);
        if (res.status === 408) continue;
        if (res.json.status !== 'done') throw new Error(`${name}: ${JSON.stringify(res.json)}`);
        return res.json.result;
      }
    };
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
      await send(base, 'GET', `${trainer}/policy_version`);
      plain.push(performance.now() - t);
    }
    plain.sort((a, b) => a - b);
    console.log(`trainer: one plain GET /policy_version with the same client: p50 ${plain[100]!.toFixed(2)} ms (the floor of one request/response here)`);
    console.log(`trainer: operation overhead (submit + retrieve a one-token forward, HTTP): p50 ${times[100]!.toFixed(2)} ms, p99 ${times[198]!.toFixed(2)} ms (target p50 < 2 ms)`);

    const tok = new EnginePool().tokenizers.get(MODEL);
    const wire = (list: [string, string][]) => list.map(([t, l]) => {
      const d = datum(tok, t, l);
      return { model_input: { chunks: [{ type: 'encoded_text', tokens: d.tokens }] }, loss_fn_inputs: { target_tokens: { data: d.targetTokens, dtype: 'int64', shape: [d.tokens.length] } } };
    });
    const train = wire(TICKETS);
    const evalSet = wire(EVAL_TICKETS);
    const round = async () => {
      const started = performance.now();
      const s = (await call('POST', '/v1/loops/sessions')).session.id;
      const r = (await call('POST', '/v1/loops/trainers', { session_id: s, base_model: MODEL, lora_rank: 16, seed: 42, max_seq_len: 1024, name: 'campaign' })).run;
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
      for (const [ticket] of EVAL_TICKETS) {
        const res = await send(base, 'POST', `${sampler}/sample`, JSON.stringify({ prompt: { chunks: [{ type: 'encoded_text', tokens: tok.encode(prompt(ticket)) }] }, num_samples: 1, sampling_params: { max_tokens: 16, temperature: 0, stop: ['\n'] } }), { 'x-min-policy-version': String(published.policy_version) });
        if (res.status !== 200) throw new Error(`sample: ${res.status} ${JSON.stringify(res.json)}`);
      }
      await call('GET', `/v1/loops/checkpoints?run_id=${r.id}`);
      const runs = (await call('GET', '/v1/loops/runs')).runs.filter((x: any) => x.session_id === s);
      for (const x of runs) await call('POST', `/v1/loops/runs/${x.id}/deactivate`);
      return performance.now() - started;
    };
    const first = await round();
    const warm = await round();
    console.log(`trainer: campaign round through HTTP (trainer created, baseline, 2 steps, eval, save_state, save_weights_for_sampler, 2 pinned samples of 16 tokens, cleanup): ${warm.toFixed(0)} ms (first ${first.toFixed(0)} ms; target < 1000 ms)`);
  } finally {
    close();
    server.stop();
  }
}
