import { request, Agent } from 'node:http';
import { BENCH_KEY, keepAliveClient, ok, runOperation, startServerProcess } from './server-process.js';
import { figure } from './figures.js';

/**
 * A checkpoint deployed to inference, over HTTP from a real server process: the first-token latency and
 * tokens/s of 16-token completions, streamed and not, beside the Loops sampler's 16-token samples of the same
 * prompt with the same adapter on the same server (the issue sets no target: the sampler is the comparison).
 */
const MODEL = 'Qwen/Qwen3.5-2B';
const DURATION_MS = Number(process.env.BENCH_DURATION_S ?? 5) * 1000;
const PROMPT = Array.from({ length: 32 }, (_, i) => 100 + i);
const MAX_TOKENS = 16;

interface Timed {
  /** Milliseconds to the first token's text reaching the client (a whole answer: to the answer). */
  firstMs: number;
  totalMs: number;
  tokens: number;
}

export async function benchInference(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const client = keepAliveClient(server.base);
  const agent = new Agent({ keepAlive: true, maxSockets: 4 });
  try {
    const session = (await ok(client, 'POST', '/v1/loops/sessions')).session.id;
    const run = (await ok(client, 'POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 16 })).run;
    await runOperation(client, new URL(run.base_url).pathname, 'save_weights_for_sampler', { name: 'step-0' });
    const checkpoint = (await ok(client, 'GET', `/v1/loops/checkpoints?run_id=${run.id}`)).checkpoints.find((c: { target: string }) => c.target === 'sampler');
    const deployed = await ok(client, 'POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [checkpoint.id], model_name: 'bench' });
    const completions = `${new URL(deployed.inference.base_url).pathname}/completions`;
    const sampler = `${new URL(run.sampler.base_url).pathname}/sample`;
    const body = { model: 'step-0', prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 1 };

    const whole = async (): Promise<Timed> => {
      const t = performance.now();
      const res = await ok(client, 'POST', completions, body);
      const ms = performance.now() - t;
      return { firstMs: ms, totalMs: ms, tokens: res.usage.completion_tokens };
    };
    const streamed = (): Promise<Timed> =>
      new Promise((resolve, reject) => {
        const t = performance.now();
        let firstMs = -1;
        let buffer = '';
        let tokens = 0;
        const req = request(
          `${server.base}${completions}`,
          { method: 'POST', agent, headers: { authorization: `Bearer ${BENCH_KEY}`, 'content-type': 'application/json' } },
          (res) => {
            if (res.statusCode !== 200) return reject(new Error(`stream: ${res.statusCode}`));
            res.setEncoding('utf8');
            res.on('data', (chunk: string) => {
              buffer += chunk;
              for (let at = buffer.indexOf('\n\n'); at >= 0; at = buffer.indexOf('\n\n')) {
                const data = buffer.slice(6, at);
                buffer = buffer.slice(at + 2);
                if (data === '[DONE]') continue;
                const e = JSON.parse(data);
                if (firstMs < 0 && e.choices?.[0]?.text) firstMs = performance.now() - t;
                if (e.usage) tokens = e.usage.completion_tokens;
              }
            });
            res.on('end', () => resolve({ firstMs: firstMs < 0 ? performance.now() - t : firstMs, totalMs: performance.now() - t, tokens }));
          },
        );
        req.on('error', reject);
        req.end(JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }));
      });
    const sample = async (): Promise<Timed> => {
      const t = performance.now();
      const res = await ok(client, 'POST', sampler, {
        prompt: { chunks: [{ type: 'encoded_text', tokens: PROMPT }] },
        num_samples: 1,
        sampling_params: { max_tokens: MAX_TOKENS, temperature: 1 },
      });
      const ms = performance.now() - t;
      return { firstMs: ms, totalMs: ms, tokens: res.sequences[0].tokens.length };
    };

    /** One client for a window: tokens/s, and the p50 of the first token's latency. */
    const measure = async (once: () => Promise<Timed>) => {
      const firsts: number[] = [];
      let tokens = 0;
      const started = performance.now();
      while (performance.now() - started < DURATION_MS) {
        const r = await once();
        firsts.push(r.firstMs);
        tokens += r.tokens;
      }
      firsts.sort((a, b) => a - b);
      return { rate: tokens / ((performance.now() - started) / 1000), firstP50: firsts[Math.floor(firsts.length / 2)]! };
    };
    // Warm-up: each path's graphs are built on first use.
    for (let i = 0; i < 5; i++) {
      await sample();
      await whole();
      await streamed();
    }
    const samplerFig = await measure(sample);
    const wholeFig = await measure(whole);
    const streamFig = await measure(streamed);
    figure('inference: 16-token completions, 1 client', wholeFig.rate, 'tokens/s');
    figure('inference: 16-token completions, first token (the whole answer)', wholeFig.firstP50, 'ms');
    figure('inference: 16-token completions streamed, 1 client', streamFig.rate, 'tokens/s');
    figure('inference: 16-token completions streamed, first token', streamFig.firstP50, 'ms');
    figure('inference: the sampler, 16-token samples of the same prompt, 1 client', samplerFig.rate, 'tokens/s');
    console.log(
      `inference: 16-token completions on a deployed checkpoint, 1 client: ${wholeFig.rate.toFixed(0)} tokens/s, first token (with the whole answer) p50 ${wholeFig.firstP50.toFixed(1)} ms`,
    );
    console.log(`inference: the same, streamed: ${streamFig.rate.toFixed(0)} tokens/s, first token p50 ${streamFig.firstP50.toFixed(1)} ms`);
    console.log(
      `inference: beside the Loops sampler on the same server, same prompt and adapter: ${samplerFig.rate.toFixed(0)} tokens/s, a 16-token sample p50 ${samplerFig.firstP50.toFixed(1)} ms (no target set: the sampler is the comparison)`,
    );
  } finally {
    agent.destroy();
    client.close();
    server.stop();
  }
}
