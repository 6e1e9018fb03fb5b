import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { campaignRound, policyRound, type CallTimes } from './campaign-round.js';
import { figure } from './figures.js';
import { keepAliveClient, startAtReadyLine, startServerProcess } from './server-process.js';

/**
 * A CI client's first round (issue 29): sent the moment the ready line is printed, never later, against a warm
 * round of the same kind: on processes with an empty cache directory, and on processes started on the cache a
 * warm one left (a CI job's next step). The server runs on the Node that `node` on PATH is.
 */
type Round = (times?: CallTimes) => Promise<number>;
const ROUNDS: Record<string, (client: ReturnType<typeof keepAliveClient>) => Round> = {
  'campaign round': campaignRound,
  "RL guide's step (every sampling kind, the policy losses)": policyRound,
};

/** A round's calls side by side, first against warm, slowest first: where a first round still pays. */
function slowestCalls(first: CallTimes, warm: CallTimes): string {
  return first
    .map(([label, ms], i) => ({ label, ms, warm: warm[i]?.[1] ?? 0 }))
    .sort((a, b) => b.ms - b.warm - (a.ms - a.warm))
    .slice(0, 4)
    .map((c) => `${c.label} ${c.ms.toFixed(0)} ms (warm ${c.warm.toFixed(0)})`)
    .join(', ');
}

async function warmReference(root: string, cacheDir: string): Promise<Record<string, { ms: number; times: CallTimes }>> {
  const server = await startServerProcess(root, [], { LOOPS_MOCK_CACHE_DIR: cacheDir });
  const client = keepAliveClient(server.base, 1);
  try {
    // Warm means the warm-up is over: rounds meanwhile would share the cores with it.
    while ((await client.send('GET', '/healthz')).json.engine !== 'ready') await new Promise((r) => setTimeout(r, 50));
    const out: Record<string, { ms: number; times: CallTimes }> = {};
    for (const [name, make] of Object.entries(ROUNDS)) {
      const round = make(client);
      for (let i = 0; i < 2; i++) await round();
      const runs: { ms: number; times: CallTimes }[] = [];
      for (let i = 0; i < 3; i++) {
        const times: CallTimes = [];
        runs.push({ ms: await round(times), times });
      }
      runs.sort((a, b) => a.ms - b.ms);
      out[name] = runs[1]!;
    }
    return out;
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
}

/** Processes per figure: one first round is one sample of a noisy thing, the median of three is the figure. */
const PROCESSES = 3;

/**
 * Fresh processes, each round kind on processes of its own (so that each is that process's first round), sent at
 * the ready line: the median round of PROCESSES and the median ready line. `fresh` empties the cache before each.
 */
async function firstRounds(
  root: string,
  cacheDir: string,
  fresh: boolean,
): Promise<{ readyMs: number; rounds: Record<string, { ms: number; times: CallTimes }> }> {
  const out: Record<string, { ms: number; times: CallTimes }> = {};
  const ready: number[] = [];
  for (const [name, make] of Object.entries(ROUNDS)) {
    const runs: { ms: number; times: CallTimes }[] = [];
    for (let i = 0; i < PROCESSES; i++) {
      if (fresh) rmSync(cacheDir, { recursive: true, force: true });
      const server = await startAtReadyLine(root, [], { LOOPS_MOCK_CACHE_DIR: cacheDir });
      const client = keepAliveClient(server.base, 1);
      try {
        ready.push(server.startupMs);
        const times: CallTimes = [];
        runs.push({ ms: await make(client)(times), times });
      } finally {
        client.close();
        server.stop();
        await server.exited;
      }
    }
    runs.sort((a, b) => a.ms - b.ms);
    out[name] = runs[PROCESSES >> 1]!;
  }
  ready.sort((a, b) => a - b);
  return { readyMs: ready[ready.length >> 1]!, rounds: out };
}

export async function benchFirstRound(root: string): Promise<void> {
  const cacheDir = mkdtempSync(join(tmpdir(), 'loops-mock-bench-cache-'));
  try {
    const empty = mkdtempSync(join(tmpdir(), 'loops-mock-bench-cold-'));
    const cold = await firstRounds(root, empty, true);
    rmSync(empty, { recursive: true, force: true });
    // The reference fills the shared cache; the second process then starts on it.
    const warm = await warmReference(root, cacheDir);
    const second = await firstRounds(root, cacheDir, false);
    for (const [label, run] of [
      ['a first process (empty cache)', cold],
      ['a second process (the cache kept)', second],
    ] as const) {
      console.log(
        `first round: ${label}: ready line ${run.readyMs.toFixed(0)} ms after the process started, median of ${PROCESSES * Object.keys(ROUNDS).length} (target <= 500 ms; Node ${process.versions.node})`,
      );
      figure(`first round: ready line after the process starts, ${label}`, run.readyMs, 'ms', { op: '<=', value: 500 });
      for (const [name, first] of Object.entries(run.rounds)) {
        const ref = warm[name]!;
        const ratio = first.ms / ref.ms;
        console.log(
          `first round: ${label}: ${name} sent at the ready line ${first.ms.toFixed(0)} ms (median of ${PROCESSES} processes), warm ${ref.ms.toFixed(0)} ms: ${ratio.toFixed(2)}x (target <= 1.3x); slowest against warm: ${slowestCalls(first.times, ref.times)}`,
        );
        figure(`first round: ${name} at the ready line / warm, ${label}`, ratio, 'x', { op: '<=', value: 1.3 });
      }
    }
  } finally {
    rmSync(cacheDir, { recursive: true, force: true });
  }
}
