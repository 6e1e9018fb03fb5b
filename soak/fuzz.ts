import { Prng } from '../models/prng.js';
import { errorShapeProblem, soakClient, type Outcome } from './http.js';
import { chance, jsonWithRaw, nastyValue, pathsOf, pick, RAW, RAW_NUMBERS, replaceAt, valueOfSchema, type Hints, type Schema } from './schema-values.js';

/**
 * The seeded fuzz: every route /openapi.json lists, each case a valid body
 * or one mutation of it, sent over HTTP to a real server process. A case
 * fails when the server answers 5xx, answers an error in the wrong shape,
 * does not answer within 30 s, drops the connection, or accepts what is
 * invalid by the protocol's own rules (an unknown field, a missing required
 * one, a number beyond float64, broken JSON). Case i depends only on the
 * seed and i, so a failure printed with its index can be replayed.
 */

export const MODEL = 'Qwen/Qwen3.5-2B';

export interface Route {
  method: string;
  template: string;
  family: string;
  params: string[];
  query: { name: string; schema: Schema }[];
  body?: Schema;
}

export interface FuzzFigures {
  cases: number;
  byFamily: Record<string, number>;
  /** Answers by status, to show how deep the cases reach (2xx are valid requests the server carried out). */
  byStatus: Record<string, number>;
  fiveXx: number;
  wrongShape: number;
  hangs: number;
  transport: number;
  invalidAccepted: number;
  failures: string[];
}

export function emptyFuzzFigures(): FuzzFigures {
  return { cases: 0, byFamily: {}, byStatus: {}, fiveXx: 0, wrongShape: 0, hangs: 0, transport: 0, invalidAccepted: 0, failures: [] };
}

function familyOf(path: string): string {
  if (path.startsWith('/v1/teams')) return 'team';
  if (path.startsWith('/v1/models')) return 'generic';
  if (path.startsWith('/trainer')) return 'trainer';
  if (path.startsWith('/sampler')) return 'sampler';
  if (path.startsWith('/hf')) return 'hub';
  if (path.startsWith('/_mock/dashboard') || path.startsWith('/_mock/ui')) return 'dashboard';
  if (path.startsWith('/_mock')) return 'admin';
  return 'control';
}

/** Every route of the server's OpenAPI document. */
export function routesOf(openapi: any): Route[] {
  const routes: Route[] = [];
  for (const [template, methods] of Object.entries<any>(openapi.paths)) {
    for (const [method, op] of Object.entries<any>(methods)) {
      const parameters: any[] = op.parameters ?? [];
      routes.push({
        method: method.toUpperCase(),
        template,
        family: familyOf(template),
        params: [...template.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!),
        query: parameters.filter((p) => p.in === 'query').map((p) => ({ name: p.name, schema: p.schema ?? {} })),
        body: op.requestBody?.content?.['application/json']?.schema,
      });
    }
  }
  return routes;
}

/** Ids that exist on the server, so that cases reach the code behind the lookups. */
export interface FuzzContext {
  session: string;
  run: string;
  sampler: string;
  samplerModel: string;
  samplerDeployment: string;
  deployment: string;
  team: string;
  checkpoint: string;
  trainerPath: string;
  samplerPath: string;
  operation: string;
}

type Send = ReturnType<typeof soakClient>['send'];

async function json(send: Send, method: string, path: string, headers: Record<string, string>, body?: unknown): Promise<any> {
  const o = await send(method, path, body === undefined ? undefined : JSON.stringify(body), { ...headers, 'content-type': 'application/json' });
  if (o.kind !== 'answer' || o.answer.status >= 300)
    throw new Error(`fuzz setup: ${method} ${path}: ${o.kind === 'answer' ? `${o.answer.status} ${o.answer.text.slice(0, 300)}` : o.kind}`);
  return JSON.parse(o.answer.text);
}

async function operation(send: Send, headers: Record<string, string>, trainer: string, op: string, body: unknown): Promise<any> {
  const { operation_id } = await json(send, 'POST', `${trainer}/${op}`, headers, body);
  for (;;) {
    const o = await send('GET', `${trainer}/operations/${operation_id}`, undefined, headers);
    if (o.kind === 'answer' && o.answer.status === 408) continue;
    if (o.kind !== 'answer' || o.answer.status !== 200) throw new Error(`fuzz setup: ${op}: ${o.kind === 'answer' ? o.answer.text : o.kind}`);
    const result = JSON.parse(o.answer.text);
    if (result.status !== 'done') throw new Error(`fuzz setup: ${op}: ${o.answer.text}`);
    return { ...result.result, operation_id };
  }
}

