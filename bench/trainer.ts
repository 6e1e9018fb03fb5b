import { campaignRound, MODEL } from './campaign-round.js';
import { keepAliveClient, runOperation, startServerProcess, type KeepAliveClient } from './server-process.js';
import { figure } from './figures.js';

/** Trainer-plane figures over HTTP from a real server process: operation overhead, and the campaign round's wall time (first rounds: first-round.ts). */
function helpers(client: KeepAliveClient) {
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) =>
    (await client.send(method, path, body, headers)).json;
  const op = (trainer: string, name: string, body: unknown) => runOperation(client, trainer, name, body);
  return { call, op };
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
      `trainer: ${clients} concurrent campaign rounds: all done in ${wall.toFixed(0)} ms, ${(wall / alone).toFixed(2)}x one client's round (target retired: the gap is compute); each round p50 ${times[clients >> 1]!.toFixed(0)} ms`,
    );
    figure(`trainer: ${clients} concurrent campaign rounds / one client's round`, wall / alone, 'x');
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
  } finally {
    client.close();
    server.stop();
  }
}
