import { readAdapter, type EnginePool, type LoraAdapter } from '../../models/index.js';
import type { Checkpoints } from './checkpoints.js';
import type { Clock } from './clock.js';
import type { DeploymentLogs } from './deployment-logs.js';
import { conflict, invalid, LoopsError, notFound } from './errors.js';
import { newModelId, newResourceId } from './ids.js';
import type { CheckpointRecord, ModelDeploymentRecord, Principal, SamplerStatus } from './records.js';
import type { Hold, Progress } from './progress.js';
import type { Settings } from './settings.js';
import type { Store } from './store.js';

export interface DeployInput {
  checkpoint_ids: string[];
  model_name?: string | null;
  instance_type_id?: string | null;
  hf_secret_name?: string | null;
}

/** The instance types the mock lists [M]: single-node H100 and A100 shapes, and a multi-node H100 one truss must skip. */
export const INSTANCE_TYPES = [
  {
    id: 'H100:1x',
    name: 'H100:1x',
    display_name: '1x H100',
    gpu_count: 1,
    default: true,
    gpu_memory: 81_920,
    node_count: 1,
    gpu_type: 'H100',
    millicpu_limit: 26_000,
    memory_limit: 240_000,
    price: 0.1083,
    limited_capacity: false,
  },
  {
    id: 'H100:2x',
    name: 'H100:2x',
    display_name: '2x H100',
    gpu_count: 2,
    default: false,
    gpu_memory: 81_920,
    node_count: 1,
    gpu_type: 'H100',
    millicpu_limit: 52_000,
    memory_limit: 480_000,
    price: 0.2166,
    limited_capacity: false,
  },
  {
    id: 'H100:8x',
    name: 'H100:8x',
    display_name: '8x H100',
    gpu_count: 8,
    default: false,
    gpu_memory: 81_920,
    node_count: 1,
    gpu_type: 'H100',
    millicpu_limit: 208_000,
    memory_limit: 1_920_000,
    price: 0.8664,
    limited_capacity: false,
  },
  {
    id: 'H100:8x2',
    name: 'H100:8x2',
    display_name: '2 nodes of 8x H100',
    gpu_count: 8,
    default: false,
    gpu_memory: 81_920,
    node_count: 2,
    gpu_type: 'H100',
    millicpu_limit: 208_000,
    memory_limit: 1_920_000,
    price: 1.7328,
    limited_capacity: true,
  },
  {
    id: 'A100:1x',
    name: 'A100:1x',
    display_name: '1x A100',
    gpu_count: 1,
    default: false,
    gpu_memory: 81_920,
    node_count: 1,
    gpu_type: 'A100',
    millicpu_limit: 12_000,
    memory_limit: 144_000,
    price: 0.0667,
    limited_capacity: false,
  },
];

/** The instance type a deploy gets when it names none (truss asks listed_instances for an H100 one). */
export const DEFAULT_INSTANCE_TYPE_ID = 'H100:1x';

/** The op name a progress rule gives in `match.op` to hold a deployment's start (its `run_id` matches the deployment id). */
export const DEPLOY_OP = 'deploy_checkpoint';

/** The phases of a cold start, a third of it each, in the order Baseten reports them. */
const STARTING: SamplerStatus[] = ['BUILDING', 'DEPLOYING', 'LOADING_MODEL'];

/**
 * Checkpoints deployed to inference: each deploy makes a Baseten model with
 * one deployment that serves every given sampler checkpoint's adapter on
 * the base model, by checkpoint name. Status is read off the clock (the
 * cold start walks BUILDING, DEPLOYING, LOADING_MODEL, then ACTIVE), so a
 * virtual clock moves it and nothing needs a timer.
 */