export async function fuzzContext(send: Send, headers: Record<string, string>): Promise<FuzzContext> {
  const session = (await json(send, 'POST', '/v1/loops/sessions', headers, {})).session.id;
  const run = (await json(send, 'POST', '/v1/loops/runs', headers, { session_id: session, base_model: MODEL, lora_rank: 4, max_seq_len: 64 })).run;
  const trainer = `/trainer/${run.id}`;
  const saved = await operation(send, headers, trainer, 'save_state', { name: 'soak-base' });
  const published = await operation(send, headers, trainer, 'save_weights_for_sampler', { name: 'soak-pub' });
  const checkpoints = (await json(send, 'GET', `/v1/loops/checkpoints?run_id=${run.id}`, headers)).checkpoints;
  const team = (await json(send, 'GET', '/v1/teams', headers)).teams[0].id;
  return {
    session,
    run: run.id,
    sampler: run.sampler.id,
    samplerModel: run.sampler.model_id,
    samplerDeployment: run.sampler.deployment_id,
    deployment: run.deployment_id,
    team,
    checkpoint: checkpoints[0].id,
    trainerPath: saved.path,
    samplerPath: published.path,
    operation: published.operation_id,
  };
}

const tokens = (rng: Prng, n = 3) => Array.from({ length: n }, () => 1 + Math.floor(rng.next() * 1000));
const input = (ids: number[]) => ({ chunks: [{ type: 'encoded_text', tokens: ids }] });

/** Valid bodies where the schema alone cannot make one (targets as long as the tokens, a known loss). */
function seedBody(route: Route, ctx: FuzzContext, rng: Prng, n: number): unknown {
  const datum = () => {
    const ids = tokens(rng, 1 + Math.floor(rng.next() * 4));
    return { model_input: input(ids), loss_fn_inputs: { target_tokens: { data: ids.map((t) => t + 1), dtype: 'int64', shape: [ids.length] } } };
  };
  switch (`${route.method} ${route.template}`) {
    case 'POST /trainer/{run_id}/forward':
    case 'POST /trainer/{run_id}/forward_backward':
      return { data: [datum(), datum()], loss_fn: 'cross_entropy' };
    case 'POST /trainer/{run_id}/optim_step':
      return { adam_params: { learning_rate: 1e-4 } };
    case 'POST /trainer/{run_id}/save_state':
    case 'POST /trainer/{run_id}/save_weights_for_sampler':
      return { name: `soak-${n}` };
    case 'POST /trainer/{run_id}/load_state':
    case 'POST /trainer/{run_id}/load_state_with_optimizer':
      return { path: ctx.trainerPath };
    case 'POST /sampler/{sampler_id}/sample':
      return {
        prompt: input(tokens(rng)),
        num_samples: 1,
        sampling_params: { max_tokens: 3, temperature: chance(rng, 0.5) ? 0 : 1, top_p: chance(rng, 0.5) ? 0.9 : 1 },
      };
    case 'POST /sampler/{sampler_id}/compute_logprobs':
      return { prompt: input(tokens(rng)) };
    case 'POST /sampler/{sampler_id}/v1/completions':
      return { prompt: 'Hello', max_tokens: 3 };
    case 'POST /v1/loops/deployments/{deployment_id}/metrics':
      return { start_epoch_millis: Date.now() - 60_000, end_epoch_millis: Date.now() };
    case 'POST /_mock/faults':
      return { match: { surface: 'sampler' }, action: { status: 503 }, times: 1 };
    case 'POST /_mock/clock/advance':
      return { ms: 10 };
    default:
      return undefined;
  }
}

function hintsOf(ctx: FuzzContext, rng: Prng, n: number): Hints {
  return {
    session_id: () => ctx.session,
    run_id: () => ctx.run,
    sampler_id: () => ctx.sampler,
    reuse_from_run_id: () => ctx.run,
    reuse_from_session_id: () => ctx.session,
    base_model: () => MODEL,
    path: () => ctx.trainerPath,
    model_path: () => ctx.samplerPath,
    checkpoint_path: () => pick(rng, [ctx.trainerPath, ctx.samplerPath]),
    tokens: () => tokens(rng),
    name: () => `soak-${n}`,
    lora_rank: () => 4,
    max_seq_len: () => 64,
    max_tokens: () => 3,
    num_samples: () => 1,
  };
}

