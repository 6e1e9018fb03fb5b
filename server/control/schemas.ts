/**
 * TypeBox schemas of the control plane, written from Baseten's published
 * management OpenAPI document: field names, types, defaults, enums and
 * required sets follow it. Request objects reject unknown fields so a typo
 * is a 400 naming it, not a silently ignored setting.
 */
import Type, { type Static, type TSchema } from 'typebox';
import { SAMPLER_STATUSES } from '../core/records.js';

const Nullable = <T extends TSchema>(schema: T, options: Record<string, unknown> = {}) => Type.Union([schema, Type.Null()], options);
const strict = { additionalProperties: false } as const;
const DateTime = Type.String({ format: 'date-time' });

// ---- shared -------------------------------------------------------------

export const UserV1 = Type.Object({ email: Type.Optional(Nullable(Type.String())) }, { title: 'UserV1' });

export const DeploymentStatusV1 = Type.Enum([...SAMPLER_STATUSES], { title: 'DeploymentStatusV1' });

export const InstanceTypeV1 = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    memory_limit_mib: Type.Integer(),
    millicpu_limit: Type.Integer(),
    gpu_count: Type.Integer(),
    gpu_type: Nullable(Type.String()),
    gpu_memory_limit_mib: Nullable(Type.Integer()),
  },
  { title: 'InstanceTypeV1' },
);

export const LoopsSamplerV1 = Type.Object(
  {
    id: Type.String(),
    base_url: Type.String(),
    base_model: Type.String(),
    created_at: DateTime,
    model_id: Type.String(),
    deployment_id: Type.String(),
    status: Type.Object({ name: DeploymentStatusV1 }),
    user: UserV1,
    instance_type: Type.Optional(Nullable(InstanceTypeV1)),
    node_count: Type.Optional(Type.Integer()),
  },
  { title: 'LoopsSamplerV1' },
);

export const LoopsRunV1 = Type.Object(
  {
    id: Type.String(),
    session_id: Type.String(),
    deployment_id: Type.Optional(Nullable(Type.String())),
    name: Type.String(),
    base_model: Type.String(),
    base_url: Type.String(),
    created_at: DateTime,
    status: Type.Object({ name: Type.Enum(['ACTIVE', 'INACTIVE']) }),
    user: UserV1,
    sampler: Type.Optional(Nullable(LoopsSamplerV1)),
  },
  { title: 'LoopsRunV1' },
);

const LoopsSessionV1 = Type.Object({ id: Type.String() }, { title: 'LoopsSessionV1' });

// ---- path and query parameters -----------------------------------------

export const SessionIdParams = Type.Object({ session_id: Type.String() });
export const RunIdParams = Type.Object({ run_id: Type.String() });
export const SamplerIdParams = Type.Object({ sampler_id: Type.String() });
export const CheckpointIdParams = Type.Object({ checkpoint_id: Type.String() });
export const DeploymentIdParams = Type.Object({ deployment_id: Type.String() });
export const TeamIdParams = Type.Object({ team_id: Type.String() });
export const ModelDeploymentParams = Type.Object({ model_id: Type.String(), deployment_id: Type.String() });

