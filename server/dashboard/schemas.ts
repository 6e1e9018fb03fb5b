import Type from 'typebox';
import { DeployCheckpointsResponse } from '../control/models.js';

/** The shapes of the dashboard's data routes, as /openapi.json lists them. Records inside are the admin API's and Baseten's own shapes. */
const Any = Type.Unknown();
const Iso = Type.String({ description: 'ISO 8601, on the server clock' });
const IsoOrNull = Type.Union([Iso, Type.Null()]);

export const RunSummary = Type.Object({
  id: Type.String(),
  name: Type.Union([Type.String(), Type.Null()]),
  base_model: Type.String(),
  lora_rank: Type.Integer(),
  status: Type.String(),
  inactive_reason: Type.Optional(Type.Union([Type.String(), Type.Null()])),
  policy_version: Type.Integer(),
  session_id: Type.String(),
  sampler_id: Type.Union([Type.String(), Type.Null()]),
  created_at: Iso,
  deactivated_at: IsoOrNull,
});

export const SamplerSummary = Type.Object({
  id: Type.String(),
  base_model: Type.String(),
  status: Type.String(),
  run_id: Type.Union([Type.String(), Type.Null()]),
  model_id: Type.String(),
  replicas: Type.Array(Any),
  published_version: Type.Integer(),
});

/** A checkpoint deployed to inference: the deploy answer (its status as of now), its instance type and when it was deployed. */
export const DeployedModel = Type.Intersect([DeployCheckpointsResponse, Type.Object({ instance_type_id: Type.String(), created_at: Iso })]);

export const Overview = Type.Object({
  version: Type.String(),
  admin: Type.Boolean({ description: 'the admin API is served (--admin): controls are shown' }),
  token_needed: Type.Boolean({ description: 'the admin API needs the admin token (--admin-token)' }),
  signed_in: Type.Boolean(),
  clock: Type.Object({ mode: Type.Enum(['real', 'virtual']), now: Iso }),
  scenario: Type.Union([Type.Object({ name: Type.Union([Type.String(), Type.Null()]), applied_at: Iso }), Type.Null()]),
  runs: Type.Array(RunSummary),
  samplers: Type.Array(SamplerSummary),
  models: Type.Array(DeployedModel, { description: 'checkpoints deployed to inference, newest first (deleted ones are gone)' }),
  faults: Type.Array(Any),
  progress: Type.Array(Any),
  held: Type.Array(Any),
});

export const OperationEvent = Type.Object({
  operation_id: Type.String(),
  op: Type.String(),
  status: Type.Enum(['done', 'error']),
  submitted_at: Iso,
  finished_at: Iso,
  duration_ms: Type.Number(),
  step: Type.Integer({ description: 'optimizer steps applied when it ran: the x of a loss point' }),
  loss: Type.Optional(Type.Number()),
  grad_norm: Type.Optional(Type.Number()),
  learning_rate: Type.Optional(Type.Number()),
  policy_version: Type.Optional(Type.Integer()),
  path: Type.Optional(Type.String()),
  error_class: Type.Optional(Type.String()),
});

export const RunDetail = Type.Object({
  run: Type.Intersect([RunSummary, Type.Object({ view: Any })]),
  operations: Type.Array(OperationEvent),
  checkpoints: Type.Array(Any),
});

export const SamplerTimeline = Type.Object({
  sampler: SamplerSummary,
  created_at: Iso,
  events: Type.Array(
    Type.Object({
      at: Iso,
      kind: Type.Enum(['published', 'live']),
      version: Type.Integer(),
      replica: Type.Optional(Type.Integer()),
      path: Type.Optional(Type.String()),
    }),
  ),
  requests: Type.Array(
    Type.Object({
      seq: Type.Integer(),
      time: Iso,
      op: Type.String(),
      status: Type.Integer(),
      floor: Type.Union([Type.Integer(), Type.Null()]),
      policy_version: Type.Union([Type.Integer(), Type.Null()]),
      retry_after: Type.Union([Type.String(), Type.Null()]),
    }),
  ),
  now: Iso,
});

export const JournalPage = Type.Object({ entries: Type.Array(Any), next_since: Type.Integer(), evicted: Type.Integer() });

export const JournalFilter = Type.Object(
  {
    since: Type.Optional(Type.Integer({ minimum: 0, description: 'entries after this seq' })),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, description: 'the newest this many of the matches (200)' })),
    surface: Type.Optional(Type.Enum(['control', 'trainer', 'sampler', 'admin', 'hub', 'proxy', 'service'])),
    run_id: Type.Optional(Type.String()),
    status: Type.Optional(Type.String({ pattern: '^([1-5]xx|[0-9]{3})$', description: 'a status (408) or a class (4xx)' })),
    q: Type.Optional(Type.String({ maxLength: 200, description: 'text anywhere in the entry, any case' })),
  },
  { additionalProperties: false },
);
