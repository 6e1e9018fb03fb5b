import type { ControlContext, TypedApp } from './context.js';
import { keptAnswer, replies, teamOf } from './context.js';
import {
  CreateLoopsRunRequestV1,
  CreateSessionRequest,
  DeactivateRunResponse,
  ListRunsQuery,
  ListRunsResponse,
  RunIdParams,
  RunResponse,
  SessionIdParams,
  SessionResponse,
  TeamIdParams,
} from './schemas.js';

/** Sessions, runs and trainers, plain and team-scoped (`/v1/teams/{team_id}/loops/...`). */
export function sessionAndRunRoutes(app: TypedApp, ctx: ControlContext): void {
  const { core, views } = ctx;
  const tags = ['sessions and runs'];

  for (const prefix of ['/v1/loops', '/v1/teams/:team_id/loops']) {
    const teamScoped = prefix.includes(':team_id');
    const params = teamScoped ? { params: TeamIdParams } : {};

    app.post(
      `${prefix}/sessions`,
      {
        schema: { tags, summary: 'Create a session', ...params, body: CreateSessionRequest, response: replies(SessionResponse) },
      },
      (req) => {
        const session = core.fleet.createSession(req.principal, teamOf(ctx, req), req.body?.training_project_id ?? null);
        return { session: { id: session.id } };
      },
    );

    app.get(
      `${prefix}/runs`,
      {
        schema: {
          tags,
          summary: 'List runs (every status; your own unless scope=org)',
          ...params,
          querystring: ListRunsQuery,
          response: replies(ListRunsResponse),
        },
      },
      (req) =>
        keptAnswer(ctx, req, () => {
          const teamId = teamScoped ? teamOf(ctx, req) : undefined;
          return { runs: core.fleet.listRuns(req.principal, { ...req.query, teamId }).map((r) => views.run(r)) };
        }),
    );

    for (const [route, withSampler, summary] of [
      ['runs', true, 'Create a run: a trainer and its paired sampler'],
      ['trainers', false, 'Create a trainer-only run (pair a sampler later with POST /samplers {run_id})'],
    ] as const) {
      app.post(
        `${prefix}/${route}`,
        {
          schema: { tags, summary, ...params, body: CreateLoopsRunRequestV1, response: replies(RunResponse) },
        },
        (req) => ({ run: views.run(core.fleet.createRun(req.principal, req.body, withSampler, teamOf(ctx, req))) }),
      );
    }
  }

  app.get(
    '/v1/loops/sessions/:session_id',
    {
      schema: { tags, summary: 'Get a session', params: SessionIdParams, response: replies(SessionResponse) },
    },
    (req) => ({ session: { id: core.fleet.getSession(req.principal, req.params.session_id).id } }),
  );

  app.get(
    '/v1/loops/runs/:run_id',
    {
      schema: { tags, summary: 'Get a run with its paired sampler', params: RunIdParams, response: replies(RunResponse) },
    },
    (req) => ({ run: views.run(core.fleet.getRun(req.principal, req.params.run_id)) }),
  );

  app.post(
    '/v1/loops/runs/:run_id/deactivate',
    {
      schema: { tags, summary: 'Deactivate a run and its paired sampler (checkpoints stay)', params: RunIdParams, response: replies(DeactivateRunResponse) },
    },
    (req) => {
      const run = core.fleet.deactivateRun(req.principal, req.params.run_id);
      return { id: run.id, base_model: run.base_model, user: views.user(run) };
    },
  );
}
