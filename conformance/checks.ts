import type { JournalEntry } from '../server/core/journal.js';
import { EXPECTED_STEPS, type TaskName } from './tasks.js';

export type Level = 'MUST' | 'SHOULD';
export type Verdict = 'PASS' | 'FAIL' | 'SKIP';

/** What the client wrote to LOOPS_CONFORMANCE_OUTPUT. */
export interface ClientOutput {
  task?: string;
  status?: 'ok' | 'error';
  error?: { class?: string; message?: string };
  runs?: string[];
  [key: string]: unknown;
}

/** Everything a check may look at, gathered after the client exited. */
export interface Evidence {
  task: TaskName;
  scenario: string;
  /** Whether the scenario lets the task succeed ('ok') or makes it fail by design ('error'). */
  expect: 'ok' | 'error';
  /** Every request to the Loops surfaces, in arrival order, with whole bodies. */
  journal: JournalEntry[];
  output: ClientOutput | null;
  exit: { code: number | null; timedOut: boolean; stderrTail: string };
  /** The runs of the client's organisation as the mock holds them after the client exited. */
  runs: { id: string; status: string; reason: string | null }[];
}

export interface CheckResult {
  verdict: Verdict;
  reason?: string;
  /** Journal lines (or other facts) that show the failure. */
  evidence?: string[];
}

export interface Check {
  id: string;
  level: Level;
  rule: string;
  evaluate(e: Evidence): CheckResult;
}

const pass = (): CheckResult => ({ verdict: 'PASS' });
const skip = (reason: string): CheckResult => ({ verdict: 'SKIP', reason });
const fail = (reason: string, lines: (JournalEntry | string)[] = []): CheckResult => ({
  verdict: 'FAIL',
  reason,
  evidence: lines.slice(0, 12).map((l) => (typeof l === 'string' ? l : line(l))),
});

/** One journal entry as evidence: `#12 +1.203s POST /trainer/x/optim_step -> 200 [key k-1]`. */
export function line(e: JournalEntry): string {
  const h = e.headers;
  const extra = [
    h.idempotency_key && `Idempotency-Key ${h.idempotency_key}`,
    h.min_policy_version && `X-Min-Policy-Version ${h.min_policy_version}`,
    h.affinity_key && `X-Affinity-Key ${h.affinity_key}`,
    h.auth === 'none' && 'no Authorization',
    e.fault && `fault ${e.fault.action}`,
  ]
    .filter(Boolean)
    .join(', ');
  const resp = e.response
    ? Object.entries(e.response)
        .map(([k, v]) => `${k}=${String(v)}`)
        .join(' ')
    : '';
  return `#${e.seq} ${e.time.slice(11, 23)} ${e.method} ${e.path} -> ${e.status || 'dropped'}${resp ? ` (${resp})` : ''}${extra ? ` [${extra}]` : ''}`;
}

const POLL = '/trainer/{run_id}/operations/{operation_id}';
const isSubmit = (e: JournalEntry) => e.surface === 'trainer' && e.method === 'POST' && e.route !== null && /^\/trainer\/\{run_id\}\/[a-z_]+$/.test(e.route);
const isPoll = (e: JournalEntry) => e.route === POLL;
const at = (e: JournalEntry) => Date.parse(e.time);
/** When the answer went out (or the connection closed). */
const endOf = (e: JournalEntry) => at(e) + e.latency_ms;
const RATIO_LOSSES = new Set(['importance_sampling', 'ppo', 'cispo', 'dro', 'dppo']);

// biome-ignore lint/suspicious/noExplicitAny: a journal's recorded bodies are client JSON of any shape; the checks read nested fields and judge what they find, as the tests do
type Body = Record<string, any>;
const bodyOf = (e: JournalEntry) => (e.body ?? {}) as Body;
const resultOf = (e: JournalEntry) => ((e.response_body as Body | undefined)?.result ?? {}) as Body;

/** The operation each submission created (when its answer carried an id), and the submission that created each operation. */
function operations(j: JournalEntry[]) {
  const creator = new Map<string, JournalEntry>();
  for (const e of j) if (isSubmit(e) && e.operation_id && !creator.has(e.operation_id)) creator.set(e.operation_id, e);
  return creator;
}

