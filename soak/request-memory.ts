import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { BENCH_KEY, keepAliveClient, ok, residentBytes, startServerProcess, type KeepAliveClient } from '../bench/server-process.js';
import { soakClient } from './http.js';
import { MODEL } from './fuzz.js';

/**
 * What one request may cost the server in memory: each of the issue's
 * reproducers (issue 31 item 13) at the largest size the server's limits
 * accept, and just over it, each against a fresh server process, with the
 * process's peak resident memory (VmHWM) beside the 2 GB target and what
 * stays resident a few seconds after the answer. Over a limit the answer
 * must be a 400 naming the limit's flag; at the limit the request must be
 * carried out.
 */

/** No accepted request, and no burst at the advertised concurrency, may take the server past this. */
export const PEAK_TARGET_MB = 2048;

export interface MemoryCaseFigures {
  case: string;
  /** accepted: the request must be carried out (200, operation done); refused: a 400 naming `flag`. */
  expect: 'accepted' | 'refused';
  /** What came back: 200 / done, or the status and error type. */
  outcome: string;
  /** Whether the outcome is the one expected (for refused ones: a 400 whose message names the flag). */
  asExpected: boolean;
  beforeMb: number;
  peakMb: number;
  afterMb: number;
  seconds: number;
}

export interface RequestMemoryFigures {
  cases: MemoryCaseFigures[];
  failures: string[];
}

/** The limits the cases are sized against: the defaults of server/core/settings.ts (or what `serverArgs` set). */
export interface CaseLimits {
  /** max_sampled_tokens: num_samples x (prompt + max_tokens). */
  sampledTokens: number;
  /** max_batch_tokens: the positions of one forward/forward_backward, all datums together. */
  batchTokens: number;
  /** The body limit (bytes) and the burst's concurrency. */
  bodyBytes: number;
  concurrency: number;
}

export interface RequestMemoryOptions {
  limits: CaseLimits;
  /** Flags for every server (e.g. smaller limits, to run the suite at a tiny size). */
  serverArgs?: string[];
  /** Case names to run (default: all). */
  only?: string[];
  /** How long after the answer the resident memory is read. */
  settleMs?: number;
  /** Longest sequence the cases' runs and samplers declare. */
  maxSeqLen?: number;
}

interface Setup {
  base: string;
  client: KeepAliveClient;
  trainer: string;
  sampler: string;
}

type Send = (s: Setup) => Promise<string>;

interface MemoryCase {
  name: string;
  expect: 'accepted' | 'refused';
  /** The flag a refusal must name. */
  flag: string;
  rank: number;
  send: Send;
}

const tokens = (n: number, from = 100) => Array.from({ length: n }, (_, i) => from + (i % 5000));
const input = (ids: number[]) => ({ chunks: [{ type: 'encoded_text', tokens: ids }] });

/** A request's outcome as one word: `done` / `200`, else `<status> <type>: <message>`. */
async function answer(client: KeepAliveClient, path: string, body: unknown): Promise<string> {
  const res = await client.send('POST', path, body);
  return res.status === 200 ? '200' : `${res.status} ${res.json?.error?.type}: ${res.json?.error?.message}`;
}

/** A trainer operation to its end: `done`, or what refused or failed it. */
async function operation(s: Setup, op: string, body: unknown): Promise<string> {
  const submitted = await s.client.send('POST', `${s.trainer}/${op}`, body, { 'idempotency-key': randomUUID() });
  if (submitted.status !== 200) return `${submitted.status} ${submitted.json?.error?.type}: ${submitted.json?.error?.message}`;
  for (;;) {
    const res = await s.client.send('GET', `${s.trainer}/operations/${submitted.json.operation_id}`);
    if (res.status === 408) continue;
    if (res.status !== 200) return `${res.status} ${res.json?.error?.type}`;
    return res.json.status === 'done' ? 'done' : `error ${res.json.error?.error_class}: ${res.json.error?.message}`;
  }
}

