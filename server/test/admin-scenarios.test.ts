import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { MockAdminError, MockAdmin } from '../index.js';
import { shippedScenarioNames } from '../admin/scenario.js';
import { type Api, fb, sampleBody, sleep, newRun, submitAndPoll, adminServerPerTest } from './admin-helpers.js';
import { startTestServer } from './helpers.js';

const servers = adminServerPerTest();
const start = servers.start;

describe('scenarios', () => {
  it('ships the library the issue asks for, and each one loads by name', async () => {
    const names = shippedScenarioNames();
    for (const required of [
      'lagging-replica',
      'replicas-out-of-step',
      'lost-operation',
      'shutdown-mid-run',
      'sampling-backpressure',
      'long-operations',
      'user-error',
      'slow-cold-start',
      'sampler-scale-to-zero',
      'run-idle-timeout',
      'deactivation-during-training',
      'flaky-network',
    ]) {
      expect(names).toContain(required);
    }
    const { admin } = await start();
    for (const name of names) {
      const applied = await admin.applyScenario({ name });
      expect(applied.name).toBe(name);
      expect((await admin.faults()).length).toBe(applied.faults);
      expect((await admin.progressRules()).length).toBe(applied.progress);
    }
  });

  it('names the line of a mistake in YAML and in JSON, and refuses files over HTTP', async () => {
    const { admin } = await start();
    const problem = async (text: string) => {
      try {
        await admin.applyScenario({ text });
      } catch (err) {
        return ((err as MockAdminError).body as { error: { message: string; line: number } }).error;
      }
      throw new Error('accepted');
    };
    const yaml = 'name: broken\nfaults:\n  - match:\n      surface: trainer\n    action:\n      type: explode\n';
    expect(await problem(yaml)).toMatchObject({ line: 6 });
    expect((await problem(yaml)).message).toMatch(/scenario:6: .*type/);
    expect(await problem('settings:\n  cold_start_ms: 10\n  colour: red\n')).toMatchObject({ line: 3 });
    expect(await problem('faults:\n  - action:\n      type: respond\n')).toMatchObject({ line: 2 });
    expect(await problem('{\n  "settings": {\n    "long_poll_ms": "soon"\n  }\n}')).toMatchObject({ line: 3 });
    expect(await problem('faults: [\n')).toHaveProperty('line');
    await expect(admin.applyScenario({ name: '../package.json' })).rejects.toThrow(/404/);
    const yamlBody = await fetch(`${servers.current.url}/_mock/scenario`, {
      method: 'POST',
      headers: { 'content-type': 'application/yaml' },
      body: 'settings:\n  floor_wait_ms: 5\n',
    });
    expect(yamlBody.status).toBe(200);
    expect((await admin.settings()).floor_wait_ms).toBe(5);
  });

  it('--scenario applies a file at start, again after a reset, and a bad one fails the start with its line', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'scenario-'));
    const file = join(dir, 'mine.yaml');
    writeFileSync(file, 'settings:\n  floor_wait_ms: 7\nfaults:\n  - action: {type: delay, ms: 1}\n');
    const { admin } = await start({ scenario: file });
    expect((await admin.settings()).floor_wait_ms).toBe(7);
    await admin.reset();
    expect((await admin.settings()).floor_wait_ms).toBe(7);
    expect(await admin.faults()).toHaveLength(1);
    await servers.current.close();
    writeFileSync(file, 'settings:\n  floor_wait_ms: -1\n');
    await expect(startTestServer({ admin: true, scenario: file })).rejects.toThrow(/mine\.yaml:2/);
  });

  /** Each shipped scenario, observed from the client side. */
  const effects: Record<string, (api: Api, admin: MockAdmin) => Promise<void>> = {
    baseline: async (api, admin) => {
      const { trainer } = await newRun(api);
      expect((await submitAndPoll(api, trainer, 'forward', fb, 'b-1')).statuses).toEqual([200]);
      expect(await admin.faults()).toEqual([]);
    },
    'lost-operation': async (api) => {
      const { trainer } = await newRun(api);
      await submitAndPoll(api, trainer, 'forward_backward', fb, 'lo-1');
      const first = await submitAndPoll(api, trainer, 'optim_step', {}, 'lo-2');
      expect(first.final.status).toBe(404);
      const again = await submitAndPoll(api, trainer, 'optim_step', {}, 'lo-2');
      expect(again.submitted.body.operation_id).toBe(first.submitted.body.operation_id);
      expect(again.final.body.result.policy_version).toBe(1);
    },
    'dropped-submit': async (api) => {
      const { trainer } = await newRun(api);
      await expect(api.call('POST', `${trainer}/optim_step`, {}, { 'idempotency-key': 'ds' })).rejects.toThrow();
      expect((await submitAndPoll(api, trainer, 'optim_step', {}, 'ds')).final.body.result.policy_version).toBe(1);
    },
    'user-error': async (api) => {
      const { trainer } = await newRun(api);
      for (const key of ['ue-1', 'ue-2'])
        expect((await submitAndPoll(api, trainer, 'forward_backward', fb, key)).final.body.error.error_class).toBe('ValueError');
      expect((await submitAndPoll(api, trainer, 'forward', fb, 'ue-3')).final.body.status).toBe('done');
    },
    'long-operations': async (api) => {
      const { trainer } = await newRun(api);
      // A forward (not held) builds the graphs, so compute time does not add a window of its own.
      await submitAndPoll(api, trainer, 'forward', fb, 'lop-warm');
      expect((await submitAndPoll(api, trainer, 'forward_backward', fb, 'lop')).statuses).toEqual([408, 408, 408, 200]);
    },
    'deactivation-during-training': async (api) => {
      const { trainer } = await newRun(api);
      for (const key of ['d1', 'd2']) expect((await submitAndPoll(api, trainer, 'forward_backward', fb, key)).final.body.status).toBe('done');
      expect((await api.call('POST', `${trainer}/forward_backward`, fb, { 'idempotency-key': 'd3' })).status).toBe(409);
    },
    'shutdown-mid-run': async (api) => {
      const { trainer } = await newRun(api);
      const statuses: number[] = [];
      for (let i = 0; i < 10; i++) statuses.push((await api.call('GET', `${trainer}/policy_version`)).status);
      expect(statuses).toEqual([200, 200, 200, 200, 200, 200, 503, 503, 503, 200]);
    },
    'sampling-backpressure': async (api) => {
      const { sampler } = await newRun(api);
      const statuses: number[] = [];
      for (let i = 0; i < 4; i++) statuses.push((await api.call('POST', `${sampler}/sample`, sampleBody)).status);
      expect(statuses).toEqual([429, 429, 429, 200]);
    },
    'flaky-network': async (api) => {
      const statuses: number[] = [];
      for (let i = 0; i < 60; i++) statuses.push((await api.call('GET', '/v1/loops/capabilities')).status);
      const failures = statuses.filter((s) => s === 503).length;
      expect(failures).toBeGreaterThan(0);
      expect(failures).toBeLessThan(20);
    },
    'slow-cold-start': async (api, admin) => {
      const { trainer } = await newRun(api);
      expect((await api.call('GET', `${trainer}/health`)).status).toBe(503);
      await admin.advanceClock(4000);
      expect((await api.call('GET', `${trainer}/health`)).status).toBe(200);
    },
    'slow-model-deploy': async (api, admin) => {
      const { run, trainer } = await newRun(api);
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'step-0' }, 'smd-save');
      const [checkpoint] = (await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
      const deployed = (await api.call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [checkpoint.id] })).body;
      const status = async () => (await api.call('GET', `/v1/models/${deployed.model_id}/deployments/${deployed.deployment_id}`)).body.status;
      expect(await status()).toBe('BUILDING');
      await admin.advanceClock(3000);
      expect(await status()).toBe('ACTIVE');
    },
    'run-idle-timeout': async (api, admin) => {
      const { run } = await newRun(api);
      await admin.advanceClock(1500);
      expect((await api.call('GET', `/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('INACTIVE');
    },
    'sampler-scale-to-zero': async (api, admin) => {
      const { sampler, samplerId } = await newRun(api);
      await admin.advanceClock(1000);
      await admin.advanceClock(1000);
      expect((await admin.sampler(samplerId)).status).toBe('SCALED_TO_ZERO');
      expect((await api.call('POST', `${sampler}/sample`, sampleBody)).status).toBe(503);
      await admin.advanceClock(1000);
      expect((await api.call('POST', `${sampler}/sample`, sampleBody)).status).toBe(200);
    },
    'lagging-replica': async (api, admin) => {
      const { trainer, sampler } = await newRun(api);
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'w0' }, 'lr-0');
      await submitAndPoll(api, trainer, 'optim_step', {}, 'lr-1');
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'w1' }, 'lr-2');
      const pending = api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' });
      await sleep(100);
      await admin.advanceClock(300);
      expect((await pending).status).toBe(408);
      await admin.advanceClock(1200);
      expect((await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' })).body.policy_version).toBe(1);
    },
    'replicas-out-of-step': async (api, admin) => {
      const { trainer, sampler, samplerId } = await newRun(api);
      await submitAndPoll(api, trainer, 'optim_step', {}, 'os-1');
      await submitAndPoll(api, trainer, 'save_weights_for_sampler', { name: 'w1' }, 'os-2');
      const versions = new Set<number>();
      for (let i = 0; i < 4; i++) versions.add((await api.call('POST', `${sampler}/sample`, sampleBody)).body.policy_version);
      expect([...versions].sort()).toEqual([0, 1]);
      expect((await admin.sampler(samplerId)).replicas.map((r) => r.policy_version)).toEqual([1, 0]);
    },
  };

  /** Scenarios whose effect is observed in real time (long-poll windows); the rest run on the virtual clock. */
  const realTime = new Set(['long-operations']);

  it('every shipped scenario takes effect', async () => {
    expect(Object.keys(effects).sort()).toEqual(shippedScenarioNames());
    for (const clockMode of ['virtual', 'real'] as const) {
      const { api, admin } = await start({ clockMode });
      for (const [name, observe] of Object.entries(effects)) {
        if (realTime.has(name) !== (clockMode === 'real')) continue;
        await admin.reset();
        await admin.applyScenario({ name });
        try {
          await observe(api, admin);
        } catch (err) {
          throw new Error(`scenario ${name}: ${(err as Error).message}`);
        }
      }
      await servers.current.close();
    }
  }, 120_000);
});