/** Publications that completed: run, policy version, and the seq of the poll that saw them done. */
function publications(j: JournalEntry[]) {
  return j
    .filter((e) => isPoll(e) && e.op === 'save_weights_for_sampler' && e.response?.operation_status === 'done')
    .map((e) => ({ run: e.run_id!, version: Number(resultOf(e).policy_version ?? 0), seq: e.seq }));
}

/** The sampler paired with each run, from the answers to POST /v1/loops/runs. */
function samplerOfRun(j: JournalEntry[]): Map<string, string> {
  const map = new Map<string, string>();
  for (const e of j) {
    const run = (e.response_body as Body | undefined)?.run;
    // The sampler's id, not its URL: in proxy mode a base_url is Baseten's, which names no sampler id.
    const id: string | undefined = run?.sampler?.id;
    if (run?.id && id) map.set(run.id, id);
  }
  return map;
}

/** Sampled sequences the client received: tokens, logprobs, the version that produced them, on which sampler. */
function samples(j: JournalEntry[]) {
  return j
    .filter((e) => e.surface === 'sampler' && e.op === 'sample' && e.status === 200)
    .flatMap((e) => {
      const b = e.response_body as Body | undefined;
      return ((b?.sequences ?? []) as Body[]).map((s) => ({
        sampler: e.sampler_id!,
        version: Number(b!.policy_version),
        tokens: s.tokens as number[],
        logprobs: s.logprobs as number[],
        seq: e.seq,
      }));
    });
}

/** A datum's input tokens, its text chunks in order. */
function inputTokens(d: Body): number[] {
  return ((d.model_input?.chunks ?? []) as Body[]).flatMap((c) => (c.type === 'encoded_text' && Array.isArray(c.tokens) ? (c.tokens as number[]) : []));
}

/** Each ratio-loss datum: its completion (positions with a sampler logprob) and the sample it came from, if any. */
function ratioData(j: JournalEntry[]) {
  const pool = samples(j);
  const pairs = samplerOfRun(j);
  const out: { entry: JournalEntry; index: number; tokens: number[]; logprobs: number[]; match?: (typeof pool)[number] }[] = [];
  for (const e of j) {
    if (!(isSubmit(e) && e.op === 'forward_backward' && RATIO_LOSSES.has(bodyOf(e).loss_fn))) continue;
    ((bodyOf(e).data ?? []) as Body[]).forEach((d, index) => {
      const lp: number[] = d.loss_fn_inputs?.logprobs?.data ?? [];
      // With target_tokens, position k's logprob is of target k; without (the RL guide's datums), of input token k.
      const targets: number[] = d.loss_fn_inputs?.target_tokens?.data ?? inputTokens(d);
      const positions = lp.map((v, k) => (v !== 0 ? k : -1)).filter((k) => k >= 0);
      if (!positions.length) return;
      const tokens = positions.map((k) => targets[k]!);
      const logprobs = positions.map((k) => lp[k]!);
      const sampler = pairs.get(e.run_id!);
      const match = pool.find(
        (s) =>
          (sampler === undefined || s.sampler === sampler) &&
          s.seq < e.seq &&
          s.tokens.length === tokens.length &&
          s.tokens.every((t, i) => t === tokens[i]) &&
          s.logprobs.every((v, i) => Math.abs(v - logprobs[i]!) <= 1e-3),
      );
      out.push({ entry: e, index, tokens, logprobs, match });
    });
  }
  return out;
}

const DEPLOY_ROUTE = '/v1/loops/checkpoints/deploy';
const MODEL_DEPLOYMENT = '/v1/models/{model_id}/deployments/{deployment_id}';
/** A call to a deployed checkpoint's OpenAI-compatible door (chat or plain completions). */
const isInference = (e: JournalEntry) =>
  e.method === 'POST' && e.route !== null && e.route.startsWith('/model/{model_id}/') && /\/(chat\/)?completions$/.test(e.route);
const deploymentOf = (e: JournalEntry) => {
  const m = /^\/(?:v1\/)?models?\/([^/]+)\/deployments?\/([^/]+)/.exec(e.path);
  return m ? `${m[1]}/${m[2]}` : undefined;
};