function paramValue(name: string, ctx: FuzzContext): string {
  switch (name) {
    case 'run_id':
      return ctx.run;
    case 'sampler_id':
      return ctx.sampler;
    case 'session_id':
      return ctx.session;
    case 'deployment_id':
      return ctx.deployment;
    case 'model_id':
      return ctx.samplerModel;
    case 'team_id':
      return ctx.team;
    case 'checkpoint_id':
      return ctx.checkpoint;
    case 'operation_id':
      return ctx.operation;
    case 'org':
      return MODEL.split('/')[0]!;
    case 'name':
      return MODEL.split('/')[1]!;
    case 'revision':
      return 'main';
    case 'file_path':
      return 'config.json';
    case 'replica':
      return '0';
    default:
      return 'soak-unknown';
  }
}

const NASTY_IDS = ['nope', 'x'.repeat(300), '%00', '%2F', '..', '%2e%2e', '%E6%97%A5', '%', '%zz', '%20', "'", '-1', '0', '%5Fmock'];
const BAD_JSON = ['{', '{"a":}', '[1,2', 'nul', '{"a":1}}', "{'a':1}", '{"a":01}', '\u0000'];
const NON_FINITE = ['1e400', '-1e400', '1E+309'];

export interface FuzzCase {
  i: number;
  kind: string;
  method: string;
  path: string;
  family: string;
  headers: Record<string, string>;
  body?: string;
  /** The protocol's rules make this case a 4xx, whatever the state. */
  expect4xx: boolean;
}

