import type { Static } from 'typebox';
import type { Principal } from '../core/records.js';
import type { ControlContext, TypedApp } from './context.js';
import { keptAnswer, replies, teamOf } from './context.js';
import {
  CreateLoopsSamplerRequestV1,
  DeactivateResponseV1,
  DeploymentTombstoneV1,
  DeploymentV1,
  ListSamplersResponse,
  LogsBody,
  LogsQuery,
  LogsResponse,
  ModelDeploymentParams,
  SamplerIdParams,
  SamplerResponse,
  ScopeQuery,
  TeamIdParams,
  UpdateDeploymentRequestV1,
} from './schemas.js';
import { logsAnswer, logsReply } from './deployments.js';
import type { ModelViews } from './models.js';

/** Loops samplers, and the generic model-deployment API through which clients poll and deactivate them. */
export function samplerRoutes(app: TypedApp, ctx: ControlContext, modelViews: ModelViews): void {
  const { core, views } = ctx;
  const tags = ['samplers'];

  for (const prefix of ['/v1/loops', '/v1/teams/:team_id/loops']) {
    const teamScoped = prefix.includes(':team_id');
    const params = teamScoped ? { params: TeamIdParams } : {};

    app.get(
      `${prefix}/samplers`,
      {
        schema: {
          tags,
          summary: 'List samplers, paired and standalone, newest first',
          ...params,
          querystring: ScopeQuery,
          response: replies(ListSamplersResponse),
        },
      },
      (req) =>
        keptAnswer(ctx, req, () => {
          const teamId = teamScoped ? teamOf(ctx, req) : undefined;
          return { samplers: core.fleet.listSamplers(req.principal, { scope: req.query.scope, teamId }).map((s) => views.sampler(s)) };
        }),
    );

    app.post(
      `${prefix}/samplers`,
      {
        schema: {
          tags,
          summary: 'Create a standalone sampler ({base_model}) or pair one with a run ({run_id})',
          ...params,
          body: CreateLoopsSamplerRequestV1,
          response: replies(SamplerResponse),
        },
      },
      (req) => ({ sampler: views.sampler(core.fleet.createSampler(req.principal, req.body, teamOf(ctx, req))) }),
    );
  }

  app.get(
    '/v1/loops/samplers/:sampler_id',
    {
      schema: { tags, summary: 'Get a sampler', params: SamplerIdParams, response: replies(SamplerResponse) },
    },
    (req) => ({ sampler: views.sampler(core.fleet.getSampler(req.principal, req.params.sampler_id)) }),
  );

  const modelTags = ['model deployments'];
  const route = '/v1/models/:model_id/deployments/:deployment_id';

  app.get(
    route,
    {
      schema: {
        tags: modelTags,
        summary: 'Get a sampler as a model deployment (poll its status for readiness)',
        params: ModelDeploymentParams,
        response: replies(DeploymentV1),
      },
    },
    (req) => {
      // A checkpoint deployed to inference is a model deployment of its own; every other one is a sampler.
      const deployed = core.modelDeployments.findOwned(req.principal, req.params.model_id, req.params.deployment_id);
      if (deployed) {
        core.modelDeployments.polled(deployed);
        return modelViews.deployment(deployed);
      }
      return views.modelDeployment(core.fleet.getModelDeployment(req.principal, req.params.model_id, req.params.deployment_id));
    },
  );

  app.patch(
    route,
    {
      schema: {
        tags: modelTags,
        summary: 'Rename a model deployment',
        params: ModelDeploymentParams,
        body: UpdateDeploymentRequestV1,
        response: replies(DeploymentV1),
      },
    },
    (req) => views.modelDeployment(core.fleet.renameModelDeployment(req.principal, req.params.model_id, req.params.deployment_id, req.body.name)),
  );

  app.delete(
    route,
    {
      schema: {
        tags: modelTags,
        summary: 'Delete a model deployment (the sampler stops and leaves this API)',
        params: ModelDeploymentParams,
        response: replies(DeploymentTombstoneV1),
      },
    },
    (req) => {
      const deployed = core.modelDeployments.findOwned(req.principal, req.params.model_id, req.params.deployment_id);
      if (deployed) {
        core.accounts.requireMember(req.principal, deployed.team_id, `delete deployment ${deployed.deployment_id} of model ${deployed.model_id}`);
        core.modelDeployments.delete(deployed);
        return { id: deployed.deployment_id, deleted: true, model_id: deployed.model_id };
      }
      const s = core.fleet.deleteModelDeployment(req.principal, req.params.model_id, req.params.deployment_id);
      return { id: s.model_deployment_id, deleted: true, model_id: s.model_id };
    },
  );

  // A sampler's own lines of the deployment it logs into. The Baseten CLI's `loops run logs --sampler` GETs them with
  // a query; truss's `loops logs --sampler` POSTs the same filters as a JSON body (`{}` for the defaults).
  // A checkpoint deployed to inference logs into its own deployment id: all its lines are its own.
  const deployedLogs = (p: Principal, params: Static<typeof ModelDeploymentParams>) =>
    core.modelDeployments.findOwned(p, params.model_id, params.deployment_id)?.deployment_id;
  const samplerDeployment = (p: Principal, params: Static<typeof ModelDeploymentParams>) =>
    core.fleet.deploymentOfSampler(core.fleet.getModelDeployment(p, params.model_id, params.deployment_id).id);
  app.get(
    `${route}/logs`,
    {
      schema: {
        tags: modelTags,
        summary: "A sampler's log lines through its model deployment (newest first; the last 30 minutes unless a range is given)",
        params: ModelDeploymentParams,
        querystring: LogsQuery,
        response: replies(LogsResponse),
      },
    },
    (req) => {
      const deployed = deployedLogs(req.principal, req.params);
      return deployed ? logsAnswer(ctx, req, deployed, req.query) : logsAnswer(ctx, req, samplerDeployment(req.principal, req.params), req.query, 'sampler');
    },
  );
  app.post(
    `${route}/logs`,
    {
      schema: {
        tags: modelTags,
        summary: "A sampler's log lines through its model deployment, the filters as a JSON body (truss's call)",
        params: ModelDeploymentParams,
        body: LogsBody,
        response: replies(LogsResponse),
      },
    },
    (req) => {
      const deployed = deployedLogs(req.principal, req.params);
      return deployed
        ? logsReply(ctx, deployed, req.body ?? {}, 'body')
        : logsReply(ctx, samplerDeployment(req.principal, req.params), req.body ?? {}, 'body', 'sampler');
    },
  );

  app.post(
    `${route}/deactivate`,
    {
      schema: {
        tags: modelTags,
        summary: 'Deactivate a sampler through its model deployment',
        params: ModelDeploymentParams,
        response: replies(DeactivateResponseV1),
      },
    },
    (req) => {
      const deployed = core.modelDeployments.findOwned(req.principal, req.params.model_id, req.params.deployment_id);
      if (deployed) {
        core.accounts.requireMember(req.principal, deployed.team_id, `deactivate deployment ${deployed.deployment_id} of model ${deployed.model_id}`);
        core.modelDeployments.deactivate(deployed);
        return { success: true };
      }
      core.fleet.deactivateModelDeployment(req.principal, req.params.model_id, req.params.deployment_id);
      return { success: true };
    },
  );
}
