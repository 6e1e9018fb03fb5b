import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { client, newRun, newSession, startTestServer } from './helpers.js';

let server: RunningServer;
afterEach(() => server?.close());

describe('authentication', () => {
  it('accepts Bearer and the legacy Api-Key scheme as the same user', async () => {
    server = await startTestServer();
    const bearer = client(server, 'key-a', 'Bearer');
    const legacy = client(server, 'key-a', 'Api-Key');
    const run = await newRun(bearer);
    expect((await legacy.get(`/v1/loops/runs`)).body.runs.map((r: any) => r.id)).toEqual([run.id]);
    expect((await client(server, 'key-a', 'bearer').get('/v1/loops/runs')).status).toBe(200);
  });

  it('answers 401 for a missing, malformed or empty header', async () => {
    server = await startTestServer();
    for (const headers of [{}, { authorization: 'key-a' }, { authorization: 'Basic a2V5' }, { authorization: 'Bearer' }, { authorization: 'Bearer a b' }]) {
      const res = await server.app.inject({ method: 'GET', url: '/v1/loops/runs', headers });
      expect(res.statusCode, JSON.stringify(headers)).toBe(401);
      expect(res.json().error.type).toBe('unauthorized');
    }
  });

  it('with --api-key accepts only the configured keys, placing them in their organisations and teams', async () => {
    server = await startTestServer({ apiKeys: [{ key: 'alice', org: 'acme', team: 'research' }, { key: 'bob', org: 'acme' }, { key: 'eve' }] });
    expect((await client(server, 'mallory').get('/v1/loops/runs')).status).toBe(401);
    const alice = client(server, 'alice');
    const teams = (await alice.get('/v1/teams')).body.teams.map((t: any) => t.name).sort();
    expect(teams).toEqual(['Default Team', 'research']);
    expect((await client(server, 'eve').get('/v1/teams')).body.teams.map((t: any) => t.name)).toEqual(['Default Team']);
  });
});