const Scope = Type.Optional(Type.String({ description: "'org' lists the organisation's resources; omit for your own." }));
export const ListRunsQuery = Type.Object({ run_id: Type.Optional(Type.String()), base_model: Type.Optional(Type.String()), scope: Scope }, strict);
export const ScopeQuery = Type.Object({ scope: Scope }, strict);
export const ListCheckpointsQuery = Type.Object(
  {
    run_id: Type.Optional(Type.String()),
    base_model: Type.Optional(Type.String()),
    checkpoint_path: Type.Optional(Type.String()),
  },
  strict,
);
export const CheckpointFilesQuery = Type.Object(
  {
    page_size: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 1000 })),
    page_token: Type.Optional(Type.Integer({ minimum: 0, default: 0 })),
  },
  strict,
);
export const TeamsQuery = Type.Object({ name: Type.Optional(Type.String()) }, strict);
export const LogLevelV1 = Type.Enum(['DEBUG', 'INFO', 'WARNING', 'ERROR']);
export const LogsQuery = Type.Object(
  {
    start_epoch_millis: Type.Optional(Type.Integer({ minimum: 0 })),
    end_epoch_millis: Type.Optional(Type.Integer({ minimum: 0 })),
    direction: Type.Optional(Type.Enum(['asc', 'desc'])),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 500 })),
    min_level: Type.Optional(LogLevelV1),
  },
  strict,
);
/** The same filters as a JSON body: how truss asks for a model deployment's logs (POST, `{}` or no body for the defaults). */
export const LogsBody = Type.Union(
  [
    Type.Object(
      {
        start_epoch_millis: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
        end_epoch_millis: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
        direction: Type.Optional(Nullable(Type.Enum(['asc', 'desc']))),
        limit: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: 1000 }))),
        min_level: Type.Optional(Nullable(LogLevelV1)),
      },
      strict,
    ),
    Type.Null(),
  ],
  { title: 'GetModelDeploymentLogsRequestV1' },
);

// ---- request bodies ------------------------------------------------------

export const CreateSessionRequest = Type.Union([Type.Object({ training_project_id: Type.Optional(Nullable(Type.String())) }, strict), Type.Null()], {
  title: 'CreateLoopsSessionRequest',
});

export const CreateLoopsRunRequestV1 = Type.Object(
  {
    session_id: Type.String({ minLength: 1 }),
    base_model: Type.String({ minLength: 1 }),
    name: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 255 }))),
    max_seq_len: Type.Optional(Nullable(Type.Integer())),
    lora_rank: Type.Optional(Type.Integer({ minimum: 1, default: 64 })),
    seed: Type.Optional(Nullable(Type.Integer())),
    scale_down_delay_seconds: Type.Optional(Type.Integer({ exclusiveMinimum: 0, maximum: 3600, default: 3600 })),
    availability_model: Type.Optional(Type.Enum(['dedicated', 'spot'], { default: 'dedicated' })),
    replicas: Type.Optional(Type.Integer({ minimum: 1, default: 1 })),
    path: Type.Optional(Nullable(Type.String())),
    reuse_from_run_id: Type.Optional(Nullable(Type.String())),
    reuse_from_session_id: Type.Optional(Nullable(Type.String())),
  },
  { ...strict, title: 'CreateLoopsRunRequestV1' },
);
export type CreateLoopsRunRequestV1 = Static<typeof CreateLoopsRunRequestV1>;

export const CreateLoopsSamplerRequestV1 = Type.Object(
  {
    session_id: Type.String({ minLength: 1 }),
    base_model: Type.Optional(Nullable(Type.String({ minLength: 1 }))),
    run_id: Type.Optional(Nullable(Type.String({ minLength: 1 }))),
    max_seq_length: Type.Optional(Nullable(Type.Integer())),
    model_path: Type.Optional(Nullable(Type.String())),
    reuse_from_session_id: Type.Optional(Nullable(Type.String())),
  },
  { ...strict, title: 'CreateLoopsSamplerRequestV1' },
);

export const ValidateLoopsCheckpointRequestV1 = Type.Object({ checkpoint_path: Type.String() }, { ...strict, title: 'ValidateLoopsCheckpointRequestV1' });

const Priority = Type.Optional(Nullable(Type.Array(Type.String())));
export const PatchLoopsUserConfigRequestV1 = Type.Object(
  {
    trainer_accelerator_priority: Priority,
    sampler_accelerator_priority: Priority,
  },
  { ...strict, title: 'PatchLoopsUserConfigRequestV1' },
);