/** The issue's reproducers, each at its limit and one unit over. */
function cases(l: CaseLimits, maxSeqLen: number): MemoryCase[] {
  // The issue's sample: a 4,096-token prompt (at most half the sequence), 512 new tokens, as many samples as the limit lets.
  const prompt = Math.min(4096, maxSeqLen / 2);
  const maxTokens = Math.min(512, maxSeqLen - prompt);
  const samplesAt = Math.min(128, Math.floor(l.sampledTokens / (prompt + maxTokens)));
  const sample =
    (n: number): Send =>
    (s) =>
      answer(s.client, `${s.sampler}/sample`, {
        prompt: input(tokens(prompt)),
        num_samples: n,
        sampling_params: { max_tokens: maxTokens, temperature: 1 },
        include_prompt_logprobs: true,
      });
  // The issue's completions: n, 256 tokens, 20 logprobs, echo.
  const completionTokens = Math.min(256, maxSeqLen - prompt);
  const nAt = Math.min(128, Math.floor(l.sampledTokens / (prompt + completionTokens)));
  const complete =
    (n: number): Send =>
    (s) =>
      answer(s.client, `${s.sampler}/v1/completions`, { prompt: tokens(prompt), n, max_tokens: completionTokens, logprobs: 20, echo: true });
  // The issue's long batch: datums of the longest sequence, as many as the token limit lets.
  const datum = (length: number) => ({
    model_input: input(tokens(length)),
    loss_fn_inputs: { target_tokens: { data: tokens(length, 101), dtype: 'int64', shape: [length] } },
  });
  const longBatch =
    (datums: number, extra: number): Send =>
    (s) =>
      operation(s, 'forward_backward', {
        data: [...Array.from({ length: datums }, () => datum(maxSeqLen)), ...(extra ? [datum(extra)] : [])],
        loss_fn: 'cross_entropy',
      });
  const longAt = Math.floor(l.batchTokens / maxSeqLen);
  // One-token datums, as many as the position limit lets (each datum is at least one position).
  const oneToken =
    (n: number): Send =>
    (s) =>
      operation(s, 'forward_backward', { data: Array.from({ length: n }, () => datum(1)), loss_fn: 'cross_entropy' });
  // A burst of the largest bodies at the advertised concurrency: each a forward too long for the run (a 400 each).
  const burst =
    (bytes: number): Send =>
    async (s) => {
      const ids = Math.floor(bytes / 6);
      const text = JSON.stringify({ data: [{ model_input: input(tokens(ids, 10_000)) }], loss_fn: 'cross_entropy' });
      const raw = soakClient(s.base, l.concurrency);
      try {
        const headers = { authorization: `Bearer ${BENCH_KEY}`, 'content-type': 'application/json' };
        const outcomes = await Promise.all(
          Array.from({ length: l.concurrency }, async () => {
            const o = await raw.send('POST', `${s.trainer}/forward`, text, headers);
            return o.kind === 'answer' ? String(o.answer.status) : o.kind;
          }),
        );
        const counts = new Map<string, number>();
        for (const o of outcomes) counts.set(o, (counts.get(o) ?? 0) + 1);
        return [...counts].map(([o, n]) => `${n} x ${o}`).join(', ');
      } finally {
        raw.close();
      }
    };
  return [
    { name: 'sample at max_sampled_tokens', expect: 'accepted', flag: 'max-sampled-tokens', rank: 4, send: sample(samplesAt) },
    { name: 'sample one sample over', expect: 'refused', flag: 'max-sampled-tokens', rank: 4, send: sample(samplesAt + 1) },
    { name: 'completions at max_sampled_tokens', expect: 'accepted', flag: 'max-sampled-tokens', rank: 4, send: complete(nAt) },
    { name: 'completions one over', expect: 'refused', flag: 'max-sampled-tokens', rank: 4, send: complete(nAt + 1) },
    {
      name: 'forward_backward at max_batch_tokens, rank 128',
      expect: 'accepted',
      flag: 'max-batch-tokens',
      rank: 128,
      send: longBatch(longAt, l.batchTokens - longAt * maxSeqLen),
    },
    {
      name: 'forward_backward one token over',
      expect: 'refused',
      flag: 'max-batch-tokens',
      rank: 128,
      send: longBatch(longAt, l.batchTokens - longAt * maxSeqLen + 1),
    },
    { name: 'forward_backward of one-token datums at max_batch_tokens', expect: 'accepted', flag: 'max-batch-tokens', rank: 4, send: oneToken(l.batchTokens) },
    { name: 'forward_backward one datum over', expect: 'refused', flag: 'max-batch-tokens', rank: 4, send: oneToken(l.batchTokens + 1) },
    // Each a 400 (too long) or a 503 (the bodies held at once are bounded); none may take the server past the target.
    { name: `${l.concurrency} concurrent bodies at the body limit`, expect: 'refused', flag: 'max-seq-len-limit', rank: 4, send: burst(l.bodyBytes - 1024) },
  ];
}