/** Deployments the client made: `model_id/deployment_id` and the answer that made it. */
function deployments(j: JournalEntry[]) {
  return j
    .filter((e) => e.route === DEPLOY_ROUTE && e.method === 'POST' && e.status === 200)
    .map((e) => {
      const b = (e.response_body ?? {}) as Body;
      return { key: `${b.model_id}/${b.deployment_id}`, entry: e };
    });
}

export const CHECKS: Check[] = [
  {
    id: 'EXIT-1',
    level: 'MUST',
    rule: 'the client exits on its own within the timeout and writes its JSON result',
    evaluate: (e) => {
      if (e.exit.timedOut) return fail('killed at the timeout', [e.exit.stderrTail]);
      if (!e.output) return fail(`exited with code ${e.exit.code} and no readable LOOPS_CONFORMANCE_OUTPUT`, [e.exit.stderrTail]);
      return pass();
    },
  },
  {
    id: 'DONE-1',
    level: 'MUST',
    rule: 'the client completes the task when nothing in the scenario prevents it',
    evaluate: (e) => {
      if (e.expect === 'error') return skip('this scenario makes the task fail by design');
      if (e.output?.status === 'ok') return pass();
      return fail(`the task ended with ${e.output?.error?.class ?? 'no result'}: ${e.output?.error?.message ?? ''}`.trim(), [e.exit.stderrTail]);
    },
  },
  {
    id: 'AUTH-1',
    level: 'MUST',
    rule: 'every request to the control, trainer and sampler planes carries an Authorization header',
    evaluate: (e) => {
      const bare = e.journal.filter((x) => x.headers.auth === 'none' && !x.path.startsWith('/checkpoint-files/'));
      return bare.length ? fail(`${bare.length} request(s) without Authorization`, bare) : pass();
    },
  },
  {
    id: 'IDEM-1',
    level: 'MUST',
    rule: 'every trainer submission carries an Idempotency-Key',
    evaluate: (e) => {
      const subs = e.journal.filter(isSubmit);
      if (!subs.length) return skip('no trainer submissions');
      const bare = subs.filter((x) => !x.headers.idempotency_key);
      return bare.length ? fail(`${bare.length} submission(s) without Idempotency-Key`, bare) : pass();
    },
  },
  {
    id: 'IDEM-2',
    level: 'MUST',
    rule: 'a submission whose operation was lost (poll 404) or whose answer was lost (dropped connection, 5xx) is resubmitted with the same Idempotency-Key',
    evaluate: (e) => {
      const creator = operations(e.journal);
      const lost: { entry: JournalEntry; run: string; op: string; key: string | undefined }[] = [];
      for (const x of e.journal) {
        if (isSubmit(x) && (x.status === 0 || x.status >= 500)) lost.push({ entry: x, run: x.run_id!, op: x.op!, key: x.headers.idempotency_key });
        if (isPoll(x) && x.status === 404 && x.operation_id) {
          const c = creator.get(x.operation_id);
          if (c) lost.push({ entry: x, run: c.run_id!, op: c.op!, key: c.headers.idempotency_key });
        }
      }
      if (!lost.length) return skip('no submission or operation was lost in this run');
      const bad: (JournalEntry | string)[] = [];
      for (const l of lost) {
        const next = e.journal.find((x) => x.seq > l.entry.seq && isSubmit(x) && x.run_id === l.run && x.op === l.op);
        if (!next) bad.push(l.entry, `  no resubmission of ${l.op} followed`);
        else if (!l.key || next.headers.idempotency_key !== l.key) bad.push(l.entry, next);
      }
      return bad.length ? fail('a lost submission was resubmitted with another key (or none), or never', bad) : pass();
    },
  },
  {
    id: 'IDEM-3',
    level: 'MUST',
    rule: 'never more optimizer steps than the task asks for (no double step after a retry)',
    evaluate: (e) => {
      const steps = [...operations(e.journal).values()].filter((x) => x.op === 'optim_step');
      const allowed = EXPECTED_STEPS[e.task];
      if (steps.length > allowed) return fail(`${steps.length} optim_step operations created; the task asks for ${allowed}`, steps);
      return pass();
    },
  },
  {
    id: 'POLL-1',
    level: 'MUST',
    rule: 'after a 408 on an operation poll, the client polls again within a second (no giving up, no long sleep)',
    evaluate: (e) => {
      const timeouts = e.journal.filter((x) => isPoll(x) && x.status === 408);
      if (!timeouts.length) return skip('no operation poll timed out');
      const bad: (JournalEntry | string)[] = [];
      for (const t of timeouts) {
        const next = e.journal.find((x) => x.seq > t.seq && isPoll(x) && x.operation_id === t.operation_id);
        if (!next) bad.push(t, '  never polled again');
        else if (at(next) - endOf(t) > 1000) bad.push(t, next);
      }
      return bad.length ? fail('a 408 was not followed by a prompt re-poll', bad) : pass();
    },
  },
  {
    id: 'POLL-2',
    level: 'SHOULD',
    rule: 'an operation is not polled again after its poll answered done or error',
    evaluate: (e) => {
      const finished = new Map<string, JournalEntry>();
      const bad: JournalEntry[] = [];
      for (const x of e.journal) {
        if (!isPoll(x) || !x.operation_id) continue;
        const prior = finished.get(x.operation_id);
        if (prior) bad.push(prior, x);
        else if (x.status === 200) finished.set(x.operation_id, x);
      }
      if (!finished.size) return skip('no operation finished');
      return bad.length ? fail('finished operations were polled again', bad) : pass();
    },
  },
  {
    id: 'FLOOR-1',
    level: 'MUST',
    rule: "after publishing version V, every request to the run's sampler sends X-Min-Policy-Version >= V",
    evaluate: (e) => {
      const pubs = publications(e.journal);
      if (!pubs.length) return skip('the client published no weights');
      const pairs = samplerOfRun(e.journal);
      const bad: JournalEntry[] = [];
      let checked = 0;
      for (const x of e.journal) {
        if (x.surface !== 'sampler' || !['sample', 'compute_logprobs', 'completions'].includes(x.op ?? '')) continue;
        const floor = Math.max(-1, ...pubs.filter((p) => p.seq < x.seq && pairs.get(p.run) === x.sampler_id).map((p) => p.version));
        if (floor < 0) continue;
        checked++;
        const sent = x.headers.min_policy_version === undefined ? -1 : Number(x.headers.min_policy_version);
        if (sent < floor) bad.push(x);
      }
      if (!checked) return skip('no sampling request followed a publication');
      return bad.length ? fail('sampling requests after a publish without a floor at the published version', bad) : pass();
    },
  },
  {
    id: 'FLOOR-2',
    level: 'MUST',
    rule: 'a sampler 408 is retried, with growing backoff and at most 20 requests a second to one sampler',
    evaluate: (e) => {
      const sampler = e.journal.filter((x) => x.surface === 'sampler');
      const refusals = sampler.filter((x) => x.status === 408);
      if (!refusals.length) return skip('no sampler request was refused with 408');
      const bad: (JournalEntry | string)[] = [];
      let lastGap = 0;
      for (const r of refusals) {
        const next = sampler.find((x) => x.seq > r.seq && x.sampler_id === r.sampler_id && x.route === r.route);
        if (!next) {
          bad.push(r, '  never retried');
          continue;
        }
        const gap = at(next) - endOf(r);
        if (next.status === 408 && lastGap > 0 && gap < lastGap * 0.5)
          bad.push(r, next, `  backoff shrank from ${Math.round(lastGap)} ms to ${Math.round(gap)} ms`);
        lastGap = next.status === 408 ? gap : 0;
      }
      for (let i = 0; i < sampler.length; i++) {
        const inWindow = sampler.filter((x) => x.sampler_id === sampler[i]!.sampler_id && at(x) >= at(sampler[i]!) && at(x) < at(sampler[i]!) + 1000);
        if (inWindow.length > 20) {
          bad.push(sampler[i]!, `  ${inWindow.length} requests within one second`);
          break;
        }
      }
      return bad.length ? fail('408s were not retried with a growing, bounded backoff', bad) : pass();
    },
  },
  {
    id: 'FLOOR-3',
    level: 'MUST',
    rule: 'samples used for training come from a policy version at least the one published before they were requested',
    evaluate: (e) => {
      const data = ratioData(e.journal).filter((d) => d.match);
      if (!data.length) return skip('no ratio-loss training on sampled data');
      const pubs = publications(e.journal);
      const bad: (JournalEntry | string)[] = [];
      for (const d of data) {
        const floor = Math.max(0, ...pubs.filter((p) => p.run === d.entry.run_id && p.seq < d.match!.seq).map((p) => p.version));
        if (d.match!.version < floor)
          bad.push(d.entry, `  datum ${d.index} was sampled at policy version ${d.match!.version}, after version ${floor} was published`);
      }
      return bad.length ? fail('stale samples were trained on', bad) : pass();
    },
  },
  {
    id: 'RATIO-1',
    level: 'MUST',
    rule: "ratio losses are sent with the sampler's logprobs of the sampled tokens",
    evaluate: (e) => {
      const data = ratioData(e.journal);
      if (!data.length) return skip('no ratio-loss forward_backward with sampled completions');
      const bad = data.filter((d) => !d.match);
      return bad.length
        ? fail(
            `${bad.length} of ${data.length} datums carry logprobs that no sample answer gave for those tokens`,
            bad.map((d) => d.entry),
          )
        : pass();
    },
  },
  {
    id: 'ERR-1',
    level: 'MUST',
    rule: 'an operation that ends with status error is surfaced to the caller, not resubmitted more than once',
    evaluate: (e) => {
      const creator = operations(e.journal);
      const errors = e.journal.filter((x) => isPoll(x) && x.response?.operation_status === 'error' && x.response.error_class !== 'RunDeactivated');
      if (!errors.length) return skip('no operation ended with a user error');
      const bad: (JournalEntry | string)[] = [];
      const seen = new Set<string>();
      for (const x of errors) {
        const c = creator.get(x.operation_id!);
        if (!c || seen.has(JSON.stringify(c.body))) continue;
        seen.add(JSON.stringify(c.body));
        const again = e.journal.filter(
          (y) => y.seq > x.seq && isSubmit(y) && y.op === c.op && y.run_id === c.run_id && JSON.stringify(y.body) === JSON.stringify(c.body),
        );
        if (again.length > 1) bad.push(x, ...again.slice(0, 3), `  resubmitted ${again.length} times after the error`);
      }
      const classes = new Set(errors.map((x) => x.response!.error_class));
      if (e.output?.status !== 'error' || !classes.has(e.output.error?.class))
        bad.push(
          `  the client's result does not report the error (${[...classes].join(', ')}): ${JSON.stringify(e.output?.error ?? e.output?.status ?? null)}`,
        );
      return bad.length ? fail('a user error was retried or not surfaced', bad) : pass();
    },
  },
  {
    id: 'SHUT-1',
    level: 'MUST',
    rule: 'after a 5xx (503 shutting down or unavailable, injected 500), the client retries the request instead of failing',
    evaluate: (e) => {
      const errors = e.journal.filter((x) => x.status >= 500);
      if (!errors.length) return skip('no 5xx answers');
      const bad: (JournalEntry | string)[] = [];
      for (const x of errors) {
        const next = e.journal.find(
          (y) => y.seq > x.seq && y.method === x.method && y.route === x.route && y.run_id === x.run_id && y.sampler_id === x.sampler_id,
        );
        if (!next) bad.push(x, '  never retried');
      }
      return bad.length ? fail('5xx answers that were not retried', bad) : pass();
    },
  },
  {
    id: 'RATE-1',
    level: 'MUST',
    rule: 'after a 429 with Retry-After R, the request is retried, no sooner than R seconds later',
    evaluate: (e) => {
      const limited = e.journal.filter((x) => x.status === 429);
      if (!limited.length) return skip('no 429 answers');
      const bad: (JournalEntry | string)[] = [];
      for (const x of limited) {
        const next = e.journal.find(
          (y) => y.seq > x.seq && y.method === x.method && y.route === x.route && y.run_id === x.run_id && y.sampler_id === x.sampler_id,
        );
        const wait = Number(x.response?.retry_after ?? 0) * 1000;
        if (!next) bad.push(x, '  never retried');
        else if (at(next) - endOf(x) < wait * 0.9) bad.push(x, next, `  retried after ${Math.round(at(next) - endOf(x))} ms, Retry-After asked ${wait} ms`);
      }
      return bad.length ? fail('429s not honoured', bad) : pass();
    },
  },
  {
    id: 'DEPLOY-1',
    level: 'MUST',
    rule: 'only sampler checkpoints are deployed (a trainer checkpoint of the same name is told apart by target)',
    evaluate: (e) => {
      const sent = e.journal.filter((x) => x.route === DEPLOY_ROUTE && x.method === 'POST');
      if (!sent.length) return skip('no checkpoint was deployed');
      const targets = new Map<string, string>();
      for (const x of e.journal)
        if (x.route === '/v1/loops/checkpoints' && x.status === 200)
          for (const c of ((x.response_body as Body | undefined)?.checkpoints ?? []) as Body[]) targets.set(c.id, c.target);
      const bad: (JournalEntry | string)[] = [];
      for (const x of sent) {
        const trainerIds = ((bodyOf(x).checkpoint_ids ?? []) as string[]).filter((id) => targets.get(id) === 'trainer');
        if (trainerIds.length) bad.push(x, `  deploys trainer checkpoint(s) ${trainerIds.join(', ')}`);
      }
      return bad.length ? fail('a trainer checkpoint was sent to deploy', bad) : pass();
    },
  },
  {
    id: 'DEPLOY-2',
    level: 'MUST',
    rule: "a deployed checkpoint is called once it is ACTIVE: the client polls the deployment's status first, or retries the 503 of one still loading",
    evaluate: (e) => {
      const calls = e.journal.filter(isInference);
      if (!calls.length) return skip('no deployed checkpoint was called');
      const bad: (JournalEntry | string)[] = [];
      for (const key of new Set(calls.map(deploymentOf))) {
        const mine = calls.filter((x) => deploymentOf(x) === key);
        const first = mine[0]!;
        const sawActive = e.journal.some(
          (x) =>
            x.seq < first.seq &&
            x.route === MODEL_DEPLOYMENT &&
            x.method === 'GET' &&
            deploymentOf(x) === key &&
            (x.response_body as Body | undefined)?.status === 'ACTIVE',
        );
        const answered = mine.find((x) => x.status !== 503);
        if (!sawActive && answered?.status !== 200) bad.push(first, `  deployment ${key} was called before it was ACTIVE, and no call to it succeeded`);
      }
      return bad.length ? fail('a deployment was called before it was ready', bad) : pass();
    },
  },
  {
    id: 'DEPLOY-3',
    level: 'SHOULD',
    rule: 'every deployment the client made is deactivated before it exits',
    evaluate: (e) => {
      const made = deployments(e.journal);
      if (!made.length) return skip('no checkpoint was deployed');
      const left = made.filter(
        (d) =>
          !e.journal.some(
            (x) => x.seq > d.entry.seq && x.method === 'POST' && x.route === `${MODEL_DEPLOYMENT}/deactivate` && x.status === 200 && deploymentOf(x) === d.key,
          ),
      );
      return left.length
        ? fail(
            `${left.length} deployment(s) left running`,
            left.map((d) => `  ${d.key}`),
          )
        : pass();
    },
  },
  {
    id: 'CLEAN-1',
    level: 'MUST',
    rule: 'every run the client created is INACTIVE when it exits, on success and on failure',
    evaluate: (e) => {
      if (!e.runs.length) return skip('the client created no run');
      const live = e.runs.filter((r) => r.status !== 'INACTIVE');
      return live.length
        ? fail(
            `${live.length} run(s) still active after the client exited`,
            live.map((r) => `run ${r.id} is ${r.status}`),
          )
        : pass();
    },
  },
  {
    id: 'LOSS-1',
    level: 'MUST',
    rule: 'in the SFT round the eval loss after training is below the baseline',
    evaluate: (e) => {
      if (e.task !== 'sft-round' || e.expect === 'error') return skip('only the sft-round task, when it can complete');
      const evals = e.journal.filter((x) => isPoll(x) && x.op === 'forward' && x.response?.operation_status === 'done');
      if (evals.length < 2) return fail(`${evals.length} eval forward result(s) seen; the round needs a baseline and a final one`, evals);
      const first = Number(resultOf(evals[0]!).loss);
      const last = Number(resultOf(evals[evals.length - 1]!).loss);
      return last < first ? pass() : fail(`eval loss went from ${first} to ${last}`, [evals[0]!, evals[evals.length - 1]!]);
    },
  },
];