export const GetLoopsDeploymentMetricsRequestV1 = Type.Union(
  [
    Type.Object(
      {
        end_epoch_millis: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
        start_epoch_millis: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
        step_seconds: Type.Optional(Nullable(Type.Integer({ minimum: 1 }))),
        time_divisor_seconds: Type.Optional(Nullable(Type.Integer({ minimum: 1 }))),
      },
      strict,
    ),
    Type.Null(),
  ],
  { title: 'GetLoopsDeploymentMetricsRequestV1' },
);

export const UpdateDeploymentRequestV1 = Type.Object(
  {
    name: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 255 }))),
  },
  { ...strict, title: 'UpdateDeploymentRequestV1' },
);

// ---- responses -------------------------------------------------------------

export const SessionResponse = Type.Object({ session: LoopsSessionV1 });
export const RunResponse = Type.Object({ run: LoopsRunV1 });
export const ListRunsResponse = Type.Object({ runs: Type.Array(LoopsRunV1) });
export const DeactivateRunResponse = Type.Object({ id: Type.String(), base_model: Type.String(), user: UserV1 });
export const SamplerResponse = Type.Object({ sampler: LoopsSamplerV1 });
export const ListSamplersResponse = Type.Object({ samplers: Type.Array(LoopsSamplerV1) });

export const LoopsCheckpointV1 = Type.Object(
  {
    checkpoint_id: Type.String(),
    created_at: DateTime,
    checkpoint_type: Type.String(),
    base_model: Nullable(Type.String()),
    lora_adapter_config: Nullable(Type.Record(Type.String(), Type.Unknown())),
    size_bytes: Type.Integer(),
    sync_status: Type.Optional(Nullable(Type.String())),
    id: Type.String(),
    run_id: Type.String(),
    target: Type.Enum(['sampler', 'trainer']),
  },
  { title: 'LoopsCheckpointV1' },
);
export const ListCheckpointsResponse = Type.Object({ checkpoints: Type.Array(LoopsCheckpointV1) });
export const EmptyResponse = Type.Object({});
export const CheckpointFilesResponse = Type.Object({
  presigned_urls: Type.Array(
    Type.Object({
      url: Type.String(),
      relative_file_name: Type.String(),
      node_rank: Type.Integer(),
      size_bytes: Type.Integer(),
      last_modified: Type.String(),
    }),
  ),
  next_page_token: Type.Optional(Nullable(Type.Integer())),
  total_count: Type.Integer(),
});

export const CapabilitiesResponse = Type.Object({
  supported_models: Type.Array(
    Type.Object({
      model_name: Type.String(),
      max_context_length: Type.Integer(),
      supports_vision_language: Type.Boolean(),
      // Not in the published schema; the serverless page says each model in this answer has it.
      serverless: Type.Boolean(),
    }),
  ),
});

export const LoopsDeploymentV1 = Type.Object(
  {
    id: Type.String(),
    active_run_id: Type.Optional(Nullable(Type.String())),
    latest_run_id: Type.Optional(Nullable(Type.String())),
    base_model: Type.String(),
    base_url: Type.String(),
    status: Type.Object({ name: Type.Enum(['CREATED', 'DEPLOYING', 'RUNNING', 'SCALED_TO_ZERO', 'FAILED', 'STOPPED', 'PREEMPTED']) }),
    user: UserV1,
    created_at: DateTime,
    availability_model: Type.Optional(Type.Enum(['dedicated', 'spot'])),
    instance_type: InstanceTypeV1,
    node_count: Type.Optional(Type.Integer()),
    sampler: Type.Optional(Nullable(LoopsSamplerV1)),
  },
  { title: 'LoopsDeploymentV1' },
);
export const DeploymentResponse = Type.Object({ deployment: LoopsDeploymentV1 });
export const ListDeploymentsResponse = Type.Object({ deployments: Type.Array(LoopsDeploymentV1) });

export const LogsResponse = Type.Object({
  logs: Type.Array(
    Type.Object({
      timestamp: Type.String(),
      message: Type.String(),
      replica: Nullable(Type.String()),
      request_id: Type.Optional(Nullable(Type.String())),
      level: Type.Optional(Nullable(LogLevelV1)),
    }),
  ),
});