/** The server's default limits (server/core/settings.ts, --body-limit) and the concurrency the docs advertise (the soak's waves of 50). */
export const REQUEST_MEMORY_DEFAULTS: CaseLimits = { sampledTokens: 131_072, batchTokens: 8192, bodyBytes: 32 * 2 ** 20, concurrency: 50 };

/** Runs each case against a server process of its own, so each peak is that case's alone. */
export async function runRequestMemory(root: string, options: RequestMemoryOptions): Promise<RequestMemoryFigures> {
  const maxSeqLen = options.maxSeqLen ?? 8192;
  const figures: MemoryCaseFigures[] = [];
  const failures: string[] = [];
  for (const c of cases(options.limits, maxSeqLen)) {
    if (options.only && !options.only.some((o) => c.name.includes(o))) continue;
    const server = await startServerProcess(root, ['--log-level', 'silent', ...(options.serverArgs ?? [])]);
    const client = keepAliveClient(server.base, Math.max(2, options.limits.concurrency));
    try {
      const session = (await ok(client, 'POST', '/v1/loops/sessions')).session.id;
      const run = (
        await ok(client, 'POST', '/v1/loops/runs', {
          session_id: session,
          base_model: MODEL,
          lora_rank: c.rank,
          max_seq_len: maxSeqLen,
          name: 'request-memory',
        })
      ).run;
      const setup = { base: server.base, client, trainer: `/trainer/${run.id}`, sampler: `/sampler/${run.sampler.id}` };
      const beforeMb = residentBytes(server.pid) / 2 ** 20;
      const started = performance.now();
      const outcome = await c.send(setup);
      const seconds = (performance.now() - started) / 1000;
      const peakMb = residentBytes(server.pid, 'VmHWM') / 2 ** 20;
      await new Promise((r) => setTimeout(r, options.settleMs ?? 3000));
      const afterMb = residentBytes(server.pid) / 2 ** 20;
      const asExpected =
        c.expect === 'accepted'
          ? outcome === '200' || outcome === 'done'
          : c.name.includes('concurrent')
            ? /^(\d+ x (400|503)(, )?)+$/.test(outcome)
            : outcome.startsWith('400') && outcome.includes(c.flag);
      if (!asExpected)
        failures.push(`${c.name}: expected ${c.expect === 'accepted' ? 'it carried out' : `a 400 naming --${c.flag}`}, got ${outcome.slice(0, 300)}`);
      figures.push({ case: c.name, expect: c.expect, outcome: outcome.slice(0, 200), asExpected, beforeMb, peakMb, afterMb, seconds });
    } catch (err) {
      failures.push(`${c.name}: ${(err as Error).message}`);
    } finally {
      client.close();
      server.stop();
      await server.exited;
    }
  }
  return { cases: figures, failures };
}

/** One row per case: its peak beside the 2 GB target, and whether it was carried out or refused as it should be. */
export function requestMemoryTargets(f: RequestMemoryFigures): { figure: string; value: string; target: string; met: boolean }[] {
  return f.cases.flatMap((c) => [
    {
      figure: `request memory: ${c.case}: peak RSS`,
      value: `${c.peakMb.toFixed(0)} MB (${c.afterMb.toFixed(0)} MB ${(c.afterMb - c.beforeMb).toFixed(0)} MB over before, after)`,
      target: `<= ${PEAK_TARGET_MB} MB`,
      met: c.peakMb <= PEAK_TARGET_MB,
    },
    {
      figure: `request memory: ${c.case}: outcome`,
      value: c.outcome.slice(0, 80),
      target: c.expect === 'accepted' ? 'carried out' : '400 naming the limit',
      met: c.asExpected,
    },
  ]);
}

/** `tsx soak/request-memory.ts [case...]`: the cases at the default limits, as JSON (for measuring while choosing limits). */
if (import.meta.url === `file://${process.argv[1]}`) {
  const root = process.env.LOOPS_MOCK_ROOT ?? new URL('..', import.meta.url).pathname;
  const limits = JSON.parse(process.env.REQUEST_MEMORY_LIMITS ?? '{}') as Partial<CaseLimits>;
  const f = await runRequestMemory(root, {
    limits: { ...REQUEST_MEMORY_DEFAULTS, ...limits },
    only: process.argv.slice(2).length ? process.argv.slice(2) : undefined,
    serverArgs: (process.env.REQUEST_MEMORY_ARGS ?? '').split(' ').filter(Boolean),
  });
  const out = JSON.stringify(f, null, 1);
  if (process.env.REQUEST_MEMORY_OUT) writeFileSync(process.env.REQUEST_MEMORY_OUT, out);
  console.log(out);
}