/** Case i: a route, then a valid request or one mutation of it. */
export function fuzzCase(i: number, seed: string, routes: Route[], ctx: FuzzContext, auth: Record<string, string>, other: Record<string, string>): FuzzCase {
  const rng = new Prng(`${seed}:${i}`);
  if (chance(rng, 0.03)) {
    const path = pick(rng, [
      '/v1/loops/nope',
      '/',
      '//',
      '/v1/loops/runs/',
      '/%5Fmock/faults',
      '/trainer',
      '/sampler/x/y/z',
      '/v1/loops/runs/%zz',
      '/hf/api/models',
      '/favicon.ico',
    ]);
    // /%5Fmock/faults is the admin API itself where it is served.
    return {
      i,
      kind: 'stray',
      method: pick(rng, ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']),
      path,
      family: 'stray',
      headers: { ...auth },
      expect4xx: path !== '/%5Fmock/faults',
    };
  }
  const route = pick(rng, routes);
  const takesBody = route.method !== 'GET';
  let body: unknown = takesBody ? (seedBody(route, ctx, rng, i) ?? (route.body ? valueOfSchema(route.body, rng, hintsOf(ctx, rng, i)) : undefined)) : undefined;
  const params = Object.fromEntries(route.params.map((p) => [p, encodeURIComponent(paramValue(p, ctx))]));
  const query: Record<string, string> = {};
  const repeated: [string, string][] = [];
  for (const q of route.query) if (chance(rng, 0.4)) query[q.name] = String(valueOfSchema(q.schema, rng, hintsOf(ctx, rng, i), q.name));
  if (route.template === '/v1/loops/checkpoints') for (const k of Object.keys(query)) delete query[k];
  if (route.template === '/v1/loops/checkpoints') query.run_id = ctx.run;
  const headers: Record<string, string> = { ...auth };
  if (route.family === 'trainer' && route.method === 'POST') headers['idempotency-key'] = `soak-${seed}-${i}`;
  let raw = pick(rng, RAW_NUMBERS) as string;
  let text: string | undefined;
  let expect4xx = false;

  const kinds = [
    'valid',
    'value',
    'value',
    'path',
    'query',
    'auth',
    'headers',
    ...(takesBody ? ['unknown-field', 'missing-required', 'non-finite', 'bad-json', 'value'] : []),
  ];
  let kind = pick(rng, kinds);
  const strict = !route.body || [route.body, ...(route.body.anyOf ?? [])].filter((s) => s.type === 'object').every((s) => s.additionalProperties === false);
  if (kind === 'missing-required' && !(route.body?.required?.length && body && typeof body === 'object')) kind = 'value';
  if (kind === 'unknown-field' && !strict) kind = 'value';
  if (kind === 'path' && !route.params.length) kind = 'query';
  if (kind === 'query' && !route.query.length && route.template !== '/v1/loops/checkpoints') kind = 'value';

  switch (kind) {
    case 'value': {
      if (body !== undefined && body !== null && typeof body === 'object') {
        const at = pathsOf(body);
        body = at.length ? replaceAt(body, pick(rng, at), nastyValue(rng)) : nastyValue(rng);
      } else if (takesBody && chance(rng, 0.5)) {
        body = nastyValue(rng);
      } else if (route.query.length) {
        query[pick(rng, route.query).name] = String(nastyValue(rng)).slice(0, 2000);
      } else if (route.params.length) {
        params[pick(rng, route.params)] = pick(rng, NASTY_IDS);
      }
      break;
    }
    case 'path':
      params[pick(rng, route.params)] = pick(rng, NASTY_IDS);
      break;
    case 'query': {
      const name = route.query.length ? pick(rng, route.query).name : 'run_id';
      const choice = Math.floor(rng.next() * 4);
      // The Hub mirror takes unknown query parameters as the Hub does (huggingface_hub adds new ones over time).
      if (choice === 0) {
        query.zz_unknown = '1';
        expect4xx = route.family !== 'hub';
      } else if (choice === 1) query[name] = pick(rng, NASTY_IDS);
      else if (choice === 2) repeated.push([name, 'b'], [name, query[name] ?? 'a']);
      else query[name] = 'x'.repeat(5000);
      break;
    }
    case 'auth': {
      const choice = Math.floor(rng.next() * 5);
      if (choice === 0) delete headers.authorization;
      else if (choice === 1) headers.authorization = 'Bearer wrong-key';
      else if (choice === 2) Object.assign(headers, other);
      else if (choice === 3) headers.authorization = 'Basic Zm9vOmJhcg==';
      else headers.authorization = `Api-Key ${'k'.repeat(3000)}`;
      break;
    }
    case 'headers': {
      const choice = Math.floor(rng.next() * 5);
      if (choice === 0) headers['x-min-policy-version'] = pick(rng, ['abc', '-1', '1e400', '99999999999999999999', '']);
      else if (choice === 1) headers['idempotency-key'] = 'i'.repeat(pick(rng, [0, 1, 300, 5000]));
      else if (choice === 2)
        headers['content-type'] = pick(rng, ['text/plain', 'application/x-www-form-urlencoded', 'application/json; charset=latin1', 'multipart/form-data']);
      else if (choice === 3) headers['x-affinity-key'] = 'a'.repeat(4000);
      else headers['accept-encoding'] = 'gzip, br, zstd, *;q=0';
      break;
    }
    case 'unknown-field':
      body = body && typeof body === 'object' && !Array.isArray(body) ? { ...body, zz_unknown: 1 } : { zz_unknown: 1 };
      expect4xx = true;
      break;
    case 'missing-required': {
      const copy = { ...(body as Record<string, unknown>) };
      delete copy[pick(rng, route.body!.required!)];
      body = copy;
      expect4xx = true;
      break;
    }
    case 'non-finite': {
      raw = pick(rng, NON_FINITE);
      const at = body && typeof body === 'object' ? pathsOf(body) : [];
      body = at.length ? replaceAt(body, pick(rng, at), RAW) : { zz: RAW };
      expect4xx = true;
      break;
    }
    case 'bad-json':
      text = pick(rng, BAD_JSON);
      expect4xx = true;
      break;
  }
  if (text === undefined && body !== undefined) text = jsonWithRaw(body, raw);
  if (text !== undefined && !headers['content-type']) headers['content-type'] = 'application/json';
  // A raw marker that reached a query or path is sent as the raw text.
  const path = route.template.replace(/\{(\w+)\}/g, (_, p: string) => params[p]!.replace(RAW, raw));
  const qs = [...Object.entries(query), ...repeated]
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v.replace(RAW, raw).replace(/[\ud800-\udfff]/g, '?'))}`)
    .join('&');
  return { i, kind, method: route.method, path: qs ? `${path}?${qs}` : path, family: route.family, headers, body: text, expect4xx };
}

/** Whether an answered case broke a rule; the reason, or null. */
export function judge(c: FuzzCase, o: Outcome): { figure: keyof FuzzFigures; reason: string } | null {
  if (o.kind === 'hang') return { figure: 'hangs', reason: 'no answer within 30 s' };
  if (o.kind === 'transport') return { figure: 'transport', reason: o.message };
  const { status, headers, text } = o.answer;
  if (status >= 500) return { figure: 'fiveXx', reason: `${status} ${text.slice(0, 300)}` };
  const shape = errorShapeProblem(status, headers, text, c.path);
  if (shape) return { figure: 'wrongShape', reason: `${status}: ${shape}: ${text.slice(0, 200)}` };
  if (c.expect4xx && status < 400) return { figure: 'invalidAccepted', reason: `${status} for a ${c.kind} case` };
  return null;
}

export function record(figures: FuzzFigures, c: FuzzCase, o: Outcome): void {
  figures.cases++;
  figures.byFamily[c.family] = (figures.byFamily[c.family] ?? 0) + 1;
  if (o.kind === 'answer') figures.byStatus[o.answer.status] = (figures.byStatus[o.answer.status] ?? 0) + 1;
  const bad = judge(c, o);
  if (!bad) return;
  (figures[bad.figure] as number)++;
  if (figures.failures.length < 20)
    figures.failures.push(`case ${c.i} (${c.kind}) ${c.method} ${c.path.slice(0, 160)} body ${(c.body ?? '').slice(0, 200)}: ${bad.reason}`);
}

export interface FuzzOptions {
  cases: number;
  seed: string;
  /** The server of every route but the admin API's (started without --admin). */
  main: { base: string; auth: Record<string, string>; other: Record<string, string> };
  /** A server with --admin, for the admin routes: rules and scenarios a case installs are cleared after it. */
  admin: { base: string; auth: Record<string, string>; other: Record<string, string> };
  lanes?: number;
}

const MUTATING = new Set(['POST', 'PATCH', 'DELETE', 'PUT']);

/** Runs the fuzz: the main server's cases over `lanes` concurrent clients, the admin API's on one. */
export async function runFuzz(openapi: any, options: FuzzOptions): Promise<FuzzFigures> {
  const routes = routesOf(openapi);
  const adminRoutes = routes.filter((r) => r.family === 'admin');
  const mainRoutes = routes.filter((r) => r.family !== 'admin');
  const adminCases = Math.round((options.cases * adminRoutes.length) / routes.length);
  const figures = emptyFuzzFigures();
  const lanes = options.lanes ?? 3;

  const lane = async (
    server: FuzzOptions['main'],
    list: Route[],
    seed: string,
    indices: number[],
    afterCase: (c: FuzzCase, o: Outcome, refresh: () => Promise<void>) => Promise<void>,
  ) => {
    const client = soakClient(server.base, 1);
    const setup = (h: Record<string, string>) => fuzzContext(client.send, h);
    let ctx = await setup(server.auth);
    let since = 0;
    const refresh = async () => {
      ctx = await setup(server.auth);
      since = 0;
    };
    try {
      for (const i of indices) {
        if (++since > 150) await refresh();
        const c = fuzzCase(i, seed, list, ctx, server.auth, server.other);
        const o = await client.send(c.method, c.path, c.body, c.headers);
        record(figures, c, o);
        await afterCase(c, o, refresh);
      }
    } finally {
      client.close();
    }
  };
  const ok = (o: Outcome) => o.kind === 'answer' && o.answer.status < 300;
  const mainIndices = Array.from({ length: options.cases - adminCases }, (_, i) => i);
  await Promise.all([
    ...Array.from({ length: lanes }, (_, l) =>
      lane(
        options.main,
        mainRoutes,
        `${options.seed}:main`,
        mainIndices.filter((i) => i % lanes === l),
        async (c, o, refresh) => {
          // A case that stopped the lane's run or sampler leaves the next cases nothing to reach.
          if (ok(o) && (c.path.includes('deactivate') || c.method === 'DELETE')) await refresh();
        },
      ),
    ),
    lane(
      options.admin,
      adminRoutes,
      `${options.seed}:admin`,
      Array.from({ length: adminCases }, (_, i) => i),
      async (c, o, refresh) => {
        if (!ok(o) || !MUTATING.has(c.method)) return;
        const cleaner = soakClient(options.admin.base, 1);
        try {
          if (c.path.startsWith('/_mock/faults') || c.path.startsWith('/_mock/progress')) {
            await cleaner.send('DELETE', '/_mock/faults', undefined, options.admin.auth);
            await cleaner.send('DELETE', '/_mock/progress', undefined, options.admin.auth);
          } else if (!c.path.startsWith('/_mock/ui/login')) {
            await cleaner.send('POST', '/_mock/reset', undefined, options.admin.auth);
            await refresh();
          }
        } finally {
          cleaner.close();
        }
      },
    ),
  ]);
  return figures;
}
