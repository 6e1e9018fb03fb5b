import { Ajv } from 'ajv';
import formats from 'ajv-formats';
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, type RunningServer, type StartOptions } from '../index.js';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/** Baseten's published schema, beside the checkout (`../shared/reference`) or where LOOPS_OPENAPI_REFERENCE points. */
export const REFERENCE_PATH = process.env.LOOPS_OPENAPI_REFERENCE ?? join(REPO_ROOT, '..', 'shared', 'reference', 'baseten-loops-openapi.json');
export const referenceAvailable = existsSync(REFERENCE_PATH);

export async function startTestServer(options: StartOptions = {}): Promise<RunningServer> {
  // Test servers warm no engine at start (each test's own first step builds what it uses).
  return startServer({ port: 0, logLevel: 'silent', warm: [], ...options });
}

export interface Reply {
  status: number;
  body: any;
  headers: Record<string, string | number | string[] | undefined>;
}

/** A small client bound to one server and key; every 200 it gets is checked against the OpenAPI documents. */
export function client(server: RunningServer, key: string | null = server.apiKey, scheme = 'Bearer') {
  const send = async (method: string, url: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> => {
    const res = await server.app.inject({
      method: method as 'GET',
      url,
      headers: {
        ...(key === null ? {} : { authorization: `${scheme} ${key}` }),
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        ...headers,
      },
      payload: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    const type = String(res.headers['content-type'] ?? '');
    const reply: Reply = { status: res.statusCode, body: type.includes('json') ? res.json() : res.rawPayload, headers: res.headers };
    if (reply.status === 200 && type.includes('json')) await checkResponse(server, method, url, reply.body);
    return reply;
  };
  return {
    get: (url: string, headers?: Record<string, string>) => send('GET', url, undefined, headers),
    post: (url: string, body?: unknown, headers?: Record<string, string>) => send('POST', url, body, headers),
    patch: (url: string, body?: unknown) => send('PATCH', url, body),
    delete: (url: string) => send('DELETE', url),
    send,
  };
}
export type Client = ReturnType<typeof client>;

// ---- response checking -------------------------------------------------------

interface OpenApiDoc {
  paths: Record<string, Record<string, { responses?: Record<string, { content?: Record<string, { schema?: object }> }> }>>;
}

const validators = new Map<string, (method: string, path: string, body: unknown) => string | null>();

function makeChecker(name: string, doc: OpenApiDoc) {
  const ajv = new Ajv({ strict: false, allErrors: true });
  (formats as unknown as { default: (a: Ajv) => void }).default(ajv);
  ajv.addSchema(doc as object, name);
  const templates = Object.keys(doc.paths).map((t) => ({ t, re: new RegExp(`^${t.replace(/\{[^}]+\}/g, '[^/]+')}$`) }));
  return (method: string, path: string, body: unknown): string | null => {
    const match = templates.find((x) => x.re.test(path) && doc.paths[x.t]![method.toLowerCase()]);
    if (!match) return `no ${method} ${path} in ${name}`;
    const pointer = `#/paths/${match.t.replace(/~/g, '~0').replace(/\//g, '~1')}/${method.toLowerCase()}/responses/200/content/application~1json/schema`;
    const validate = ajv.getSchema(`${name}${pointer}`);
    if (!validate) return `no 200 schema for ${method} ${match.t} in ${name}`;
    return validate(body) ? null : `${method} ${path} does not match ${name}: ${ajv.errorsText(validate.errors)}`;
  };
}

/** Checks a 200 body against Baseten's reference (when present) and against this server's own /openapi.json. */
async function checkResponse(server: RunningServer, method: string, url: string, body: unknown): Promise<void> {
  const path = url.split('?')[0]!;
  if (path === '/openapi.json' || path.startsWith('/checkpoint-files/')) return;
  if (!validators.has('ours')) {
    const res = await server.app.inject({ method: 'GET', url: '/openapi.json' });
    validators.set('ours', makeChecker('ours', res.json()));
  }
  if (referenceAvailable && !validators.has('reference')) {
    validators.set('reference', makeChecker('reference', JSON.parse(readFileSync(REFERENCE_PATH, 'utf8'))));
  }
  for (const [name, check] of validators) {
    const problem = check(method, path, body);
    // Our plane routes are not in Baseten's control-plane schema.
    if (problem && !(name === 'reference' && problem.startsWith('no '))) throw new Error(problem);
  }
}

/** Creates a session and returns its id. */
export async function newSession(api: Client): Promise<string> {
  const res = await api.post('/v1/loops/sessions');
  if (res.status !== 200) throw new Error(`session: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body.session.id;
}

export async function newRun(api: Client, extra: Record<string, unknown> = {}, route = '/v1/loops/runs'): Promise<any> {
  const sessionId = (extra.session_id as string | undefined) ?? (await newSession(api));
  const res = await api.post(route, { base_model: 'Qwen/Qwen3.5-2B', lora_rank: 16, ...extra, session_id: sessionId });
  if (res.status !== 200) throw new Error(`run: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body.run;
}

/** Files of a small fake checkpoint, as the trainer will write them. */
export function fakeCheckpointFiles(n = 2): { relative_file_name: string; data: Uint8Array }[] {
  const files = [
    { relative_file_name: 'adapter_config.json', data: new TextEncoder().encode(JSON.stringify({ r: 16, lora_alpha: 32 })) },
    { relative_file_name: 'adapter_model.safetensors', data: new Uint8Array(1024).map((_, i) => i % 251) },
  ];
  for (let i = 2; i < n; i++) files.push({ relative_file_name: `extra-${i}.bin`, data: new Uint8Array(i) });
  return files.slice(0, Math.max(n, 1));
}

// ---- real HTTP --------------------------------------------------------------

/** A small Loops client over real HTTP: what campaign.py's SDK calls do on the wire. */
export function http(base: string, key = 'trainer-test-key') {
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null, headers: res.headers };
  };
  return {
    call,
    /** Submits an operation and polls it to the end, re-polling after 408 as the SDK does. */
    async op(trainer: string, op: string, body: unknown, idempotencyKey = randomUUID().replace(/-/g, '')): Promise<any> {
      const submitted = await call('POST', `${trainer}/${op}`, body, { 'idempotency-key': idempotencyKey });
      if (submitted.status !== 200) throw new Error(`${op}: ${submitted.status} ${JSON.stringify(submitted.body)}`);
      for (;;) {
        const polled = await call('GET', `${trainer}/operations/${submitted.body.operation_id}`);
        if (polled.status === 408) continue;
        if (polled.status !== 200) throw new Error(`${op} poll: ${polled.status} ${JSON.stringify(polled.body)}`);
        if (polled.body.status === 'error') throw new Error(`${op} failed: ${polled.body.error.error_class}: ${polled.body.error.message}`);
        return polled.body.result;
      }
    },
  };
}

export function wireDatum(tokens: number[], targets: number[]) {
  return {
    model_input: { chunks: [{ type: 'encoded_text', tokens }] },
    loss_fn_inputs: { target_tokens: { data: targets, dtype: 'int64', shape: [targets.length] } },
  };
}
