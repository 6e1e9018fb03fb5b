import { writeFileSync } from 'node:fs';
import { keepAliveClient, residentBytes, runOperation, startServerProcess } from './server-process.js';
import { figure } from './figures.js';

const MB = 1024 * 1024;
/** Any accepted request: resident memory under this while it runs (issue 14 item 2). */
const PEAK_TARGET_MB = 2048;
/** And back to within this of where it was once it is answered. */
const RETURN_TARGET_MB = 100;
const LENGTH = 4096;

/** Resets the process's peak resident memory to its current one (clear_refs 5). */
function resetPeak(pid: number): void {
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
}

/**
 * Memory per request: the server's resident memory while a 4,096-token
 * request runs on each route that computes over positions, and what is
 * left once it is answered, beside the targets.
 */
export async function benchMemory(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const client = keepAliveClient(server.base, 2);
  const { send, close } = client;
  try {
    const session = (await send('POST', '/v1/loops/sessions')).json.session.id;
    const run = (await send('POST', '/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 16, max_seq_len: LENGTH })).json.run;
    const trainer = new URL(run.base_url).pathname;
    const sampler = new URL(run.sampler.base_url).pathname;
    const tokens = Array.from({ length: LENGTH }, (_, i) => (i * 7919 + 13) % 150_000);
    const datum = {
      model_input: { chunks: [{ type: 'encoded_text', tokens }] },
      loss_fn_inputs: { target_tokens: { data: tokens.slice(1).concat(0), dtype: 'int64' } },
    };
    const prompt = { chunks: [{ type: 'encoded_text', tokens: tokens.slice(0, LENGTH - 16) }] };
    const op = (name: string, body: unknown) => runOperation(client, trainer, name, body);
    const cases: [string, () => Promise<unknown>][] = [
      [`forward_backward, ${LENGTH} tokens`, () => op('forward_backward', { data: [datum], loss_fn: 'cross_entropy' })],
      [`forward, ${LENGTH} tokens`, () => op('forward', { data: [datum], loss_fn: 'cross_entropy' })],
      [
        `compute_logprobs, ${LENGTH - 16}-token prompt`,
        async () => {
          const r = await send('POST', `${sampler}/compute_logprobs`, { prompt });
          if (r.status !== 200) throw new Error(JSON.stringify(r.json));
        },
      ],
      [
        `sample 16 tokens after a ${LENGTH - 16}-token prompt`,
        async () => {
          const r = await send('POST', `${sampler}/sample`, { prompt, num_samples: 1, sampling_params: { max_tokens: 16, temperature: 1, seed: 1 } });
          if (r.status !== 200) throw new Error(JSON.stringify(r.json));
        },
      ],
    ];
    // Every graph built first, on short inputs: what is measured is what a long input adds.
    const short = {
      model_input: { chunks: [{ type: 'encoded_text', tokens: tokens.slice(0, 32) }] },
      loss_fn_inputs: { target_tokens: { data: tokens.slice(1, 33), dtype: 'int64' } },
    };
    const shortPrompt = { chunks: [{ type: 'encoded_text', tokens: tokens.slice(0, 32) }] };
    await op('forward_backward', { data: [short], loss_fn: 'cross_entropy' });
    await op('forward', { data: [short], loss_fn: 'cross_entropy' });
    await send('POST', `${sampler}/compute_logprobs`, { prompt: shortPrompt });
    await send('POST', `${sampler}/sample`, { prompt: shortPrompt, num_samples: 1, sampling_params: { max_tokens: 16, temperature: 1, seed: 1 } });
    const start = residentBytes(server.pid);
    console.log(`memory per request (server process, resident): ${(start / MB).toFixed(0)} MB with every graph built on short inputs`);
    // Twice: the second round shows whether memory keeps growing from request to request.
    for (const [name, call] of [...cases, ...cases.map(([n, c]): [string, () => Promise<unknown>] => [`${n} (again)`, c])]) {
      const before = residentBytes(server.pid);
      resetPeak(server.pid);
      const started = performance.now();
      await call();
      const ms = performance.now() - started;
      const peak = residentBytes(server.pid, 'VmHWM');
      // Heavy runs' sessions are released 250 ms after the last one (models/graph-runner.ts).
      await new Promise((r) => setTimeout(r, 600));
      const after = residentBytes(server.pid);
      const grew = (after - before) / MB;
      figure(`memory: ${name}, peak`, peak / MB, 'MB', { op: '<', value: PEAK_TARGET_MB });
      figure(`memory: ${name}, after over before`, grew, 'MB', { op: '<', value: RETURN_TARGET_MB });
      console.log(
        `  ${name.padEnd(52)} ${ms.toFixed(0).padStart(6)} ms  peak ${(peak / MB).toFixed(0).padStart(5)} MB (target < ${PEAK_TARGET_MB})  after ${grew >= 0 ? '+' : ''}${grew.toFixed(0)} MB (target < ${RETURN_TARGET_MB})`,
      );
    }
    const end = residentBytes(server.pid);
    figure('memory: after all of them, over the start', (end - start) / MB, 'MB', { op: '<', value: RETURN_TARGET_MB });
    console.log(
      `  after all of them: ${(end / MB).toFixed(0)} MB, ${end >= start ? '+' : ''}${((end - start) / MB).toFixed(0)} MB over the start (target < ${RETURN_TARGET_MB})`,
    );
  } finally {
    close();
    server.stop();
  }
}
