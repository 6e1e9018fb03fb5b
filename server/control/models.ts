import Type from 'typebox';
import type { LoopsCore } from '../core/core.js';
import { notFound } from '../core/errors.js';
import type { CheckpointRecord, ModelDeploymentRecord, Principal } from '../core/records.js';
import { checkpointPath } from '../core/checkpoints.js';
import type { PublicUrls } from '../http/public-urls.js';
import type { ControlContext, TypedApp } from './context.js';
import { replies } from './context.js';

const Nullable = <T extends Parameters<typeof Type.Union>[0][number]>(t: T) => Type.Union([t, Type.Null()]);

export const DeployCheckpointsRequest = Type.Object(
  {
    checkpoint_ids: Type.Array(Type.String({ minLength: 1 }), { minItems: 1 }),
    model_name: Type.Optional(Nullable(Type.String())),
    instance_type_id: Type.Optional(Nullable(Type.String())),
    hf_secret_name: Type.Optional(Nullable(Type.String())),
  },
  { title: 'DeployLoopsCheckpointsRequestV1' },
);

const InferenceUrls = Type.Object({
  base_url: Type.String(),
  chat_completions: Type.String(),
  completions: Type.String(),
  models: Type.String(),
});

export const DeployCheckpointsResponse = Type.Object(
  {
    model_id: Type.String(),
    deployment_id: Type.String(),
    model_name: Type.String(),
    base_model: Type.String(),
    status: Type.String(),
    checkpoints: Type.Array(Type.Object({ id: Type.String(), checkpoint_id: Type.String(), model: Type.String() })),
    inference: InferenceUrls,
  },
  { title: 'DeployLoopsCheckpointsResponseV1' },
);

export const CheckpointSourceResponse = Type.Object(
  {
    checkpoint_id: Type.String(),
    id: Type.String(),
    source_type: Type.Literal('s3'),
    checkpoint_path: Type.String(),
    files_url: Type.String(),
    volume: Type.Null(),
  },
  { title: 'LoopsCheckpointSourceV1' },
);

export const ModelV1 = Type.Object(
  {
    id: Type.String(),
    created_at: Type.String(),
    name: Type.String(),
    deployments_count: Type.Integer(),
    production_deployment_id: Nullable(Type.String()),
    development_deployment_id: Nullable(Type.String()),
    instance_type_name: Type.String(),
    team_name: Type.String(),
  },
  { title: 'ModelV1' },
);

const ModelIdParams = Type.Object({ model_id: Type.String() });

/** How a deployed checkpoint is shown: the deploy answer, Baseten's ModelV1 and DeploymentV1. */
export class ModelViews {
  constructor(
    private readonly core: LoopsCore,
    private readonly urls: PublicUrls,
  ) {}

  inference(r: ModelDeploymentRecord) {
    const base = this.urls.modelDeployment(r);
    return { base_url: `${base}/v1`, chat_completions: `${base}/v1/chat/completions`, completions: `${base}/v1/completions`, models: `${base}/v1/models` };
  }

  deployed(r: ModelDeploymentRecord) {
    return {
      model_id: r.model_id,
      deployment_id: r.deployment_id,
      model_name: r.name,
      base_model: r.base_model,
      status: this.core.modelDeployments.status(r),
      checkpoints: this.core.modelDeployments.checkpointsOf(r).map((c) => ({ id: c.id, checkpoint_id: c.name, model: c.name })),
      inference: this.inference(r),
    };
  }

  model(p: Principal, r: ModelDeploymentRecord) {
    return {
      id: r.model_id,
      created_at: new Date(r.created_at).toISOString(),
      name: r.name,
      deployments_count: 1,
      production_deployment_id: r.deployment_id,
      development_deployment_id: null,
      instance_type_name: r.instance_type_id,
      team_name: this.core.accounts.team(p, r.team_id).name,
    };
  }

  /** DeploymentV1, as the generic model-deployment route answers it for samplers. */
  deployment(r: ModelDeploymentRecord) {
    const status = this.core.modelDeployments.status(r);
    const ready = status === 'ACTIVE';
    return {
      id: r.deployment_id,
      created_at: new Date(r.created_at).toISOString(),
      name: r.name,
      model_id: r.model_id,
      is_production: true,
      is_development: false,
      status,
      active_replica_count: ready ? 1 : 0,
      autoscaling_settings: ready
        ? { min_replica: 1, max_replica: 1, autoscaling_window: 60, scale_down_delay: 900, concurrency_target: 1, target_utilization_percentage: 70 }
        : null,
      instance_type_name: r.instance_type_id,
      environment: 'production',
      request_backpressure_settings: {},
    };
  }

  source(c: CheckpointRecord) {
    return {
      checkpoint_id: c.name,
      id: c.id,
      source_type: 's3' as const,
      checkpoint_path: checkpointPath(c),
      files_url: this.urls.download(`/v1/loops/checkpoints/${c.id}/files`),
      volume: null,
    };
  }
}

/** Baseten's model routes for checkpoints deployed to inference (samplers stay on their own deployment routes). */
export function modelRoutes(app: TypedApp, ctx: ControlContext, views: ModelViews): void {
  const { core } = ctx;
  const tags = ['models'];

  app.get(
    '/v1/models',
    {
      schema: {
        tags,
        summary: 'All models of your organisation: each checkpoint deployment to inference',
        response: replies(Type.Object({ models: Type.Array(ModelV1) })),
      },
    },
    (req) => ({ models: core.modelDeployments.list(req.principal).map((r) => views.model(req.principal, r)) }),
  );

  const modelOf = (req: { principal: Principal }, id: string) => {
    const r = core.modelDeployments.findModel(req.principal, id);
    if (!r) throw notFound(`Model '${id}' not found: GET /v1/models lists yours.`, { field: 'model_id' });
    return r;
  };

  app.get(
    '/v1/models/:model_id',
    {
      schema: { tags, summary: 'A model by id', params: ModelIdParams, response: replies(ModelV1) },
    },
    (req) => views.model(req.principal, modelOf(req, req.params.model_id)),
  );

  app.get(
    '/v1/models/:model_id/deployments',
    {
      schema: { tags, summary: "A model's deployments", params: ModelIdParams },
    },
    (req) => ({ deployments: [views.deployment(modelOf(req, req.params.model_id))] }),
  );

  app.delete(
    '/v1/models/:model_id',
    {
      schema: {
        tags,
        summary: 'Delete a model and its deployment (it stops serving and leaves every route)',
        params: ModelIdParams,
        response: replies(Type.Object({ id: Type.String(), deleted: Type.Boolean() })),
      },
    },
    (req) => {
      const r = modelOf(req, req.params.model_id);
      core.accounts.requireMember(req.principal, r.team_id, `delete model ${r.model_id}`);
      core.modelDeployments.delete(r);
      return { id: r.model_id, deleted: true };
    },
  );
}
