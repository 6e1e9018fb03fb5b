import { keepAliveClient, ok, residentBytes, runOperation, startServerProcess } from './server-process.js';
import { figure } from './figures.js';

/**
 * Resident memory of a server process (issue 15): after start once its --warm build is done, and with 20
 * live runs of rank 16, each trained a step, published and sampled from.
 */
const MB = 1024 * 1024;
const MODEL = 'Qwen/Qwen3.5-2B';

/** Waits until resident memory has stopped growing for a second: the background warm-up is done. */
async function settled(pid: number): Promise<number> {
  let last = residentBytes(pid);
  for (let still = 0; still < 10; ) {
    await new Promise((r) => setTimeout(r, 100));
    const now = residentBytes(pid);
    still = Math.abs(now - last) < MB ? still + 1 : 0;
    last = now;
  }
  return last;
}

export async function benchFootprint(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const client = keepAliveClient(server.base, 1);
  try {
    const started = await settled(server.pid);
    console.log(`footprint: resident after start and --warm: ${(started / MB).toFixed(0)} MB (target < 300 MB)`);
    figure('footprint: resident after start and --warm', started / MB, 'MB', { op: '<', value: 300 });

    const session = (await ok(client, 'POST', '/v1/loops/sessions')).session.id;
    const tokens = Array.from({ length: 32 }, (_, i) => (i * 7919 + 13) % 150_000);
    const datum = {
      model_input: { chunks: [{ type: 'encoded_text', tokens }] },
      loss_fn_inputs: { target_tokens: { data: tokens.slice(1).concat(0), dtype: 'int64' } },
    };
    for (let i = 0; i < 20; i++) {
      const run = (await ok(client, 'POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 16, seed: i, max_seq_len: 1024 })).run;
      const trainer = new URL(run.base_url).pathname;
      await runOperation(client, trainer, 'forward_backward', { data: [datum], loss_fn: 'cross_entropy' });
      await runOperation(client, trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
      const published = await runOperation(client, trainer, 'save_weights_for_sampler', { name: 'live' });
      const sampler = new URL((await ok(client, 'GET', `/v1/loops/runs/${run.id}`)).run.sampler.base_url).pathname;
      await ok(
        client,
        'POST',
        `${sampler}/sample`,
        {
          prompt: { chunks: [{ type: 'encoded_text', tokens: tokens.slice(0, 8) }] },
          num_samples: 1,
          sampling_params: { max_tokens: 16, temperature: 1, seed: i },
        },
        { 'x-min-policy-version': String(published.policy_version) },
      );
    }
    const live = await settled(server.pid);
    console.log(`footprint: resident with 20 live runs (rank 16, each trained, published, sampled): ${(live / MB).toFixed(0)} MB (target < 600 MB)`);
    figure('footprint: resident with 20 live runs', live / MB, 'MB', { op: '<', value: 600 });
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
}
