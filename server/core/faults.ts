import { invalid, notFound } from './errors.js';
import type { Surface } from './journal.js';
import { Prng } from '../../models/prng.js';

/** What a rule matches on; every field given must match, arrays mean any of. */
export interface FaultMatch {
  surface?: Surface | Surface[];
  method?: string | string[];
  /** A route template as /openapi.json writes it, e.g. /trainer/{run_id}/operations/{operation_id}. */
  route?: string | string[];
  /** A trainer operation (submitted, or the one a poll asks about) or a sampler route's last segment (sample, compute_logprobs, completions). */
  op?: string | string[];
  run_id?: string;
  sampler_id?: string;
  /** Header name → exact value, or "*" for present with any value. */
  headers?: Record<string, string>;
}

export type FaultAction =
  | { type: 'respond'; status: number; error_type?: string; message?: string; body?: unknown; headers?: Record<string, string>; retry_after_s?: number }
  | { type: 'delay'; ms: number }
  | { type: 'drop'; phase?: 'before' | 'after' }
  | { type: 'hold_poll' }
  | { type: 'fail_operation'; error_class: string; message?: string }
  | { type: 'deactivate' };

export const FAULT_ACTIONS = ['respond', 'delay', 'drop', 'hold_poll', 'fail_operation', 'deactivate'] as const;

export interface FaultRuleInput {
  match?: FaultMatch;
  action: FaultAction;
  /** Acts on the next N matches, then is spent. Absent: every match. */
  times?: number;
  /** Lets the first K matches through before acting. */
  skip?: number;
  /** Acts on a match with this probability, drawn from the rule's seeded generator. */
  probability?: number;
  /** Seed of the rule's generator (default: the server's fault seed). */
  seed?: number;
  /** A note shown in listings and in the journal. */
  description?: string;
}

export interface FaultRule extends FaultRuleInput {
  id: string;
  /** Requests that matched so far. */
  matched: number;
  /** Times it acted. */
  fired: number;
  /** Actions left when `times` is set; null for unlimited. */
  remaining: number | null;
}

/** A request as the fault rules see it: no HTTP objects, only what rules match on. */
export interface RequestFacts {
  surface: Surface;
  method: string;
  route: string | null;
  op?: string;
  run_id?: string;
  sampler_id?: string;
  headers: Record<string, string | undefined>;
  /** Whether the request is an operation poll and whether it submits one: some actions apply only there. */
  kind: 'poll' | 'submit' | 'other';
}

/** Actions that only make sense on some requests: elsewhere the rule does not match. */
function applicable(action: FaultAction, facts: RequestFacts): boolean {
  if (action.type === 'hold_poll') return facts.kind === 'poll';
  if (action.type === 'fail_operation') return facts.kind === 'submit';
  if (action.type === 'deactivate') return facts.run_id !== undefined || facts.sampler_id !== undefined;
  return true;
}

const anyOf = <T>(want: T | T[] | undefined, got: T | undefined) => want === undefined || (Array.isArray(want) ? want : [want]).some((w) => w === got);

/**
 * Fault rules: each matches requests precisely, then acts on them on the
 * next N matches, every match, or with a probability from its own seeded
 * generator (the same seed gives the same sequence of decisions).
 */
export class Faults {
  private rules: (FaultRule & { random: Prng })[] = [];
  private counter = 0;

  constructor(private defaultSeed = 1) {}

  add(input: FaultRuleInput): FaultRule {
    validateRule(input);
    const rule = {
      ...input,
      id: `fault_${++this.counter}`,
      matched: 0,
      fired: 0,
      remaining: input.times ?? null,
      random: new Prng(input.seed ?? this.defaultSeed),
    };
    this.rules.push(rule);
    return view(rule);
  }

  list(): FaultRule[] {
    return this.rules.map(view);
  }

  remove(id: string): FaultRule {
    const at = this.rules.findIndex((r) => r.id === id);
    if (at < 0) throw notFound(`No fault rule '${id}'. GET /_mock/faults lists them.`, { field: 'fault_id' });
    return view(this.rules.splice(at, 1)[0]!);
  }

  clear(): number {
    const n = this.rules.length;
    this.rules = [];
    return n;
  }

  set seed(seed: number) {
    this.defaultSeed = seed;
  }

