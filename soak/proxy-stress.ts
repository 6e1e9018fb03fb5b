import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { Worker } from 'node:worker_threads';
import { BENCH_KEY, residentBytes, startServerProcess } from '../bench/server-process.js';

/**
 * Proxy mode under abuse, against one server process: a burst of concurrent
 * tunnels to new `model-<id>.api.baseten.co` names (each a TLS handshake the
 * client verifies with the CA), then a flood of CONNECTs whose client closes
 * at once, under a file-descriptor limit like a default shell's; the whole
 * twice, with other names the second time. All the while a prober sends
 * direct requests on new connections, one after another: the worst latency
 * and the failures it sees are what every other client of the server would
 * see. Memory is compared after the first round and after the second, so
 * what the first burst grows once (socket and TLS buffers) is not counted,
 * and what piles up per name (certificates) is.
 */

export interface ProxyStressOptions {
  /** Concurrent tunnels in each round, each to a host name not used before. */
  names: number;
  /** CONNECTs in each round closed by their client right after sending them. */
  aborted: number;
  /** The server's open-file limit (prlimit); null leaves it as inherited. */
  fdLimit: number | null;
}

export interface ProxyStressFigures {
  /** Per round (two rounds). */
  names: number;
  handshakes: number;
  /** Tunnels that failed: a refused or reset CONNECT, a failed or unverified handshake. */
  handshakeResets: number;
  /** Server CPU per tunnel of the bursts (CONNECT, handshake, close), ms; null where /proc is not there. */
  cpuMsPerTunnel: number | null;
  /** Distinct leaf certificates the tunnels were shown. */
  distinctLeaves: number;
  aborted: number;
  /** The limit actually applied to the server, or null when none could be. */
  fdLimit: number | null;
  directProbes: number;
  directFailures: number;
  directWorstMs: number;
  /** Resident memory of the server after the first round and after the second, MB (null where /proc is not there). */
  rssFirstMb: number | null;
  rssSecondMb: number | null;
  failures: string[];
}

const HANDSHAKE_LIMIT_MS = 30_000;
const ABORT_WAVE = 100;

/** Opens a tunnel through the proxy and completes a verified handshake for `host`; resolves with the leaf's fingerprint. */
function tunnel(port: number, host: string, ca: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`${host}: no handshake within ${HANDSHAKE_LIMIT_MS / 1000} s`));
    }, HANDSHAKE_LIMIT_MS);
    const fail = (err: Error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(new Error(`${host}: ${err.message}`));
    };
    socket.on('error', fail);
    socket.once('connect', () => socket.write(`CONNECT ${host}:443 HTTP/1.1\r\nHost: ${host}:443\r\n\r\n`));
    let head = '';
    const onData = (chunk: Buffer) => {
      head += chunk.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      socket.off('data', onData);
      if (!head.startsWith('HTTP/1.1 200')) return fail(new Error(`CONNECT answered ${head.split('\r\n')[0]}`));
      const tls = tlsConnect({ socket, servername: host, ca });
      tls.on('error', fail);
      tls.once('secureConnect', () => {
        clearTimeout(timer);
        const fingerprint = tls.getPeerX509Certificate()?.fingerprint256 ?? '';
        tls.destroy();
        resolve(fingerprint);
      });
    };
    socket.on('data', onData);
  });
}

/** A CONNECT whose client is gone as soon as it is sent. */
function abortedConnect(port: number): Promise<void> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1', () =>
      socket.write('CONNECT api.baseten.co:443 HTTP/1.1\r\nHost: api.baseten.co:443\r\n\r\n', () => socket.destroy()),
    );
    socket.on('error', () => resolve());
    socket.once('close', () => resolve());
  });
}

/**
 * The prober, in a thread of its own so that the bursts' client work (hundreds
 * of handshakes in this process) does not delay it: direct requests on new
 * connections (what a fresh client needs: an accepted socket), one after
 * another until told to stop; it answers each one's wall time, or why it failed.
 */
const PROBER = `
const { parentPort, workerData } = require('node:worker_threads');
const { request } = require('node:http');
let probing = true;
parentPort.on('message', () => { probing = false; });
const probe = () => new Promise((resolve) => {
  const started = performance.now();
  const req = request(workerData.url, { headers: { authorization: workerData.auth, connection: 'close' }, timeout: 20000 }, (res) => {
    res.resume();
    res.on('end', () => resolve({ ms: performance.now() - started, error: res.statusCode === 200 ? undefined : 'status ' + res.statusCode }));
  });
  req.on('timeout', () => req.destroy(new Error('no answer within 20 s')));
  req.on('error', (err) => resolve({ ms: performance.now() - started, error: err.message }));
  req.end();
});
(async () => {
  const latencies = [];
  const errors = [];
  while (probing) {
    const { ms, error } = await probe();
    latencies.push(ms);
    if (error) errors.push(error);
    await new Promise((r) => setTimeout(r, 5));
  }
  parentPort.postMessage({ latencies, errors });
})();
`;

function startProber(base: string): { stop(): Promise<{ latencies: number[]; errors: string[] }> } {
  const worker = new Worker(PROBER, { eval: true, workerData: { url: `${base}/v1/loops/capabilities`, auth: `Bearer ${BENCH_KEY}` } });
  const done = new Promise<{ latencies: number[]; errors: string[] }>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  return {
    stop: async () => {
      worker.postMessage('stop');
      const result = await done;
      await worker.terminate();
      return result;
    },
  };
}

function rssMb(pid: number): number | null {
  try {
    return residentBytes(pid) / 1048576;
  } catch {
    return null;
  }
}

