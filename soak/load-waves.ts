import { keepAliveClient, ok, residentBytes, runOperation as op, startServerProcess } from '../bench/server-process.js';
import { MODEL } from './fuzz.js';

/**
 * Waves of concurrent clients, each doing small campaign rounds on a run of
 * its own (train, step, publish, sample pinned to the published version,
 * deactivate), against one server process. After each wave: the clients'
 * errors and the server's resident memory. Deactivated runs free all but
 * their checkpoints, so memory after a wave of 50 should be about that
 * after a wave of 10.
 */

export interface WaveFigures {
  clients: number;
  rounds: number;
  errors: number;
  seconds: number;
  rssMb: number;
}

export interface LoadFigures {
  waves: WaveFigures[];
  /** Resident memory after the last wave over after the first: at most 1.10. */
  rssGrowth: number;
  failures: string[];
}

/** One client's rounds: its own session and run, deactivated at the end. */
async function campaign(base: string, rounds: number, who: number): Promise<void> {
  const client = keepAliveClient(base, 2);
  try {
    const session = (await ok(client, 'POST', '/v1/loops/sessions')).session.id;
    const run = (await ok(client, 'POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 4, max_seq_len: 128, name: `wave-${who}` }))
      .run;
    const trainer = `/trainer/${run.id}`;
    const tokens = Array.from({ length: 12 }, (_, i) => 100 + ((who * 7 + i) % 500));
    const datum = {
      model_input: { chunks: [{ type: 'encoded_text', tokens }] },
      loss_fn_inputs: { target_tokens: { data: tokens.map((t) => t + 1), dtype: 'int64', shape: [tokens.length] } },
    };
    for (let r = 0; r < rounds; r++) {
      await op(client, trainer, 'forward_backward', { data: [datum, datum], loss_fn: 'cross_entropy' });
      await op(client, trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
      const published = await op(client, trainer, 'save_weights_for_sampler', { name: `round-${r}` });
      const sampler = `/sampler/${run.sampler.id}`;
      await ok(
        client,
        'POST',
        `${sampler}/sample`,
        { prompt: { chunks: [{ type: 'encoded_text', tokens: tokens.slice(0, 6) }] }, num_samples: 1, sampling_params: { max_tokens: 8, temperature: 1 } },
        { 'x-min-policy-version': String(published.policy_version) },
      );
    }
    await ok(client, 'POST', `/v1/loops/runs/${run.id}/deactivate`);
  } finally {
    client.close();
  }
}

/**
 * With `dataDir`, checkpoints are files there: what stays resident after a wave is then only what the
 * server keeps of runs it no longer serves. (In memory, each wave's checkpoints are data the server must keep.)
 */
export async function runLoadWaves(root: string, sizes: number[], dataDir: string, rounds = 2): Promise<LoadFigures> {
  const server = await startServerProcess(root, ['--log-level', 'silent', '--data-dir', dataDir]);
  const failures: string[] = [];
  const waves: WaveFigures[] = [];
  try {
    for (const clients of sizes) {
      const started = performance.now();
      const results = await Promise.allSettled(Array.from({ length: clients }, (_, i) => campaign(server.base, rounds, i)));
      const errors = results.filter((r) => r.status === 'rejected') as PromiseRejectedResult[];
      for (const e of errors.slice(0, 5)) failures.push(`wave of ${clients}: ${(e.reason as Error).message}`);
      const seconds = (performance.now() - started) / 1000;
      // Let the last answers' buffers go before reading the figure.
      await new Promise((r) => setTimeout(r, Number(process.env.SOAK_SETTLE_MS ?? 1000)));
      waves.push({ clients, rounds, errors: errors.length, seconds, rssMb: residentBytes(server.pid) / 2 ** 20 });
    }
  } finally {
    server.stop();
    await server.exited;
  }
  return { waves, rssGrowth: waves.length ? waves.at(-1)!.rssMb / waves[0]!.rssMb : 1, failures };
}
