import { availableParallelism, totalmem } from 'node:os';
import type { LoopsCore } from '../core/core.js';
import type { CheckpointRecord, DeploymentRecord, LogRecord, RunRecord, SamplerRecord, TeamRecord, UserConfigRecord } from '../core/records.js';
import type { PresignedFile } from '../core/checkpoints.js';
import type { PublicUrls } from '../http/public-urls.js';

/**
 * Times as ISO text. A record's times never change, and list routes format them on every request (5% of
 * GET /runs's time): the texts made are kept, up to 4,096 of them.
 */
const isoTexts = new Map<number, string>();
const iso = (ms: number): string => {
  let text = isoTexts.get(ms);
  if (text === undefined) {
    if (isoTexts.size >= 4096) isoTexts.clear();
    text = new Date(ms).toISOString();
    isoTexts.set(ms, text);
  }
  return text;
};

/** loops-mock serves every trainer and sampler from this one local process on CPU; say so. */
const INSTANCE_TYPE = {
  id: 'loops-mock-cpu',
  name: 'loops-mock local CPU',
  memory_limit_mib: Math.floor(totalmem() / 2 ** 20),
  millicpu_limit: availableParallelism() * 1000,
  gpu_count: 0,
  gpu_type: null,
  gpu_memory_limit_mib: null,
};

/** The rank, as the quickstart's checkpoint listing shows an adapter's config; the whole PEFT config is in the checkpoint's adapter_config.json. */
function loraAdapterSummary(config: Record<string, unknown> | null): { r: number } | null {
  return typeof config?.r === 'number' ? { r: config.r } : null;
}

/** Shapes core records into the wire objects of Baseten's schema. */
export class Views {
  constructor(
    private readonly core: LoopsCore,
    private readonly urls: PublicUrls,
  ) {}

  user(o: { user_id: string; org_id: string }) {
    return { email: this.core.accounts.emailOf(o.user_id) };
  }

  sampler(s: SamplerRecord) {
    return {
      id: s.id,
      base_url: this.urls.sampler(s),
      base_model: s.base_model,
      created_at: iso(s.created_at),
      model_id: s.model_id,
      deployment_id: s.model_deployment_id,
      status: { name: s.status },
      user: this.user(s),
      instance_type: INSTANCE_TYPE,
      node_count: 1,
    };
  }

  run(r: RunRecord) {
    const s = r.sampler_id ? this.core.fleet.findSampler(r.sampler_id) : undefined;
    return {
      id: r.id,
      session_id: r.session_id,
      deployment_id: r.deployment_id,
      name: r.name,
      base_model: r.base_model,
      base_url: this.urls.trainer(r),
      created_at: iso(r.created_at),
      status: { name: r.status },
      user: this.user(r),
      sampler: s ? this.sampler(s) : null,
    };
  }

  deployment(d: DeploymentRecord) {
    const s = d.sampler_id ? this.core.fleet.findSampler(d.sampler_id) : undefined;
    const latest = d.latest_run_id ? this.core.fleet.findRun(d.latest_run_id) : undefined;
    return {
      id: d.id,
      active_run_id: d.active_run_id,
      latest_run_id: d.latest_run_id,
      base_model: d.base_model,
      base_url: latest ? this.urls.trainer(latest) : '',
      status: { name: d.status },
      user: this.user(d),
      created_at: iso(d.created_at),
      availability_model: d.availability_model,
      instance_type: INSTANCE_TYPE,
      node_count: d.node_count,
      sampler: s ? this.sampler(s) : null,
    };
  }

  /** A sampler seen through the generic model-deployment API. */
  modelDeployment(s: SamplerRecord) {
    const ready = s.status === 'ACTIVE';
    return {
      id: s.model_deployment_id,
      created_at: iso(s.created_at),
      name: s.name,
      model_id: s.model_id,
      is_production: true,
      is_development: false,
      status: s.status,
      active_replica_count: ready ? s.replicas : 0,
      // Upstream: null until the model has finished deploying.
      autoscaling_settings:
        ready || s.status === 'SCALED_TO_ZERO' || s.status === 'WAKING_UP'
          ? {
              min_replica: 0,
              max_replica: s.replicas,
              autoscaling_window: 60,
              scale_down_delay: 900,
              concurrency_target: 1,
              target_utilization_percentage: 70,
              target_in_flight_tokens: null,
              max_scale_down_rate: null,
            }
          : null,
      instance_type_name: INSTANCE_TYPE.name,
      environment: 'production',
      labels: { 'loops-sampler-id': s.id, ...(s.run_id ? { 'loops-run-id': s.run_id } : {}) },
      region: null,
      request_backpressure_settings: { policy: null },
    };
  }

  checkpoint(c: CheckpointRecord) {
    return {
      // As the quickstart lists them: checkpoint_id is the bare name (a trainer and a sampler checkpoint of one run
      // may share it; target tells them apart), every checkpoint is a LoRA, the adapter config shows its rank alone,
      // and sync_status is null (the folder is whole before its record exists).
      checkpoint_id: c.name,
      created_at: iso(c.created_at),
      checkpoint_type: 'lora',
      base_model: c.base_model,
      lora_adapter_config: loraAdapterSummary(c.lora_adapter_config),
      size_bytes: c.files.reduce((sum, f) => sum + f.size_bytes, 0),
      sync_status: null,
      id: c.id,
      run_id: c.run_id,
      target: c.target,
    };
  }

  checkpointFile(f: PresignedFile) {
    return {
      url: this.urls.download(f.path),
      relative_file_name: f.relative_file_name,
      node_rank: 0,
      size_bytes: f.size_bytes,
      last_modified: iso(f.last_modified),
    };
  }

  log(l: LogRecord) {
    return {
      timestamp: (BigInt(l.ts_ms) * 1_000_000n).toString(),
      message: l.message,
      replica: l.replica,
      request_id: l.request_id,
      level: l.level,
    };
  }

  userConfig(c: UserConfigRecord) {
    return { trainer_accelerator_priority: c.trainer_accelerator_priority, sampler_accelerator_priority: c.sampler_accelerator_priority };
  }

  team(t: TeamRecord) {
    return { id: t.id, name: t.name, default: t.is_default, created_at: iso(t.created_at) };
  }
}