describe('isolation', () => {
  it("hides another organisation's resources: 404 on get and deactivate, absent from lists", async () => {
    server = await startTestServer();
    const a = client(server, 'org-a-key');
    const b = client(server, 'org-b-key');
    const run = await newRun(a);
    const session = await newSession(a);
    expect((await b.get(`/v1/loops/runs/${run.id}`)).status).toBe(404);
    expect((await b.get(`/v1/loops/sessions/${session}`)).status).toBe(404);
    expect((await b.get(`/v1/loops/samplers/${run.sampler.id}`)).status).toBe(404);
    expect((await b.get(`/v1/loops/deployments/${run.deployment_id}`)).status).toBe(404);
    expect((await b.get(`/v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}`)).status).toBe(404);
    expect((await b.post(`/v1/loops/runs/${run.id}/deactivate`)).status).toBe(404);
    expect((await b.post(`/v1/loops/deployments/${run.deployment_id}/deactivate`)).status).toBe(404);
    expect((await b.post(`/v1/models/${run.sampler.model_id}/deployments/${run.sampler.deployment_id}/deactivate`)).status).toBe(404);
    expect((await b.post('/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3-8B' })).status).toBe(404);
    for (const url of ['/v1/loops/runs', '/v1/loops/runs?scope=org', '/v1/loops/samplers?scope=org', '/v1/loops/deployments?scope=org']) {
      const body = (await b.get(url)).body;
      expect(Object.values(body)[0], url).toEqual([]);
    }
    expect((await b.get(`/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints).toEqual([]);
    expect((await a.get(`/v1/loops/runs/${run.id}`)).body.run.status.name).toBe('ACTIVE');
    // Data planes: a key of another organisation cannot reach the trainer either.
    const res = await server.app.inject({ method: 'GET', url: `/trainer/${run.id}/health`, headers: { authorization: 'Bearer org-b-key' } });
    expect(res.statusCode).toBe(404);
  });

  it("scope=org lists colleagues' resources; the default lists only your own", async () => {
    server = await startTestServer({
      apiKeys: [
        { key: 'alice', org: 'acme' },
        { key: 'bob', org: 'acme' },
      ],
    });
    const alice = client(server, 'alice');
    const bob = client(server, 'bob');
    const run = await newRun(alice);
    expect((await bob.get('/v1/loops/runs')).body.runs).toEqual([]);
    expect((await bob.get('/v1/loops/runs?scope=org')).body.runs.map((r: any) => r.id)).toEqual([run.id]);
    expect((await bob.get('/v1/loops/samplers?scope=org')).body.samplers.map((s: any) => s.id)).toEqual([run.sampler.id]);
    expect((await bob.get('/v1/loops/deployments?scope=org')).body.deployments.map((d: any) => d.id)).toEqual([run.deployment_id]);
    // Same organisation: visible by id, and deactivatable.
    expect((await bob.get(`/v1/loops/runs/${run.id}`)).status).toBe(200);
    expect((await bob.post(`/v1/loops/runs/${run.id}/deactivate`)).status).toBe(200);
  });
});

describe('team-scoped routes', () => {
  it('create and list within a team; an unknown or foreign team is 404', async () => {
    server = await startTestServer({
      apiKeys: [
        { key: 'alice', org: 'acme', team: 'research' },
        { key: 'zed', org: 'other', team: 'research' },
      ],
    });
    const alice = client(server, 'alice');
    const teams = (await alice.get('/v1/teams')).body.teams;
    const research = teams.find((t: any) => t.name === 'research').id;
    const defaultTeam = teams.find((t: any) => t.default).id;
    const session = (await alice.post(`/v1/teams/${research}/loops/sessions`)).body.session.id;
    const inTeam = (await alice.post(`/v1/teams/${research}/loops/runs`, { session_id: session, base_model: 'Qwen/Qwen3-8B' })).body.run;
    expect(inTeam.sampler).not.toBeNull();
    // A session holds one trainer per base model: the trainer-only run gets a session of its own.
    const trainerSession = (await alice.post(`/v1/teams/${research}/loops/sessions`)).body.session.id;
    const trainerOnly = (await alice.post(`/v1/teams/${research}/loops/trainers`, { session_id: trainerSession, base_model: 'Qwen/Qwen3-8B' })).body.run;
    expect(trainerOnly.sampler).toBeNull();
    const otherSession = (await alice.post(`/v1/teams/${defaultTeam}/loops/sessions`)).body.session.id;
    const inDefault = (await alice.post(`/v1/teams/${defaultTeam}/loops/runs`, { session_id: otherSession, base_model: 'Qwen/Qwen3-8B' })).body.run;
    const standalone = (await alice.post(`/v1/teams/${research}/loops/samplers`, { session_id: session, base_model: 'Qwen/Qwen3-8B' })).body.sampler;

    expect((await alice.get(`/v1/teams/${research}/loops/runs`)).body.runs.map((r: any) => r.id).sort()).toEqual([inTeam.id, trainerOnly.id].sort());
    expect((await alice.get(`/v1/teams/${defaultTeam}/loops/runs`)).body.runs.map((r: any) => r.id)).toEqual([inDefault.id]);
    expect((await alice.get('/v1/loops/runs')).body.runs).toHaveLength(3);
    const teamSamplers = (await alice.get(`/v1/teams/${research}/loops/samplers`)).body.samplers.map((s: any) => s.id);
    expect(teamSamplers.sort()).toEqual([inTeam.sampler.id, standalone.id].sort());

    const zed = client(server, 'zed');
    expect((await zed.get(`/v1/teams/${research}/loops/runs`)).status).toBe(404);
    expect((await alice.post('/v1/teams/nosuchteam/loops/sessions')).status).toBe(404);
  });
});

describe('teams inside one organisation', () => {
  it("are a boundary for changes, not for reading: a key changes its own team's and the Default Team's resources only", async () => {
    server = await startTestServer({
      apiKeys: [
        { key: 'k1', org: 'orgA', team: 'teamA' },
        { key: 'k2', org: 'orgA', team: 'teamB' },
      ],
    });
    const k1 = client(server, 'k1');
    const k2 = client(server, 'k2');
    const teams = Object.fromEntries((await k1.get('/v1/teams')).body.teams.map((t: any) => [t.name, t.id]));
    const mine = await newRun(k1);
    const theirs = await newRun(k2);
    expect([mine.status.name, theirs.status.name]).toEqual(['ACTIVE', 'ACTIVE']);

    // Reading across teams: listed with scope=org, fetched by id, its trainer's state read.
    expect((await k1.get('/v1/loops/runs?scope=org')).body.runs.map((r: any) => r.id).sort()).toEqual([mine.id, theirs.id].sort());
    expect((await k1.get(`/v1/loops/runs/${theirs.id}`)).status).toBe(200);
    expect((await k1.get(`/trainer/${theirs.id}/policy_version`)).status).toBe(200);

    // Changing across teams: 403 naming the team, and nothing changes.
    const refusals = [
      await k1.post(`/v1/loops/runs/${theirs.id}/deactivate`),
      await k1.post(`/v1/loops/deployments/${theirs.deployment_id}/deactivate`),
      await k1.post(`/v1/models/${theirs.sampler.model_id}/deployments/${theirs.sampler.deployment_id}/deactivate`),
      await k1.post(`/v1/teams/${teams.teamB}/loops/sessions`),
      await k1.post(`/trainer/${theirs.id}/optim_step`, {}),
      await k1.post('/v1/loops/samplers', { session_id: theirs.session_id, run_id: theirs.id }),
    ];
    for (const res of refusals) {
      expect(res.status).toBe(403);
      expect(res.body.error).toMatchObject({ type: 'forbidden', team_id: teams.teamB });
      expect(res.body.error.message).toMatch(/belongs to team 'teamB'.*acts in team 'teamA'/);
    }
    expect((await k2.get(`/v1/loops/runs/${theirs.id}`)).body.run.status.name).toBe('ACTIVE');

    // The owner's team, and the Default Team every member is in, take the same changes.
    expect((await k1.post(`/v1/teams/${teams['Default Team']}/loops/sessions`)).status).toBe(200);
    expect((await k1.post(`/v1/loops/runs/${mine.id}/deactivate`)).status).toBe(200);
    expect((await k2.post(`/v1/loops/runs/${theirs.id}/deactivate`)).status).toBe(200);
  });
});
