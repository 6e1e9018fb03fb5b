import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

/**
 * Every call the Baseten CLI's `loops` commands make (as the truss CLI's
 * source has them), made as its generated Go client makes them:
 * `Authorization: Api-Key`, no body and no Content-Type when there is none,
 * unset query values left out. That client treats any status but exactly
 * 200, or a Content-Type not starting with application/json, as an error, and
 * parses created_at as RFC 3339; so does this test, for each field it reads.
 */
const KEY = 'cli-key';
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

let server: RunningServer;

beforeAll(async () => {
  server = await startTestServer({ apiKeys: [{ key: KEY, org: 'cli-org', team: 'cli-team' }] });
});
afterAll(() => server.close());

/** One call of the CLI: fails the test as the CLI would fail the command. */
async function cli(method: 'GET' | 'POST', path: string, body?: unknown, query: Record<string, string | number | undefined> = {}): Promise<any> {
  const params = new URLSearchParams(
    Object.entries(query)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [k, String(v)]),
  );
  const url = `${server.url}${path}${params.size ? `?${params}` : ''}`;
  const res = await fetch(url, {
    method,
    headers: { authorization: `Api-Key ${KEY}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  expect(res.status, `${method} ${url}: ${text}`).toBe(200);
  expect(res.headers.get('content-type') ?? '', `${method} ${url}`).toMatch(/^application\/json/);
  return JSON.parse(text);
}

const rfc3339 = (value: unknown, what: string) => expect(String(value), what).toMatch(RFC3339);

describe("the Baseten CLI's loops commands", () => {
  it('run create (with and without --team), run list, run describe, usage, checkpoint list and files, run logs (trainer and sampler), run deactivate', async () => {
    // run create --team T: GET /v1/teams, match id or a unique name.
    const { teams } = await cli('GET', '/v1/teams');
    const team = teams.find((t: { name: string }) => t.name === 'cli-team');
    expect(team?.id).toBeTruthy();
    const teamSession = (await cli('POST', `/v1/teams/${team.id}/loops/sessions`)).session;
    const teamRun = (await cli('POST', `/v1/teams/${team.id}/loops/runs`, { session_id: teamSession.id, base_model: 'Qwen/Qwen3.5-2B', name: 'cli-team-run' }))
      .run;
    expect(teamRun.id).toBeTruthy();
    expect(teamRun.base_model).toBe('Qwen/Qwen3.5-2B');

    // run create: POST /v1/loops/sessions (no body), POST /v1/loops/runs.
    const { session } = await cli('POST', '/v1/loops/sessions');
    const { run } = await cli('POST', '/v1/loops/runs', { session_id: session.id, base_model: 'Qwen/Qwen3.5-2B', name: 'cli-run', replicas: 1 });
    expect(run.id).toBeTruthy();
    expect(run.base_model).toBe('Qwen/Qwen3.5-2B');

    // run list [--base-model] [--org]
    for (const query of [{}, { base_model: 'Qwen/Qwen3.5-2B' }, { scope: 'org' }, { base_model: 'Qwen/Qwen3.5-2B', scope: 'org' }]) {
      const { runs } = await cli('GET', '/v1/loops/runs', undefined, query);
      expect(runs.map((r: { id: string }) => r.id)).toContain(run.id);
      for (const r of runs) {
        expect(typeof r.id).toBe('string');
        expect(typeof r.base_model).toBe('string');
        expect(typeof r.status.name).toBe('string');
        rfc3339(r.created_at, 'runs[].created_at');
        expect(typeof r.user.email).toBe('string');
      }
    }

    // run describe --run-id R
    const described = (await cli('GET', `/v1/loops/runs/${run.id}`)).run;
    for (const field of ['id', 'name', 'base_model', 'session_id', 'deployment_id', 'base_url']) expect(typeof described[field], field).toBe('string');
    expect(described.status.name).toBe('ACTIVE');
    expect(typeof described.user.email).toBe('string');
    rfc3339(described.created_at, 'run.created_at');
    for (const field of ['id', 'model_id', 'deployment_id', 'base_url']) expect(typeof described.sampler[field], `sampler.${field}`).toBe('string');
    expect(typeof described.sampler.status.name).toBe('string');

    // A checkpoint to list: one training step and a save through the run's trainer.
    const trainer = described.base_url;
    const submit = await fetch(`${trainer}/save_weights_for_sampler`, {
      method: 'POST',
      headers: { authorization: `Api-Key ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'cli-ckpt' }),
    });
    const { operation_id } = (await submit.json()) as { operation_id: string };
    expect(
      ((await (await fetch(`${trainer}/operations/${operation_id}`, { headers: { authorization: `Api-Key ${KEY}` } })).json()) as { status: string }).status,
    ).toBe('done');

    // usage [--org]
    for (const query of [{}, { scope: 'org' }]) {
      const { deployments } = await cli('GET', '/v1/loops/deployments', undefined, query);
      expect(deployments.length).toBeGreaterThan(0);
      for (const d of deployments) {
        expect(typeof d.base_model).toBe('string');
        rfc3339(d.created_at, 'deployments[].created_at');
        expect(typeof d.status.name).toBe('string');
        expect(typeof d.instance_type.name).toBe('string');
        expect(typeof d.instance_type.gpu_count).toBe('number');
        expect('active_run_id' in d && 'latest_run_id' in d && 'sampler' in d).toBe(true);
        expect(typeof d.user.email).toBe('string');
        expect(typeof d.node_count).toBe('number');
      }
      const { samplers } = await cli('GET', '/v1/loops/samplers', undefined, query);
      expect(samplers.length).toBeGreaterThan(0);
      for (const s of samplers) {
        for (const field of ['id', 'base_model']) expect(typeof s[field], field).toBe('string');
        rfc3339(s.created_at, 'samplers[].created_at');
        expect(typeof s.user.email).toBe('string');
        expect(typeof s.status.name).toBe('string');
        expect(typeof s.node_count).toBe('number');
        expect(typeof s.instance_type.name).toBe('string');
      }
    }

    // checkpoint list --run-id R | --base-model M
    for (const query of [{ run_id: run.id }, { base_model: 'Qwen/Qwen3.5-2B' }]) {
      const { checkpoints } = await cli('GET', '/v1/loops/checkpoints', undefined, query);
      expect(checkpoints.length).toBeGreaterThan(0);
      for (const c of checkpoints) {
        for (const field of ['id', 'checkpoint_id', 'run_id', 'target', 'checkpoint_type']) expect(typeof c[field], field).toBe('string');
        expect(typeof c.size_bytes).toBe('number');
        rfc3339(c.created_at, 'checkpoints[].created_at');
      }
    }

    // checkpoint files --checkpoint-id C: loops while next_page_token is not null and the page is non-empty.
    const [checkpoint] = (await cli('GET', '/v1/loops/checkpoints', undefined, { run_id: run.id })).checkpoints;
    const files: { relative_file_name: string; size_bytes: number; url: string }[] = [];
    let token: string | undefined;
    for (let page = 0; page < 10; page++) {
      const answer = await cli('GET', `/v1/loops/checkpoints/${checkpoint.id}/files`, undefined, { page_size: 1, page_token: token });
      files.push(...answer.presigned_urls);
      if (answer.next_page_token === null || !answer.presigned_urls.length) break;
      token = String(answer.next_page_token);
    }
    expect(files.map((f) => f.relative_file_name).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    for (const f of files) {
      expect(typeof f.size_bytes).toBe('number');
      expect((await fetch(f.url)).status).toBe(200);
    }

    // run logs --run-id R [--tail]: the run, then its deployment's logs; the tail polls the deployment's status.
    const logQuery = { start_epoch_millis: Date.now() - 3_600_000, end_epoch_millis: Date.now() + 60_000, limit: 100, direction: 'desc', min_level: 'INFO' };
    const trainerLogs = (await cli('GET', `/v1/loops/deployments/${described.deployment_id}/logs`, undefined, logQuery)).logs;
    expect(trainerLogs.length).toBeGreaterThan(0);
    expect(['CREATED', 'DEPLOYING', 'RUNNING']).toContain((await cli('GET', `/v1/loops/deployments/${described.deployment_id}`)).deployment.status.name);

    // run logs --run-id R --sampler: the sampler's model deployment, its logs, and its status for the tail.
    const { model_id: modelId, deployment_id: samplerDeployment } = described.sampler;
    const samplerLogs = (await cli('GET', `/v1/models/${modelId}/deployments/${samplerDeployment}/logs`, undefined, logQuery)).logs;
    expect(samplerLogs.length).toBeGreaterThan(0);
    expect(samplerLogs.every((l: { replica: string }) => l.replica.startsWith('sampler'))).toBe(true);
    expect(samplerLogs.some((l: { message: string }) => /Sampler .* is ACTIVE/.test(l.message))).toBe(true);
    expect(typeof (await cli('GET', `/v1/models/${modelId}/deployments/${samplerDeployment}`)).status).toBe('string');

    // run deactivate --run-id R --yes (no body): reads id.
    expect((await cli('POST', `/v1/loops/runs/${run.id}/deactivate`)).id).toBe(run.id);
    expect((await cli('POST', `/v1/loops/runs/${teamRun.id}/deactivate`)).id).toBe(teamRun.id);
    // run list hides INACTIVE unless --all: the status says so.
    const after = (await cli('GET', '/v1/loops/runs')).runs.find((r: { id: string }) => r.id === run.id);
    expect(after.status.name).toBe('INACTIVE');
  });
});