/** CPU time the server has used, ms (user and system; null where /proc is not there): a figure the machine's load does not move. */
function cpuMs(pid: number): number | null {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8')
      .replace(/^.*\) /, '')
      .split(' ');
    // utime and stime, fields 14 and 15 of stat (12 and 13 after the name), in clock ticks of 10 ms.
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return null;
  }
}

function limitFiles(pid: number, limit: number | null): number | null {
  if (limit === null) return null;
  try {
    execFileSync('prlimit', ['--pid', String(pid), `--nofile=${limit}:${limit}`], { stdio: 'ignore' });
    return limit;
  } catch {
    return null;
  }
}

export async function runProxyStress(root: string, options: ProxyStressOptions): Promise<ProxyStressFigures> {
  const dir = mkdtempSync(join(tmpdir(), 'loops-mock-soak-proxy-'));
  const caDir = join(dir, 'ca');
  // No engine warm-up: its work on the main thread would be counted against the proxy.
  const server = await startServerProcess(root, ['--proxy', '--ca-dir', caDir, '--log-level', 'silent', '--warm', 'none']);
  const port = Number(new URL(server.base).port);
  const failures: string[] = [];
  try {
    const ca = readFileSync(join(caDir, 'ca.pem'), 'utf8');
    const fdLimit = limitFiles(server.pid, options.fdLimit);
    // Warm the intercept path once, so the figures are the bursts', not the first handshake's.
    await tunnel(port, 'api.baseten.co', ca);
    // And let the start's background work (schemas compiled after listening) end first.
    await new Promise((r) => setTimeout(r, 1000));

    const prober = startProber(server.base);

    const leaves = new Set<string>();
    let handshakeResets = 0;
    const rss: (number | null)[] = [];
    let burstCpu: number | null = 0;
    for (let round = 0; round < 2; round++) {
      const stamp = `${Date.now().toString(36)}r${round}n`;
      const cpuBefore = cpuMs(server.pid);
      const results = await Promise.allSettled(Array.from({ length: options.names }, (_, i) => tunnel(port, `model-${stamp}${i}.api.baseten.co`, ca)));
      const cpuAfter = cpuMs(server.pid);
      burstCpu = burstCpu === null || cpuBefore === null || cpuAfter === null ? null : burstCpu + cpuAfter - cpuBefore;
      for (const r of results) {
        if (r.status === 'fulfilled') leaves.add(r.value);
        else {
          handshakeResets++;
          if (failures.length < 40) failures.push(`tunnel: ${(r.reason as Error).message}`);
        }
      }
      for (let sent = 0; sent < options.aborted; sent += ABORT_WAVE) {
        await Promise.all(Array.from({ length: Math.min(ABORT_WAVE, options.aborted - sent) }, () => abortedConnect(port)));
      }
      // Long enough for sockets the server wrongly keeps (it used to keep them 10 s) to be felt by new clients.
      await new Promise((r) => setTimeout(r, 2000));
      rss.push(rssMb(server.pid));
    }
    const { latencies, errors } = await prober.stop();
    const directFailures = errors.length;
    failures.push(...errors.slice(0, 20).map((e) => `direct request: ${e}`));
    // A leaf shown for every name must verify for each of them (the client checked it), and be one certificate.
    for (const fingerprint of leaves) if (!fingerprint) failures.push('a tunnel showed no certificate');
    return {
      names: options.names,
      handshakes: 2 * options.names - handshakeResets,
      handshakeResets,
      cpuMsPerTunnel: burstCpu === null || options.names === 0 ? null : Math.round((burstCpu / (2 * options.names)) * 100) / 100,
      distinctLeaves: leaves.size,
      aborted: options.aborted,
      fdLimit,
      directProbes: latencies.length,
      directFailures,
      directWorstMs: Math.round(Math.max(0, ...latencies) * 10) / 10,
      rssFirstMb: rss[0] ?? null,
      rssSecondMb: rss[1] ?? null,
      failures,
    };
  } finally {
    server.stop();
    await server.exited;
    rmSync(dir, { recursive: true, force: true });
  }
}

/** RSS growth allowed from the first round to the second: a leaf per name (about 136 KB each, as before) would exceed it at 300 names. */
const RSS_GROWTH_MB = 20;

export function proxyStressTargets(f: ProxyStressFigures): { figure: string; value: string; target: string; met: boolean }[] {
  const growth = f.rssFirstMb === null || f.rssSecondMb === null ? null : f.rssSecondMb - f.rssFirstMb;
  return [
    {
      figure: `proxy: direct request worst latency during 2 x (${f.names} new names, ${f.aborted} aborted CONNECTs)`,
      value: `${f.directWorstMs} ms`,
      target: '< 1000 ms',
      met: f.directWorstMs < 1000,
    },
    { figure: 'proxy: direct requests failed', value: String(f.directFailures), target: '0', met: f.directFailures === 0 },
    { figure: 'proxy: tunnel handshakes reset or refused', value: `${f.handshakeResets} of ${2 * f.names}`, target: '0', met: f.handshakeResets === 0 },
    {
      figure: 'proxy: server CPU per new-name tunnel',
      value: f.cpuMsPerTunnel === null ? 'n/a (no /proc)' : `${f.cpuMsPerTunnel} ms`,
      target: '< 5 ms',
      met: f.cpuMsPerTunnel === null || f.cpuMsPerTunnel < 5,
    },
    { figure: 'proxy: leaf certificates shown for the new names', value: String(f.distinctLeaves), target: '1', met: f.distinctLeaves === 1 },
    {
      figure: 'proxy: server RSS growth, second round over first',
      value: growth === null ? 'n/a (no /proc)' : `${growth.toFixed(1)} MB`,
      target: `< ${RSS_GROWTH_MB} MB`,
      met: growth === null || growth < RSS_GROWTH_MB,
    },
  ];
}
