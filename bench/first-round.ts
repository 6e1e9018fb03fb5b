import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { campaignRound, policyRound, type CallTimes } from './campaign-round.js';
import { figure } from './figures.js';
import { keepAliveClient, startAtReadyLine, startServerProcess } from './server-process.js';

/**
 * A CI client's first round (issue 29): sent the moment the ready line is printed, never later, against a warm
 * round of the same kind in the same process: on processes with an empty cache directory, and on processes
 * started on the cache an earlier one left (a CI job's next step). The server runs on the Node that `node` on PATH is.
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

/** One process's first round of a kind and its own warm round: a ratio within one process, whatever the machine's pace that minute. */
interface RoundPair {
  first: { ms: number; times: CallTimes };
  warm: { ms: number; times: CallTimes };
  ratio: number;
}

/** Rounds a process runs after its first before its warm figure, and the rounds that figure is the median of. */
const SETTLING_ROUNDS = 2;
const WARM_ROUNDS = 3;

async function warmRound(round: Round): Promise<{ ms: number; times: CallTimes }> {
  for (let i = 0; i < SETTLING_ROUNDS; i++) await round();
  const runs: { ms: number; times: CallTimes }[] = [];
  for (let i = 0; i < WARM_ROUNDS; i++) {
    const times: CallTimes = [];
    runs.push({ ms: await round(times), times });
  }
  runs.sort((a, b) => a.ms - b.ms);
  return runs[WARM_ROUNDS >> 1]!;
}

/** A process that runs each kind of round once and stops: what it keeps under `cacheDir` is what a second process finds. */
async function fillCache(root: string, cacheDir: string): Promise<void> {
  const server = await startServerProcess(root, [], { LOOPS_MOCK_CACHE_DIR: cacheDir });
  const client = keepAliveClient(server.base, 1);
  try {
    while ((await client.send('GET', '/healthz')).json.engine !== 'ready') await new Promise((r) => setTimeout(r, 50));
    for (const make of Object.values(ROUNDS)) await make(client)();
  } finally {
    client.close();
    server.stop();
    await server.exited;
  }
}

/**
 * Processes per figure: one first round is one sample of a noisy thing, the median of five is the figure. Each
 * ratio is a first round over the same process's warm round: the machine's pace drifts by a third over minutes
 * on shared cores, which a warm round taken in another process minutes away folded into the ratio.
 */
const PROCESSES = 5;

/**
 * Fresh processes, each round kind on processes of its own (so that each is that process's first round), sent at
 * the ready line, then that process's warm round: the median ratio of PROCESSES and the median ready line.
 * `fresh` empties the cache before each.
 */
async function firstRounds(root: string, cacheDir: string, fresh: boolean): Promise<{ readyMs: number; rounds: Record<string, RoundPair> }> {
  const out: Record<string, RoundPair> = {};
  const ready: number[] = [];
  for (const [name, make] of Object.entries(ROUNDS)) {
    const pairs: RoundPair[] = [];
    for (let i = 0; i < PROCESSES; i++) {
      if (fresh) rmSync(cacheDir, { recursive: true, force: true });
      const server = await startAtReadyLine(root, [], { LOOPS_MOCK_CACHE_DIR: cacheDir });
      const client = keepAliveClient(server.base, 1);
      try {
        ready.push(server.startupMs);
        const round = make(client);
        const times: CallTimes = [];
        const first = { ms: await round(times), times };
        const warm = await warmRound(round);
        pairs.push({ first, warm, ratio: first.ms / warm.ms });
      } finally {
        client.close();
        server.stop();
        await server.exited;
      }
    }
    pairs.sort((a, b) => a.ratio - b.ratio);
    out[name] = pairs[PROCESSES >> 1]!;
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
    // One process fills the shared cache; the second processes then start on it.
    await fillCache(root, cacheDir);
    const second = await firstRounds(root, cacheDir, false);
    for (const [label, run] of [
      ['a first process (empty cache)', cold],
      ['a second process (the cache kept)', second],
    ] as const) {
      console.log(
        `first round: ${label}: ready line ${run.readyMs.toFixed(0)} ms after the process started, median of ${PROCESSES * Object.keys(ROUNDS).length} (target <= 500 ms; Node ${process.versions.node})`,
      );
      figure(`first round: ready line after the process starts, ${label}`, run.readyMs, 'ms', { op: '<=', value: 500 });
      for (const [name, { first, warm, ratio }] of Object.entries(run.rounds)) {
        console.log(
          `first round: ${label}: ${name} sent at the ready line ${first.ms.toFixed(0)} ms, the same process warm ${warm.ms.toFixed(0)} ms: ${ratio.toFixed(2)}x, the median of ${PROCESSES} processes (target <= 1.3x); slowest against warm: ${slowestCalls(first.times, warm.times)}`,
        );
        figure(`first round: ${name} at the ready line / warm, ${label}`, ratio, 'x', { op: '<=', value: 1.3 });
      }
    }
  } finally {
    rmSync(cacheDir, { recursive: true, force: true });
  }
}