const Metric = Type.Object({ value: Type.Number(), timestamp: DateTime });
const MetricSeries = Type.Array(Metric);
const StorageMetrics = Type.Object({ usage_bytes: MetricSeries, utilization: MetricSeries });
export const MetricsResponse = Type.Object({
  deployment_id: Type.String(),
  metrics: Type.Object({
    inference_volume: MetricSeries,
    concurrent_requests: MetricSeries,
    response_time_stats: Type.Array(
      Type.Object({
        timestamp: DateTime,
        p50: Type.Optional(Nullable(Type.Number())),
        p95: Type.Optional(Nullable(Type.Number())),
        p99: Type.Optional(Nullable(Type.Number())),
      }),
    ),
    inference_volume_by_status: Type.Array(
      Type.Object({
        timestamp: DateTime,
        status_2xx: Type.Number(),
        status_4xx: Type.Number(),
        status_5xx: Type.Number(),
      }),
    ),
    gpu_memory_usage_bytes: Type.Record(Type.String(), MetricSeries),
    gpu_utilization: Type.Record(Type.String(), MetricSeries),
    cpu_usage: MetricSeries,
    cpu_memory_usage_bytes: MetricSeries,
    ephemeral_storage: StorageMetrics,
    per_node_metrics: Type.Array(
      Type.Object({
        node_id: Type.String(),
        gpu_memory_usage_bytes: Type.Record(Type.String(), MetricSeries),
        gpu_utilization: Type.Record(Type.String(), MetricSeries),
        cpu_usage: MetricSeries,
        cpu_memory_usage_bytes: MetricSeries,
        ephemeral_storage: StorageMetrics,
      }),
    ),
  }),
});

export const LoopsUserConfigV1 = Type.Object({
  trainer_accelerator_priority: Nullable(Type.Array(Type.String())),
  sampler_accelerator_priority: Nullable(Type.Array(Type.String())),
});
export const UserConfigResponse = Type.Object({ user_config: LoopsUserConfigV1 });

export const TeamsResponse = Type.Object({
  teams: Type.Array(Type.Object({ id: Type.String(), name: Type.String(), default: Type.Boolean(), created_at: DateTime })),
});

export const DeploymentV1 = Type.Object(
  {
    id: Type.String(),
    created_at: DateTime,
    name: Type.String(),
    model_id: Type.String(),
    is_production: Type.Boolean(),
    is_development: Type.Boolean(),
    status: DeploymentStatusV1,
    active_replica_count: Type.Integer(),
    autoscaling_settings: Nullable(
      Type.Object({
        min_replica: Type.Integer(),
        max_replica: Type.Integer(),
        autoscaling_window: Nullable(Type.Integer()),
        scale_down_delay: Nullable(Type.Integer()),
        concurrency_target: Type.Integer(),
        target_utilization_percentage: Nullable(Type.Integer()),
        target_in_flight_tokens: Type.Optional(Nullable(Type.Integer())),
        max_scale_down_rate: Type.Optional(Nullable(Type.Integer())),
      }),
    ),
    instance_type_name: Nullable(Type.String()),
    environment: Nullable(Type.String()),
    labels: Type.Optional(Nullable(Type.Record(Type.String(), Type.Unknown()))),
    region: Type.Optional(Nullable(Type.Object({ slug: Type.String(), display_name: Type.String() }))),
    request_backpressure_settings: Type.Object({ policy: Type.Optional(Nullable(Type.Enum(['QUEUE_ON_FULL', 'REJECT_ON_FULL']))) }),
  },
  { title: 'DeploymentV1' },
);
export const DeploymentTombstoneV1 = Type.Object({ id: Type.String(), deleted: Type.Boolean(), model_id: Type.String() });
export const DeactivateResponseV1 = Type.Object({ success: Type.Optional(Type.Boolean({ default: true })) });
