import type { FastifyRequest } from 'fastify';
import Type from 'typebox';
import type { Principal } from '../core/records.js';
import type { ControlContext, TypedApp } from './context.js';
import { replies } from './context.js';
import { CheckpointSourceResponse, DeployCheckpointsRequest, DeployCheckpointsResponse, type ModelViews } from './models.js';
import {
  CheckpointFilesQuery,
  CheckpointFilesResponse,
  CheckpointIdParams,
  EmptyResponse,
  ListCheckpointsQuery,
  ListCheckpointsResponse,
  ValidateLoopsCheckpointRequestV1,
} from './schemas.js';

/** Checkpoint listing, validation and presigned file listing (authenticated). */
export function checkpointRoutes(app: TypedApp, ctx: ControlContext, modelViews: ModelViews): void {
  const { core, views } = ctx;
  const tags = ['checkpoints'];

  app.get(
    '/v1/loops/checkpoints',
    {
      schema: {
        tags,
        summary: 'List checkpoints by exactly one of run_id, base_model, checkpoint_path',
        querystring: ListCheckpointsQuery,
        response: replies(ListCheckpointsResponse),
      },
    },
    (req) => ({ checkpoints: core.checkpoints.list(req.principal, req.query).map((c) => views.checkpoint(c)) }),
  );

  app.post(
    '/v1/loops/checkpoints/validate',
    {
      schema: {
        tags,
        summary: 'Check that a bt:// checkpoint path exists and is yours to load (400 otherwise)',
        body: ValidateLoopsCheckpointRequestV1,
        response: replies(EmptyResponse),
      },
    },
    (req) => {
      core.checkpoints.resolve(req.principal, req.body.checkpoint_path, 'checkpoint_path');
      return {};
    },
  );

  app.post(
    '/v1/loops/checkpoints/deploy',
    {
      schema: {
        tags,
        summary: 'Deploy sampler checkpoints to inference: a new model (not idempotent) serving each as `model` = its checkpoint name',
        body: DeployCheckpointsRequest,
        response: replies(DeployCheckpointsResponse),
      },
    },
    (req) => modelViews.deployed(core.modelDeployments.deploy(req.principal, req.body)),
  );

  app.get(
    '/v1/loops/checkpoints/:checkpoint_id/source',
    {
      schema: {
        tags,
        summary: "Where a checkpoint's weights live: s3 (list them with /files)",
        params: CheckpointIdParams,
        response: replies(CheckpointSourceResponse),
      },
    },
    (req) => modelViews.source(core.checkpoints.get(req.principal, req.params.checkpoint_id)),
  );

  app.get(
    '/v1/loops/checkpoints/:checkpoint_id/files',
    {
      schema: {
        tags,
        summary: "Presigned download URLs of a checkpoint's files; page_token is an integer offset",
        params: CheckpointIdParams,
        querystring: CheckpointFilesQuery,
        response: replies(CheckpointFilesResponse),
      },
    },
    (req) => {
      const page = core.checkpoints.files(req.principal, req.params.checkpoint_id, req.query.page_size ?? 1000, req.query.page_token ?? 0);
      return { presigned_urls: page.files.map((f) => views.checkpointFile(f)), next_page_token: page.next, total_count: page.total };
    },
  );
}

const DownloadParams = Type.Object({ checkpoint_id: Type.String(), '*': Type.String() });
const DownloadQuery = Type.Object({ expires: Type.Integer({ minimum: 0 }), signature: Type.String({ minLength: 1 }) });

/**
 * Where presigned URLs point. Like an object store's presigned URL it needs
 * no API key: the signature is the permission. A caller who sends a key of
 * another organisation is refused all the same.
 */
export function checkpointDownloadRoute(app: TypedApp, ctx: ControlContext, principalIfAny: (req: FastifyRequest) => Principal | undefined): void {
  app.get(
    '/checkpoint-files/:checkpoint_id/*',
    {
      schema: { tags: ['checkpoints'], summary: 'Download one checkpoint file through a presigned URL', params: DownloadParams, querystring: DownloadQuery },
    },
    (req, reply) => {
      const bytes = ctx.core.checkpoints.download(req.params.checkpoint_id, req.params['*'], req.query.expires, req.query.signature, principalIfAny(req));
      return reply.type('application/octet-stream').header('content-length', bytes.length).send(bytes);
    },
  );
}