  /** The first rule that matches and decides to act, with its action; the rule's counters move. */
  decide(facts: RequestFacts): { id: string; action: FaultAction } | undefined {
    for (const rule of this.rules) {
      if (rule.remaining === 0 || !matches(rule.match ?? {}, facts) || !applicable(rule.action, facts)) continue;
      rule.matched++;
      if (rule.skip !== undefined && rule.matched <= rule.skip) continue;
      // Drawn on every eligible match, so the sequence depends only on the seed and the match count.
      if (rule.probability !== undefined && !(rule.random.next() < rule.probability)) continue;
      rule.fired++;
      if (rule.remaining !== null) rule.remaining--;
      return { id: rule.id, action: rule.action };
    }
    return undefined;
  }
}

function matches(m: FaultMatch, f: RequestFacts): boolean {
  if (!anyOf(m.surface, f.surface) || !anyOf(m.route, f.route ?? undefined) || !anyOf(m.op, f.op)) return false;
  if (m.method !== undefined && !(Array.isArray(m.method) ? m.method : [m.method]).some((x) => x.toUpperCase() === f.method)) return false;
  if (m.run_id !== undefined && m.run_id !== f.run_id) return false;
  if (m.sampler_id !== undefined && m.sampler_id !== f.sampler_id) return false;
  for (const [name, want] of Object.entries(m.headers ?? {})) {
    const got = f.headers[name.toLowerCase()];
    if (got === undefined || (want !== '*' && got !== want)) return false;
  }
  return true;
}

function view(rule: FaultRule & { random?: Prng }): FaultRule {
  const { random: _random, ...rest } = rule;
  return structuredClone(rest);
}

/** RFC 9110's token: what a header name may be made of. */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const MAX_BODY_DEPTH = 32;
const MAX_BODY_BYTES = 64 * 1024;

/** How deeply a JSON value nests (without recursing, so a hostile depth cannot overflow the stack). */
function depthOf(value: unknown): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    deepest = Math.max(deepest, d);
    if (deepest > MAX_BODY_DEPTH) return deepest;
    for (const child of Object.values(v)) stack.push([child, d + 1]);
  }
  return deepest;
}

/** Checks what a schema cannot: combinations and ranges that depend on the action. */
function validateRule(input: FaultRuleInput): void {
  const a = input.action as FaultAction & Record<string, unknown>;
  const needs: Partial<Record<FaultAction['type'], string>> = { respond: 'status', delay: 'ms', fail_operation: 'error_class' };
  const field = needs[a.type];
  if (field && a[field] === undefined) throw invalid(`action.${field} is required for a '${a.type}' action.`, { field: `action.${field}` });
  if (a.type === 'respond' && !(a.status >= 400 && a.status <= 599))
    throw invalid(`action.status ${a.status} is not an error status: use 400..599.`, { field: 'action.status' });
  if (input.probability !== undefined && !(input.probability > 0 && input.probability <= 1))
    throw invalid(`probability must be in (0, 1], got ${input.probability}.`, { field: 'probability' });
  // Headers the rule sends or matches must be real header names and values: a space or CR/LF in them fails every answer later.
  for (const [where, headers] of [
    ['match.headers', input.match?.headers],
    ['action.headers', a.type === 'respond' ? a.headers : undefined],
  ] as const) {
    for (const [name, value] of Object.entries(headers ?? {})) {
      if (!HEADER_NAME.test(name))
        throw invalid(`${where} name '${name.slice(0, 60)}' is not an HTTP header name: use letters, digits and !#$%&'*+-.^_\`|~, no spaces.`, {
          field: `${where}.${name}`,
        });
      if (/[\r\n\0]/.test(value)) throw invalid(`${where}.${name} holds a CR, LF or NUL: a header value is one line.`, { field: `${where}.${name}` });
    }
  }
  // A body the rule answers with is sent as JSON on every match: it must serialise, shallowly enough, and small enough.
  if (a.type === 'respond' && a.body !== undefined) {
    if (depthOf(a.body) > MAX_BODY_DEPTH)
      throw invalid(`action.body nests more than ${MAX_BODY_DEPTH} levels deep, as deep as an injected body may go; send a flatter one.`, {
        field: 'action.body',
      });
    const size = JSON.stringify(a.body).length;
    if (size > MAX_BODY_BYTES)
      throw invalid(`action.body is ${size} bytes as JSON; an injected body may be at most ${MAX_BODY_BYTES}.`, { field: 'action.body' });
  }
  if (input.match?.route !== undefined) {
    for (const r of Array.isArray(input.match.route) ? input.match.route : [input.match.route]) {
      if (!r.startsWith('/') || r.includes(':'))
        throw invalid(`match.route '${r}' must be a route template such as /trainer/{run_id}/optim_step (parameters in braces, as /openapi.json lists them).`, {
          field: 'match.route',
        });
    }
  }
}
