import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, ProxyAgent, request } from 'undici';
import { BENCH_KEY, startServerProcess } from './server-process.js';
import { figure } from './figures.js';

/** Proxy mode's cost: a request through the proxy on a kept-alive connection against the same request direct, and a new tunnel's TLS handshake. */
const REQUESTS = Number(process.env.BENCH_PROXY_REQUESTS ?? 2000);
const HANDSHAKES = 40;

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** Sequential requests on one kept-alive connection: each one's wall time, in ms, sorted. */
async function latencies(url: string, dispatcher: Agent | ProxyAgent, count: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    const res = await request(url, { dispatcher, headers: { authorization: `Bearer ${BENCH_KEY}` } });
    await res.body.arrayBuffer();
    if (res.statusCode !== 200) throw new Error(`${url}: ${res.statusCode}`);
    out.push(performance.now() - started);
  }
  return out.sort((a, b) => a - b);
}

export async function benchProxy(root: string): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'bench-proxy-'));
  const caDir = join(dir, 'ca');
  const server = await startServerProcess(root, ['--proxy', '--ca-dir', caDir]);
  const ca = readFileSync(join(caDir, 'ca.pem'), 'utf8');
  const direct = new Agent({ connections: 1 });
  const proxied = new ProxyAgent({ uri: server.base, requestTls: { ca }, connections: 1 });
  try {
    const directUrl = `${server.base}/v1/loops/capabilities`;
    const proxiedUrl = 'https://api.baseten.co/v1/loops/capabilities';
    // Warm both paths (JIT, the leaf certificate) before measuring; then interleave rounds so drift hits both alike.
    await latencies(directUrl, direct, 300);
    await latencies(proxiedUrl, proxied, 300);
    const a: number[] = [];
    const b: number[] = [];
    for (let round = 0; round < 4; round++) {
      a.push(...(await latencies(directUrl, direct, REQUESTS / 4)));
      b.push(...(await latencies(proxiedUrl, proxied, REQUESTS / 4)));
    }
    a.sort((x, y) => x - y);
    b.sort((x, y) => x - y);
    const [d50, d99, p50, p99] = [percentile(a, 50), percentile(a, 99), percentile(b, 50), percentile(b, 99)];
    console.log(`proxy: GET /v1/loops/capabilities on one kept-alive connection, ${REQUESTS} requests each way`);
    console.log(`  direct         p50 ${d50.toFixed(3)} ms   p99 ${d99.toFixed(3)} ms`);
    console.log(`  through proxy  p50 ${p50.toFixed(3)} ms   p99 ${p99.toFixed(3)} ms`);
    console.log(`proxy: added latency p50 ${(p50 - d50).toFixed(3)} ms (target < 1 ms), p99 ${(p99 - d99).toFixed(3)} ms`);
    figure('proxy: added latency p50', p50 - d50, 'ms', { op: '<', value: 1 });
    // A new tunnel each time: CONNECT, TLS handshake under the cached leaf, one request.
    const handshakes: number[] = [];
    for (let i = 0; i < HANDSHAKES; i++) {
      const fresh = new ProxyAgent({ uri: server.base, requestTls: { ca } });
      const started = performance.now();
      const res = await request(proxiedUrl, { dispatcher: fresh, headers: { authorization: `Bearer ${BENCH_KEY}` } });
      await res.body.arrayBuffer();
      handshakes.push(performance.now() - started);
      await fresh.close();
    }
    handshakes.sort((x, y) => x - y);
    const handshake = percentile(handshakes, 50) - p50;
    console.log(
      `proxy: new connection (CONNECT + TLS handshake + first request) p50 ${percentile(handshakes, 50).toFixed(2)} ms, p99 ${percentile(handshakes, 99).toFixed(2)} ms: the handshake costs ~${handshake.toFixed(2)} ms`,
    );
  } finally {
    await direct.close();
    await proxied.close();
    server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}
