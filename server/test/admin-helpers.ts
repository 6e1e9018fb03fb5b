import { afterEach } from 'vitest';
import { MockAdmin, type RunningServer, type StartOptions } from '../index.js';
import { http, startTestServer, wireDatum } from './helpers.js';

// What the admin API's test files share: a server with --admin, runs, and submit-then-poll.

export const MODEL = 'Qwen/Qwen3.5-2B';
export const KEY = 'admin-test-key';

/** A server with --admin (and the options given), a client of its Loops API and its admin client. */
export async function startAdmin(options: StartOptions = {}): Promise<{ server: RunningServer; api: Api; admin: MockAdmin }> {
  const server = await startTestServer({ admin: true, ...options });
  return { server, api: http(server.url, KEY), admin: new MockAdmin(server.url, options.adminToken) };
}

/** Each test's server, closed after it: `start` starts one with --admin; `keep` takes one a test started itself. */
export function adminServerPerTest() {
  let current: RunningServer | undefined;
  afterEach(() => current?.close());
  return {
    start: async (options: StartOptions = {}) => {
      const started = await startAdmin(options);
      current = started.server;
      return started;
    },
    keep: (server: RunningServer) => {
      current = server;
    },
    get current(): RunningServer {
      if (!current) throw new Error('no server was started in this test');
      return current;
    },
  };
}

export type Api = ReturnType<typeof http>;
export const data = [wireDatum([1, 2, 3, 4, 5], [2, 3, 4, 5, 6])];
export const fb = { data, loss_fn: 'cross_entropy' };
export const sampleBody = { prompt: { chunks: [{ type: 'encoded_text', tokens: [1, 2, 3] }] }, num_samples: 1, sampling_params: { max_tokens: 2, seed: 1 } };
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function newRun(api: Api, extra: Record<string, unknown> = {}) {
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 4, seed: 1, ...extra });
  if (res.status !== 200) throw new Error(JSON.stringify(res.body));
  const sampler = new URL(res.body.run.sampler.base_url).pathname;
  return { run: res.body.run, trainer: new URL(res.body.run.base_url).pathname, sampler, samplerId: sampler.split('/')[2]! };
}

/** Submits and polls to the end; returns every poll status seen and the final body. */
export async function submitAndPoll(api: Api, trainer: string, op: string, body: unknown, key: string) {
  const submitted = await api.call('POST', `${trainer}/${op}`, body, { 'idempotency-key': key });
  const statuses: number[] = [];
  if (submitted.status !== 200) return { submitted, statuses, final: submitted };
  for (;;) {
    const polled = await api.call('GET', `${trainer}/operations/${submitted.body.operation_id}`);
    statuses.push(polled.status);
    if (polled.status !== 408) return { submitted, statuses, final: polled };
  }
}
