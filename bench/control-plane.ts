import autocannon from 'autocannon';
import { BENCH_KEY, startServerProcess } from './server-process.js';
import { figure } from './figures.js';

/** Control-plane figures from a real server process on a real port. */
const KEY = BENCH_KEY;
const CONNECTIONS = 32;
const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);

async function json(url: string, method = 'GET', body?: unknown): Promise<any> {
  const res = await fetch(url, {
    method,
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
    body: body ? JSON.stringify(body) : method === 'POST' ? '{}' : undefined,
  });
  return res.json();
}

export async function benchControlPlane(root: string): Promise<void> {
  const server = await startServerProcess(root);
  const base = server.base;
  const startupMs = server.startupMs;
  try {
    const session = (await json(`${base}/v1/loops/sessions`, 'POST')).session.id;
    const runs = [];
    for (let i = 0; i < 20; i++) runs.push((await json(`${base}/v1/loops/runs`, 'POST', { session_id: session, base_model: 'Qwen/Qwen3-8B' })).run);
    console.log(`control plane: startup to first 200: ${startupMs.toFixed(0)} ms (target < 500 ms)`);
    figure('control plane: start to first 200', startupMs, 'ms', { op: '<', value: 500 });
    console.log(`control plane: ${CONNECTIONS} connections, ${DURATION_S} s per route`);
    const routes: [string, autocannon.Options][] = [
      ['GET  /v1/loops/runs/{run_id}', { url: `${base}/v1/loops/runs/${runs[0].id}` }],
      ['GET  /v1/loops/runs (20 runs)', { url: `${base}/v1/loops/runs` }],
      ['GET  /v1/loops/capabilities', { url: `${base}/v1/loops/capabilities` }],
      ['POST /v1/loops/sessions', { url: `${base}/v1/loops/sessions`, method: 'POST', body: '{}' }],
      ['GET  /v1/loops/sessions/{session_id}', { url: `${base}/v1/loops/sessions/${session}` }],
      ['GET  /v1/loops/deployments (20)', { url: `${base}/v1/loops/deployments` }],
      ['GET  /v1/loops/samplers (20)', { url: `${base}/v1/loops/samplers` }],
      ['GET  /v1/loops/deployments/{id}/logs', { url: `${base}/v1/loops/deployments/${runs[0].deployment_id}/logs` }],
      ['GET  /v1/loops/checkpoints?run_id', { url: `${base}/v1/loops/checkpoints?run_id=${runs[0].id}` }],
      ['GET  /v1/teams', { url: `${base}/v1/teams` }],
      ['GET  /v1/loops/user_config', { url: `${base}/v1/loops/user_config` }],
    ];
    console.log('  route                                  req/s     p50 ms   p99 ms');
    let worstP99 = 0;
    const headers = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
    for (const [name, opts] of routes) {
      // Warm up first: JIT compilation and first-use allocations are not steady-state latency.
      await autocannon({ ...opts, connections: CONNECTIONS, duration: 1, headers });
      const r = await autocannon({ ...opts, connections: CONNECTIONS, duration: DURATION_S, headers });
      if (r.non2xx || r.errors) throw new Error(`${name}: ${r.non2xx} non-2xx answers, ${r.errors} errors`);
      worstP99 = Math.max(worstP99, r.latency.p99);
      figure(`control plane: ${name.replace(/\s+/g, ' ')} req/s`, r.requests.average, 'req/s');
      figure(`control plane: ${name.replace(/\s+/g, ' ')} p99`, r.latency.p99, 'ms', { op: '<', value: 5 });
      console.log(
        `  ${name.padEnd(36)} ${r.requests.average.toFixed(0).padStart(8)} ${r.latency.p50.toFixed(1).padStart(9)} ${r.latency.p99.toFixed(1).padStart(8)}`,
      );
    }
    console.log(`control plane: worst p99 ${worstP99.toFixed(1)} ms (target < 5 ms)`);
  } finally {
    server.stop();
  }
}