export class ModelDeployments {
  private readonly records = new Map<string, ModelDeploymentRecord>();
  /** Adapters read from checkpoint files, once per deployment and name. */
  private readonly adapters = new Map<string, LoraAdapter>();
  /** Deployments a progress rule holds in LOADING_MODEL past their cold start, until released. */
  private readonly holds = new Map<string, Hold>();

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly checkpoints: Checkpoints,
    private readonly engines: EnginePool,
    private readonly logs: DeploymentLogs,
    private readonly settings: Pick<Settings, 'modelColdStartMs'>,
    private readonly progress: Progress,
  ) {
    for (const r of store.load<ModelDeploymentRecord>('model_deployment')) this.records.set(r.deployment_id, r);
  }

  /** Deploys sampler checkpoints of the caller's organisation; not idempotent (every call is a new model). */
  deploy(p: Principal, input: DeployInput): ModelDeploymentRecord {
    const found = this.check(p, input);
    const base = found[0]!.base_model;
    const record: ModelDeploymentRecord = {
      org_id: p.org_id,
      user_id: p.user_id,
      team_id: p.team_id,
      model_id: newModelId(),
      deployment_id: newResourceId(),
      name: input.model_name || `loops-${found[0]!.name}`,
      base_model: base,
      instance_type_id: input.instance_type_id || DEFAULT_INSTANCE_TYPE_ID,
      hf_secret_name: input.hf_secret_name ?? null,
      checkpoint_ids: found.map((c) => c.id),
      created_at: this.clock.now(),
      cold_start_ms: this.settings.modelColdStartMs,
      deactivated_at: null,
      deleted: false,
    };
    this.put(record);
    this.logs.add(
      record.deployment_id,
      'INFO',
      `Deploying ${found.map((c) => c.name).join(', ')} on ${base} (model ${record.model_id}, deployment ${record.deployment_id})`,
      'inference',
    );
    const hold = this.progress.holdFor(record.deployment_id, DEPLOY_OP, true);
    if (hold) {
      this.holds.set(record.deployment_id, hold);
      this.logs.add(record.deployment_id, 'INFO', `Held in LOADING_MODEL by progress rule ${hold.rule} (${hold.mode})`, 'inference');
    }
    return record;
  }

  /** The sampler checkpoints a deploy names, checked (a dry run stops here): same base model, distinct names, a valid model name. */
  check(p: Principal, input: DeployInput): CheckpointRecord[] {
    const ids = input.checkpoint_ids;
    if (!Array.isArray(ids) || ids.length === 0)
      throw invalid('checkpoint_ids must list at least one checkpoint id (the `id` of GET /v1/loops/checkpoints items).', { field: 'checkpoint_ids' });
    const found: CheckpointRecord[] = ids.map((id, i) => {
      const c = this.checkpoints.get(p, id);
      if (c.target !== 'sampler') {
        throw invalid(
          `checkpoint_ids[${i}] '${id}' is a trainer checkpoint (${c.name}, bt://loops:${c.run_id}/weights/${c.name}): only sampler checkpoints (save_weights_for_sampler) can be deployed to inference.`,
          { field: `checkpoint_ids[${i}]` },
        );
      }
      return c;
    });
    const base = found[0]!.base_model;
    const other = found.find((c) => c.base_model !== base);
    if (other)
      throw invalid(`checkpoint_ids mixes base models (${base} and ${other.base_model}): one deployment serves adapters of one base model.`, {
        field: 'checkpoint_ids',
      });
    const names = new Set<string>();
    for (const c of found) {
      if (names.has(c.name))
        throw invalid(
          `checkpoint_ids names two checkpoints called '${c.name}': each is addressed by its name as the \`model\` of a request, so the names must differ.`,
          { field: 'checkpoint_ids' },
        );
      names.add(c.name);
    }
    if (input.instance_type_id && !INSTANCE_TYPES.some((t) => t.id === input.instance_type_id)) {
      throw invalid(
        `instance_type_id '${input.instance_type_id}' is not an instance type here: use one of ${INSTANCE_TYPES.map((t) => t.id).join(', ')} (GraphQL listed_instances), or omit it for ${DEFAULT_INSTANCE_TYPE_ID}.`,
        { field: 'instance_type_id' },
      );
    }
    if (input.model_name !== undefined && input.model_name !== null && !/^[A-Za-z0-9._ -]{1,128}$/.test(input.model_name)) {
      throw invalid(`model_name '${input.model_name}' may only hold 1-128 letters, digits, spaces, '.', '_' and '-'.`, { field: 'model_name' });
    }
    return found;
  }

  /** The deployment's status now: the cold start's phase, ACTIVE after it, INACTIVE once deactivated. */
  status(r: ModelDeploymentRecord): SamplerStatus {
    if (r.deactivated_at !== null) return 'INACTIVE';
    const elapsed = this.clock.now() - r.created_at;
    if (elapsed >= r.cold_start_ms) return this.holds.get(r.deployment_id)?.isReleased === false ? 'LOADING_MODEL' : 'ACTIVE';
    return STARTING[Math.min(2, Math.floor((elapsed / r.cold_start_ms) * 3))]!;
  }

  /** A client read the deployment's status: the poll a progress rule in after_polls mode counts. */
  polled(r: ModelDeploymentRecord): void {
    const hold = this.holds.get(r.deployment_id);
    if (!hold || hold.isReleased) return;
    hold.pollsSeen++;
    if (hold.mode === 'after_polls' && hold.pollsSeen >= hold.polls) hold.release();
  }

  /** Lets a held deployment finish starting (the admin API); 409 when no rule holds it. */
  release(deploymentId: string): ModelDeploymentRecord {
    const r = this.records.get(deploymentId);
    if (!r || r.deleted) throw notFound(`No deployed model with deployment '${deploymentId}' on this server.`, { field: 'deployment_id' });
    const hold = this.holds.get(deploymentId);
    if (!hold || hold.isReleased)
      throw conflict(`Deployment ${deploymentId} is not held by a progress rule (its status is ${this.status(r)}).`, { field: 'deployment_id' });
    hold.release();
    return r;
  }

  /** Deployments a progress rule holds now. */
  held(): { model_id: string; deployment_id: string; status: SamplerStatus; rule: string; mode: string; polls_seen: number }[] {
    return [...this.holds.entries()]
      .filter(([, h]) => !h.isReleased)
      .flatMap(([id, h]) => {
        const r = this.records.get(id);
        return r && !r.deleted
          ? [{ model_id: r.model_id, deployment_id: id, status: this.status(r), rule: h.rule, mode: h.mode, polls_seen: h.pollsSeen }]
          : [];
      });
  }

  list(p: Principal): ModelDeploymentRecord[] {
    return [...this.records.values()].filter((r) => r.org_id === p.org_id && !r.deleted);
  }

  /** Every deployment not deleted, of every organisation, newest first: the dashboard's list. */
  everything(): ModelDeploymentRecord[] {
    return [...this.records.values()].filter((r) => !r.deleted).sort((a, b) => b.created_at - a.created_at);
  }

  /** A model of the caller's organisation, by model id, or undefined (the sampler models answer then). */
  findModel(p: Principal, modelId: string): ModelDeploymentRecord | undefined {
    return this.list(p).find((r) => r.model_id === modelId);
  }

  /** The deployment of a model of the caller's organisation, or undefined. */
  findOwned(p: Principal, modelId: string, deploymentId: string): ModelDeploymentRecord | undefined {
    const r = this.records.get(deploymentId);
    return r && r.model_id === modelId && r.org_id === p.org_id && !r.deleted ? r : undefined;
  }

  /** The deployment behind an inference URL, whoever owns it (the door checks the caller); without a deployment id, the model's. */
  find(modelId: string, deploymentId?: string): ModelDeploymentRecord | undefined {
    if (deploymentId !== undefined) {
      const r = this.records.get(deploymentId);
      return r && r.model_id === modelId && !r.deleted ? r : undefined;
    }
    return [...this.records.values()].find((r) => r.model_id === modelId && !r.deleted);
  }

  get(p: Principal, modelId: string, deploymentId: string): ModelDeploymentRecord {
    const r = this.findOwned(p, modelId, deploymentId);
    if (!r)
      throw notFound(`Deployment '${deploymentId}' of model '${modelId}' not found: POST /v1/loops/checkpoints/deploy answers both ids.`, {
        field: 'deployment_id',
      });
    return r;
  }

  deactivate(r: ModelDeploymentRecord): void {
    if (r.deactivated_at !== null) return;
    r.deactivated_at = this.clock.now();
    this.put(r);
    this.dropAdapters(r);
    this.logs.add(r.deployment_id, 'INFO', `Deployment ${r.deployment_id} deactivated`, 'inference');
  }

  delete(r: ModelDeploymentRecord): void {
    r.deactivated_at ??= this.clock.now();
    r.deleted = true;
    this.put(r);
    this.dropAdapters(r);
  }

  /** The deployed checkpoints, in deploy order. */
  checkpointsOf(r: ModelDeploymentRecord): CheckpointRecord[] {
    // The deployment's owner could read them when it deployed them; checkpoints are never deleted.
    const owner = { org_id: r.org_id, user_id: r.user_id, team_id: r.team_id, email: '' };
    return r.checkpoint_ids.map((id) => this.checkpoints.get(owner, id));
  }

  /** The adapter a checkpoint name serves, read from the checkpoint's PEFT files the first time. */
  adapter(r: ModelDeploymentRecord, name: string): LoraAdapter {
    const key = `${r.deployment_id}/${name}`;
    let a = this.adapters.get(key);
    if (!a) {
      const c = this.checkpointsOf(r).find((x) => x.name === name);
      if (!c) throw new LoopsError('not_found', `The model \`${name}\` does not exist on this deployment.`, { field: 'model' });
      a = readAdapter(this.checkpoints.readFiles(c), this.engines.get(r.base_model).sites, r.base_model);
      this.adapters.set(key, a);
    }
    return a;
  }

  /** A stopped deployment's adapters go: nothing serves from them again. */
  private dropAdapters(r: ModelDeploymentRecord): void {
    for (const key of [...this.adapters.keys()]) if (key.startsWith(`${r.deployment_id}/`)) this.adapters.delete(key);
  }

  private put(r: ModelDeploymentRecord): void {
    this.records.set(r.deployment_id, r);
    this.store.put('model_deployment', r.deployment_id, r);
  }
}
