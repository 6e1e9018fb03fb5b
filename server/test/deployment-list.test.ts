import { afterEach, describe, expect, it } from 'vitest';
import { ManualClock, type RunningServer } from '../index.js';
import { client, newRun, startTestServer } from './helpers.js';

// GET /v1/loops/deployments as the list-deployments page describes it: the caller's deployments whose latest
// status is not STOPPED ("what's currently provisioned"); deactivate is its inverse. GET by id still finds them.

let server: RunningServer;
afterEach(() => server?.close());

const ids = (list: { id: string }[]) => list.map((d) => d.id);

describe('the deployment list', () => {
  it('leaves out STOPPED deployments, own and org-wide, while GET by id and its logs still answer for them', async () => {
    server = await startTestServer({
      apiKeys: [
        { key: 'alice', org: 'acme' },
        { key: 'bob', org: 'acme' },
      ],
    });
    const alice = client(server, 'alice');
    const bob = client(server, 'bob');
    const stoppedByRun = await newRun(alice);
    const stoppedById = await newRun(alice);
    const live = await newRun(alice);
    const bobs = await newRun(bob);
    expect(ids((await alice.get('/v1/loops/deployments')).body.deployments)).toEqual([
      live.deployment_id,
      stoppedById.deployment_id,
      stoppedByRun.deployment_id,
    ]);

    // Both ways of stopping one: the run's deactivate, and the deployment's own.
    expect((await alice.post(`/v1/loops/runs/${stoppedByRun.id}/deactivate`)).status).toBe(200);
    expect((await alice.post(`/v1/loops/deployments/${stoppedById.deployment_id}/deactivate`)).status).toBe(200);
    for (const id of [stoppedByRun.deployment_id, stoppedById.deployment_id]) {
      const one = await alice.get(`/v1/loops/deployments/${id}`);
      expect(one.status).toBe(200);
      expect(one.body.deployment.status.name).toBe('STOPPED');
      expect((await alice.get(`/v1/loops/deployments/${id}/logs`)).body.logs.some((l: { message: string }) => /STOPPED/.test(l.message))).toBe(true);
    }

    expect(ids((await alice.get('/v1/loops/deployments')).body.deployments)).toEqual([live.deployment_id]);
    // scope=org lists the organisation's (bob's too), with the same rule: the page names no exception for it.
    expect(ids((await alice.get('/v1/loops/deployments?scope=org')).body.deployments)).toEqual([bobs.deployment_id, live.deployment_id]);
    expect(ids((await bob.get('/v1/loops/deployments?scope=org')).body.deployments)).toEqual([bobs.deployment_id, live.deployment_id]);
  });

  it('keeps deployments that are not STOPPED: one scaled to zero by the idle timeout stays listed', async () => {
    const clock = new ManualClock();
    server = await startTestServer({ clock, coldStartMs: 0 });
    const api = client(server);
    const run = await newRun(api, { scale_down_delay_seconds: 1 });
    clock.advance(2000);
    const listed = (await api.get('/v1/loops/deployments')).body.deployments;
    expect(listed.map((d: { id: string; status: { name: string } }) => [d.id, d.status.name])).toEqual([[run.deployment_id, 'SCALED_TO_ZERO']]);
  });
});
