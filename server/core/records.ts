/**
 * The records the core keeps, as stored. Front doors shape them into wire
 * responses (server/control/views.ts); nothing here knows the wire format.
 */

/** Who owns a resource: resources are visible to their organisation, listed for their user. */
export interface Ownership {
  org_id: string;
  user_id: string;
  team_id: string;
}

export interface Principal extends Ownership {
  email: string;
}

export interface OrgRecord {
  id: string;
  name: string;
}

export interface TeamRecord {
  id: string;
  org_id: string;
  name: string;
  is_default: boolean;
  created_at: number;
}

export interface UserRecord {
  id: string;
  org_id: string;
  team_id: string;
  email: string;
}

export interface SessionRecord extends Ownership {
  id: string;
  created_at: number;
  training_project_id: string | null;
}

export type RunStatus = 'ACTIVE' | 'INACTIVE';

export interface RunRecord extends Ownership {
  id: string;
  session_id: string;
  deployment_id: string;
  /** The paired sampler, or null for a trainer-only run that has none yet. */
  sampler_id: string | null;
  name: string;
  base_model: string;
  created_at: number;
  status: RunStatus;
  /** Why the run is INACTIVE (deactivated, idle, replaced, server restart). */
  inactive_reason: string | null;
  max_seq_len: number;
  lora_rank: number;
  seed: number | null;
  scale_down_delay_seconds: number;
  availability_model: 'dedicated' | 'spot';
  replicas: number;
  /** bt:// checkpoint the trainer loads before it reports healthy. */
  path: string | null;
}

/** The wire enum `LoopsDeploymentStatus`. */
export type DeploymentStatus = 'CREATED' | 'DEPLOYING' | 'RUNNING' | 'SCALED_TO_ZERO' | 'FAILED' | 'STOPPED' | 'PREEMPTED';

/** A Loops deployment: the long-lived trainer (+ sampler) that runs execute on. */
export interface DeploymentRecord extends Ownership {
  id: string;
  base_model: string;
  created_at: number;
  status: DeploymentStatus;
  active_run_id: string | null;
  latest_run_id: string | null;
  sampler_id: string | null;
  availability_model: 'dedicated' | 'spot';
  node_count: number;
}

/** The wire enum `DeploymentStatusV1`. */
export const SAMPLER_STATUSES = [
  'BUILDING',
  'DEPLOYING',
  'DEPLOY_FAILED',
  'LOADING_MODEL',
  'ACTIVE',
  'UNHEALTHY',
  'BUILD_FAILED',
  'BUILD_STOPPED',
  'DEACTIVATING',
  'INACTIVE',
  'FAILED',
  'UPDATING',
  'SCALED_TO_ZERO',
  'WAKING_UP',
] as const;
export type SamplerStatus = (typeof SAMPLER_STATUSES)[number];

export interface SamplerRecord extends Ownership {
  id: string;
  session_id: string;
  /** Hashid of the Baseten model behind the sampler (generic model API). */
  model_id: string;
  /** Hashid of the model deployment (generic model API). */
  model_deployment_id: string;
  /** Display name of the model deployment; PATCH renames it. */
  name: string;
  base_model: string;
  /** Paired run, or null for a standalone sampler. */
  run_id: string | null;
  created_at: number;
  status: SamplerStatus;
  max_seq_length: number;
  /** Sampler checkpoint served by a standalone sampler, if any. */
  model_path: string | null;
  replicas: number;
  /** Set by DELETE on the generic model-deployment route. */
  deleted: boolean;
}

export type CheckpointTarget = 'trainer' | 'sampler';

export interface CheckpointFileRecord {
  relative_file_name: string;
  size_bytes: number;
  last_modified: number;
  /** Hex SHA-256 of the bytes saved; absent in records saved before checksums (those are checked by size only). */
  sha256?: string;
}

export interface CheckpointRecord extends Ownership {
  /** Global id (7 mixed-case characters). */
  id: string;
  run_id: string;
  base_model: string;
  target: CheckpointTarget;
  name: string;
  created_at: number;
  lora_adapter_config: Record<string, unknown> | null;
  files: CheckpointFileRecord[];
}

/**
 * A Baseten model made by deploying sampler checkpoints (`POST /v1/loops/checkpoints/deploy`):
 * one deployment serving each checkpoint's adapter on the base model, addressed by checkpoint name.
 */
export interface ModelDeploymentRecord extends Ownership {
  /** The Baseten model (8 lowercase characters). */
  model_id: string;
  /** Its one deployment (7 lowercase characters). */
  deployment_id: string;
  name: string;
  base_model: string;
  instance_type_id: string;
  hf_secret_name: string | null;
  /** Global ids of the deployed sampler checkpoints, in the order given. */
  checkpoint_ids: string[];
  created_at: number;
  /** The cold start this deployment walks (the setting when it was deployed). */
  cold_start_ms: number;
  /** Set by deactivate: INACTIVE from then on. */
  deactivated_at: number | null;
  /** Set by DELETE of the model or the deployment: gone from every route. */
  deleted: boolean;
}

export interface UserConfigRecord {
  user_id: string;
  trainer_accelerator_priority: string[] | null;
  sampler_accelerator_priority: string[] | null;
}

export type LogLevel = 'DEBUG' | 'INFO' | 'WARNING' | 'ERROR';
export const LOG_LEVELS: LogLevel[] = ['DEBUG', 'INFO', 'WARNING', 'ERROR'];

export interface LogRecord {
  deployment_id: string;
  ts_ms: number;
  level: LogLevel;
  message: string;
  replica: string | null;
  request_id: string | null;
}
