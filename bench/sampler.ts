import { keepAliveClient, startServerProcess } from './server-process.js';
import { figure } from './figures.js';

/** Sampler-plane figures over HTTP from a real server process: throughput with 1 and 8 clients, latency of a 16-token sample. */
const MODEL = 'Qwen/Qwen3.5-2B';
const DURATION_MS = Number(process.env.BENCH_DURATION_S ?? 5) * 1000;

export async function benchSampler(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const client = keepAliveClient(server.base);
  const send = async (method: string, path: string, body?: unknown) => (await client.send(method, path, body)).json;
  try {
    const session = (await send('POST', '/v1/loops/sessions')).session.id;
    const run = (await send('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 16 })).run;
    const sampler = new URL(run.sampler.base_url).pathname;
    const bodyFor = (cut: { top_p?: number; top_k?: number }) => ({
      prompt: { chunks: [{ type: 'encoded_text', tokens: Array.from({ length: 32 }, (_, i) => 100 + i) }] },
      num_samples: 1,
      sampling_params: { max_tokens: 16, temperature: 1, ...cut },
    });

    const measure = async (clients: number, body: unknown, ms = DURATION_MS) => {
      const latencies: number[] = [];
      let tokens = 0;
      const end = performance.now() + ms;
      const started = performance.now();
      await Promise.all(
        Array.from({ length: clients }, async () => {
          while (performance.now() < end) {
            const t = performance.now();
            const res = await send('POST', `${sampler}/sample`, body);
            latencies.push(performance.now() - t);
            tokens += res.sequences[0].tokens.length;
          }
        }),
      );
      latencies.sort((a, b) => a - b);
      const q = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))]!;
      return { rate: tokens / ((performance.now() - started) / 1000), p50: q(0.5), p99: q(0.99) };
    };
    // First the SDK's default sampling (temperature 1, no cut: what on-policy RL samples with, drawn inside the
    // graph), then the RL guide's cuts: top_k 50 (drawn inside the graph among the sorted candidates) and
    // top_p 0.95 alone (drawn inside the graph by rejection, the nucleus found only for the draws left open).
    const plainBody = bodyFor({});
    /**
     * One client's rate with a cut over its rate without, in five pairs of windows taken in turn: the machine's
     * speed drifts by 10 to 20% over a bench, which rates measured a minute apart would read as the cut's cost.
     */
    const versusNoCut = async (body: unknown) => {
      let withCut = 0;
      let without = 0;
      for (let i = 0; i < 5; i++) {
        without += (await measure(1, plainBody, DURATION_MS / 5)).rate;
        withCut += (await measure(1, body, DURATION_MS / 5)).rate;
      }
      return withCut / without;
    };
    for (const [label, cut] of [
      ['temperature 1', {}],
      ['temperature 1, top_k 50', { top_k: 50 }],
      ['temperature 1, top_p 0.95', { top_p: 0.95 }],
    ] as const) {
      const body = bodyFor(cut);
      const noCut = Object.keys(cut).length === 0;
      // Warm-up to the steady state, alone and concurrent: the graphs for single rows and for batches are built
      // on first use, and after 4096 rows decoded in batches the engine packs this adapter version's
      // unembedding into a session of its own (half a second, once).
      for (let i = 0; i < 3; i++) await send('POST', `${sampler}/sample`, body);
      let warmTokens = 0;
      await Promise.all(
        Array.from({ length: 8 }, async () => {
          do {
            // Not `warmTokens += await ...`: that reads warmTokens before the wait, and eight clients' counts overwrite each other.
            const res = await send('POST', `${sampler}/sample`, body);
            warmTokens += res.sequences[0].tokens.length;
          } while (noCut && warmTokens < 6144);
        }),
      );
      const one = await measure(1, body);
      const eight = await measure(8, body);
      figure(`sampler: ${label}, 1 client`, one.rate, 'tokens/s');
      figure(`sampler: ${label}, 8 clients / 1 client`, eight.rate / one.rate, 'x', { op: '>=', value: 3 });
      const ratio = noCut ? 1 : await versusNoCut(body);
      if (!noCut) figure(`sampler: ${label}, 1 client / the no-cut path`, ratio, 'x', { op: '>=', value: 0.8 });
      const versus = noCut ? '' : ` (${ratio.toFixed(2)}x the no-cut path, in windows taken in turn with it; target >= 0.8x)`;
      console.log(
        `sampler: 16-token samples (${label}), 1 client: ${one.rate.toFixed(0)} tokens/s${versus}, latency p50 ${one.p50.toFixed(0)} ms, p99 ${one.p99.toFixed(0)} ms`,
      );
      console.log(
        `sampler: 16-token samples (${label}), 8 concurrent clients: ${eight.rate.toFixed(0)} tokens/s (${(eight.rate / one.rate).toFixed(1)}x one client; target >= 3x), latency p50 ${eight.p50.toFixed(0)} ms, p99 ${eight.p99.toFixed(0)} ms`,
      );
    }
  } finally {
    client.close();
    server.stop();
  }
}
