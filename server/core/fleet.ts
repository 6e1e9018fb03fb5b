import type { Accounts } from './accounts.js';
import type { Checkpoints } from './checkpoints.js';
import type { Clock } from './clock.js';
import type { DeploymentLogs } from './deployment-logs.js';
import { invalid, notFound } from './errors.js';
import { DEAD_SAMPLER, FleetLifecycle, type FleetOptions } from './fleet-lifecycle.js';
import {
  checkSeqLength,
  type CreateRunInput,
  type CreateSamplerInput,
  type ListScope,
  MAX_LORA_RANK,
  newestFirst,
  owner,
  requireBaseModel,
  visibleTo,
} from './fleet-inputs.js';
import { newModelId, newResourceId } from './ids.js';
import type { DeploymentRecord, Ownership, Principal, RunRecord, SamplerRecord, SessionRecord } from './records.js';
import type { Store } from './store.js';

export type { FleetOptions } from './fleet-lifecycle.js';
export { MAX_LORA_RANK } from './fleet-inputs.js';
export type { CreateRunInput, CreateSamplerInput, ListScope } from './fleet-inputs.js';

/** Whether a sampler has stopped for good (or was deleted): it has no replicas any more. */
export function samplerStopped(s: SamplerRecord): boolean {
  return s.deleted || DEAD_SAMPLER.has(s.status);
}

/**
 * Sessions, runs, their deployments and samplers: the requests that create,
 * find, reuse, change and stop them. How they move on their own (cold start,
 * idle timeout, deactivation) is FleetLifecycle's.
 */
export class Fleet extends FleetLifecycle {
  constructor(
    store: Store,
    clock: Clock,
    logs: DeploymentLogs,
    private readonly checkpoints: Checkpoints,
    options: FleetOptions,
    /** Teams are a boundary for changes inside an organisation (accounts.requireMember). */
    private readonly accounts: Pick<Accounts, 'requireMember'>,
  ) {
    super(store, clock, logs, options);
  }

  // ---- sessions ----------------------------------------------------------

  createSession(p: Principal, teamId: string, trainingProjectId: string | null): SessionRecord {
    this.accounts.requireMember(p, teamId, 'create a session in this team');
    const s: SessionRecord = { id: newResourceId(), ...owner(p, teamId), created_at: this.clock.now(), training_project_id: trainingProjectId };
    this.sessions.set(s.id, s);
    this.store.put('session', s.id, s);
    return s;
  }

  getSession(p: Principal, id: string, field = 'session_id'): SessionRecord {
    const s = this.sessions.get(id);
    if (!s || s.org_id !== p.org_id) throw notFound(`Session '${id}' not found. Create one with POST /v1/loops/sessions.`, { field });
    return s;
  }

  // ---- runs --------------------------------------------------------------

  /** Creates a run; `withSampler` pairs a sampler at once (POST /runs), otherwise the run is trainer-only (POST /trainers). */
  createRun(p: Principal, input: CreateRunInput, withSampler: boolean, teamId: string): RunRecord {
    this.accounts.requireMember(p, teamId, 'create a run in this team');
    const session = this.getSession(p, input.session_id, 'session_id');
    this.accounts.requireMember(p, session.team_id, `create a run in session ${session.id}`);
    const model = requireBaseModel(input.base_model, 'base_model');
    const maxSeqLen = checkSeqLength(input.max_seq_len, model.name, 'max_seq_len');
    const loraRank = input.lora_rank ?? 64;
    if (loraRank > MAX_LORA_RANK) throw invalid(`lora_rank ${loraRank} is too large: loops-mock supports ranks 1..${MAX_LORA_RANK}.`, { field: 'lora_rank' });
    if (input.path) {
      const c = this.checkpoints.resolve(p, input.path, 'path', 'trainer');
      if (c.base_model !== model.name) throw invalid(`path '${input.path}' is a checkpoint of ${c.base_model}, not ${model.name}.`, { field: 'path' });
    }
    const reuse = this.findReusable(p, input, model.name, teamId);

    return this.store.transaction(() => {
      const now = this.clock.now();
      const run: RunRecord = {
        id: newResourceId(),
        session_id: session.id,
        ...owner(p, teamId),
        deployment_id: '',
        sampler_id: null,
        name: input.name ?? model.name,
        base_model: model.name,
        created_at: now,
        status: 'ACTIVE',
        inactive_reason: null,
        max_seq_len: maxSeqLen,
        lora_rank: loraRank,
        seed: input.seed ?? null,
        scale_down_delay_seconds: input.scale_down_delay_seconds ?? 3600,
        availability_model: input.availability_model ?? 'dedicated',
        replicas: input.replicas ?? 1,
        path: input.path ?? null,
      };
      let deployment: DeploymentRecord;
      if (reuse) {
        deployment = this.deployments.get(reuse.deployment_id)!;
        this.markRunInactive(reuse, `replaced by run ${run.id}`);
        this.logs.add(deployment.id, 'INFO', `Run ${run.id} reuses the trainer of run ${reuse.id}`, 'trainer-0');
      } else {
        deployment = {
          id: newResourceId(),
          ...owner(p, teamId),
          base_model: model.name,
          created_at: now,
          status: 'CREATED',
          active_run_id: null,
          latest_run_id: null,
          sampler_id: null,
          availability_model: run.availability_model,
          node_count: run.replicas,
        };
        this.deployments.set(deployment.id, deployment);
        this.logs.add(deployment.id, 'INFO', `Trainer deployment created for ${model.name} (rank ${loraRank}, max_seq_len ${maxSeqLen})`, 'trainer-0');
        this.walkDeployment(deployment);
      }
      run.deployment_id = deployment.id;
      deployment.active_run_id = run.id;
      deployment.latest_run_id = run.id;
      // Known before its sampler exists: the sampler's first lines (created, ACTIVE) go to the run's deployment logs.
      this.runs.set(run.id, run);
      const liveSampler = deployment.sampler_id ? this.samplers.get(deployment.sampler_id) : undefined;
      if (liveSampler && !DEAD_SAMPLER.has(liveSampler.status) && !liveSampler.deleted) {
        liveSampler.run_id = run.id;
        run.sampler_id = liveSampler.id;
        this.putSampler(liveSampler);
      } else if (withSampler) {
        run.sampler_id = this.newSampler(p, teamId, session.id, model.name, run.id, maxSeqLen, null, deployment.id).id;
        deployment.sampler_id = run.sampler_id;
      }
      this.store.put('run', run.id, run);
      this.putDeployment(deployment);
      this.logs.add(deployment.id, 'INFO', `Run ${run.id} '${run.name}' started in session ${session.id}`, 'trainer-0');
      this.lastActivity.set(run.id, now + this.options.coldStartMs);
      this.armIdleTimer(run);
      return run;
    });
  }

  getRun(p: Principal, id: string, field = 'run_id'): RunRecord {
    const r = this.runs.get(id);
    if (!r || r.org_id !== p.org_id) throw notFound(`Run '${id}' not found. GET /v1/loops/runs lists your runs.`, { field });
    return r;
  }

  /** Every run and sampler on this server, newest first, whoever owns them: the dashboard's server-wide view. */
  everything(): { runs: RunRecord[]; samplers: SamplerRecord[] } {
    return { runs: newestFirst([...this.runs.values()]), samplers: newestFirst([...this.samplers.values()]) };
  }

  /** A run by id with no access check, for the data planes that already resolved the caller. */
  findRun(id: string): RunRecord | undefined {
    return this.runs.get(id);
  }

  listRuns(p: Principal, filter: ListScope & { run_id?: string; base_model?: string }): RunRecord[] {
    return newestFirst(
      visibleTo([...this.runs.values()], p, filter).filter(
        (r) => (filter.run_id === undefined || r.id === filter.run_id) && (filter.base_model === undefined || r.base_model === filter.base_model),
      ),
    );
  }

  deactivateRun(p: Principal, id: string): RunRecord {
    const run = this.getRun(p, id);
    this.accounts.requireMember(p, run.team_id, `deactivate run ${run.id}`);
    this.store.transaction(() => this.stopRun(run, 'deactivated by request', 'STOPPED'));
    return run;
  }

  /** The admin API changed a sampler's replica count. */
  setSamplerReplicas(s: SamplerRecord, count: number): void {
    s.replicas = count;
    this.putSampler(s);
    this.logSampler(s, 'INFO', `Sampler ${s.id} now has ${count} replica(s)`);
  }

  /** init_trainer_server changes the adapter's rank: later loads are checked against it. */
  setLoraRank(run: RunRecord, rank: number): void {
    run.lora_rank = rank;
    this.store.put('run', run.id, run);
  }

  // ---- deployments -------------------------------------------------------

  /** Deployments not STOPPED, as Baseten lists them (what is provisioned now); getDeployment still finds a stopped one. */
  listDeployments(p: Principal, filter: ListScope): DeploymentRecord[] {
    return newestFirst(
      visibleTo(
        [...this.deployments.values()].filter((d) => d.status !== 'STOPPED'),
        p,
        filter,
      ),
    );
  }

  getDeployment(p: Principal, id: string): DeploymentRecord {
    const d = this.deployments.get(id);
    if (!d || d.org_id !== p.org_id) throw notFound(`Deployment '${id}' not found. GET /v1/loops/deployments lists yours.`, { field: 'deployment_id' });
    return d;
  }

  deactivateDeployment(p: Principal, id: string): DeploymentRecord {
    const d = this.getDeployment(p, id);
    this.accounts.requireMember(p, d.team_id, `deactivate deployment ${d.id}`);
    this.store.transaction(() => {
      const run = d.active_run_id ? this.runs.get(d.active_run_id) : undefined;
      if (run) this.stopRun(run, 'deployment deactivated by request', 'STOPPED');
      else this.stopDeployment(d, 'STOPPED', 'deployment deactivated by request');
    });
    return d;
  }

  /** The runs that ever executed on a deployment. */
  runsOf(deploymentId: string): RunRecord[] {
    return [...this.runs.values()].filter((r) => r.deployment_id === deploymentId);
  }

  // ---- samplers ----------------------------------------------------------

  createSampler(p: Principal, input: CreateSamplerInput, teamId: string): SamplerRecord {
    this.accounts.requireMember(p, teamId, 'create a sampler in this team');
    const session = this.getSession(p, input.session_id, 'session_id');
    this.accounts.requireMember(p, session.team_id, `create a sampler in session ${session.id}`);
    if (input.run_id) {
      const run = this.getRun(p, input.run_id, 'run_id');
      this.accounts.requireMember(p, run.team_id, `pair a sampler with run ${run.id}`);
      if (input.base_model && input.base_model !== run.base_model) {
        throw invalid(
          `base_model '${input.base_model}' differs from run ${run.id}'s base model '${run.base_model}': omit base_model when pairing with run_id.`,
          { field: 'base_model' },
        );
      }
      if (input.model_path)
        throw invalid('model_path is for standalone samplers: a paired sampler serves the weights its run publishes. Omit model_path or run_id.', {
          field: 'model_path',
        });
      if (run.status !== 'ACTIVE')
        throw invalid(`Run ${run.id} is INACTIVE (${run.inactive_reason ?? 'stopped'}); an inactive run cannot get a sampler. Create a new run.`, {
          field: 'run_id',
        });
      const maxSeqLength = checkSeqLength(input.max_seq_length, run.base_model);
      return this.pairSampler(run, maxSeqLength);
    }
    if (!input.base_model) throw invalid('Give base_model for a standalone sampler, or run_id to pair a sampler with a run.', { field: 'base_model' });
    const model = requireBaseModel(input.base_model, 'base_model');
    const maxSeqLength = checkSeqLength(input.max_seq_length, model.name);
    if (input.model_path) {
      const c = this.checkpoints.resolve(p, input.model_path, 'model_path', 'sampler');
      if (c.base_model !== model.name)
        throw invalid(`model_path '${input.model_path}' is a checkpoint of ${c.base_model}, not ${model.name}.`, { field: 'model_path' });
    }
    if (input.reuse_from_session_id) {
      const prior = this.getSession(p, input.reuse_from_session_id, 'reuse_from_session_id');
      const live = [...this.samplers.values()]
        .filter(
          (s) =>
            s.session_id === prior.id &&
            s.run_id === null &&
            s.base_model === model.name &&
            s.model_path === (input.model_path ?? null) &&
            !s.deleted &&
            !DEAD_SAMPLER.has(s.status),
        )
        .sort((a, b) => b.created_at - a.created_at)[0];
      if (live) return live;
    }
    return this.store.transaction(() => this.newSampler(p, teamId, session.id, model.name, null, maxSeqLength, input.model_path ?? null, null));
  }

  /**
   * The run's live paired sampler, creating one if it has none (the trainer's
   * publish and a client's first sampling request create it lazily).
   */
  pairSampler(run: RunRecord, maxSeqLength = run.max_seq_len): SamplerRecord {
    const current = run.sampler_id ? this.samplers.get(run.sampler_id) : undefined;
    if (current && !current.deleted && !DEAD_SAMPLER.has(current.status)) return current;
    return this.store.transaction(() => {
      const s = this.newSampler(run, run.team_id, run.session_id, run.base_model, run.id, maxSeqLength, null, run.deployment_id);
      run.sampler_id = s.id;
      this.store.put('run', run.id, run);
      const d = this.deployments.get(run.deployment_id);
      if (d) {
        d.sampler_id = s.id;
        this.putDeployment(d);
      }
      return s;
    });
  }

  listSamplers(p: Principal, filter: ListScope): SamplerRecord[] {
    return newestFirst(visibleTo([...this.samplers.values()], p, filter));
  }

  getSampler(p: Principal, id: string): SamplerRecord {
    const s = this.samplers.get(id);
    if (!s || s.org_id !== p.org_id) throw notFound(`Sampler '${id}' not found. GET /v1/loops/samplers lists yours.`, { field: 'sampler_id' });
    return s;
  }

  findSampler(id: string): SamplerRecord | undefined {
    return this.samplers.get(id);
  }

  /** The sampler behind a model-deployment URL, whoever owns it (the data plane checks the caller); without a deployment id, the model's newest. */
  findModelDeployment(modelId: string, deploymentId?: string): SamplerRecord | undefined {
    let found: SamplerRecord | undefined;
    for (const s of this.samplers.values()) {
      if (s.model_id === modelId && !s.deleted && (deploymentId === undefined || s.model_deployment_id === deploymentId)) found = s;
    }
    return found;
  }

  /** A sampler through the generic model-deployment API (`/v1/models/{model_id}/deployments/{deployment_id}`). */
  getModelDeployment(p: Principal, modelId: string, deploymentId: string): SamplerRecord {
    for (const s of this.samplers.values()) {
      if (s.model_id === modelId && s.model_deployment_id === deploymentId && s.org_id === p.org_id && !s.deleted) return s;
    }
    throw notFound(
      `Deployment '${deploymentId}' of model '${modelId}' not found. A sampler's model_id and deployment_id come from GET /v1/loops/samplers/{sampler_id}.`,
      { field: 'deployment_id' },
    );
  }

  renameModelDeployment(p: Principal, modelId: string, deploymentId: string, name: string | null | undefined): SamplerRecord {
    const s = this.getModelDeployment(p, modelId, deploymentId);
    this.accounts.requireMember(p, s.team_id, `rename deployment ${deploymentId} of model ${modelId}`);
    if (name === null || name === undefined) return s;
    if (!/^[A-Za-z0-9._-]+$/.test(name)) throw invalid(`name '${name}' may only contain letters, digits, '-', '_' and '.'.`, { field: 'name' });
    s.name = name;
    this.putSampler(s);
    return s;
  }

  deactivateModelDeployment(p: Principal, modelId: string, deploymentId: string): SamplerRecord {
    const s = this.getModelDeployment(p, modelId, deploymentId);
    this.accounts.requireMember(p, s.team_id, `deactivate deployment ${deploymentId} of model ${modelId}`);
    this.store.transaction(() => this.stopSampler(s, 'deactivated by request'));
    return s;
  }

  deleteModelDeployment(p: Principal, modelId: string, deploymentId: string): SamplerRecord {
    const s = this.getModelDeployment(p, modelId, deploymentId);
    this.accounts.requireMember(p, s.team_id, `delete deployment ${deploymentId} of model ${modelId}`);
    this.store.transaction(() => {
      this.stopSampler(s, 'deleted by request');
      s.deleted = true;
      this.putSampler(s);
    });
    return s;
  }

  private findReusable(p: Principal, input: CreateRunInput, baseModel: string, teamId: string): RunRecord | undefined {
    let prior: RunRecord | undefined;
    if (input.reuse_from_run_id) {
      prior = this.getRun(p, input.reuse_from_run_id, 'reuse_from_run_id');
      if (prior.base_model !== baseModel)
        throw invalid(`reuse_from_run_id: run ${prior.id} uses ${prior.base_model}, not ${baseModel}; reuse needs the same base model.`, {
          field: 'reuse_from_run_id',
        });
      if (prior.team_id !== teamId)
        throw invalid(`reuse_from_run_id: run ${prior.id} belongs to another team; reuse needs the same team.`, { field: 'reuse_from_run_id' });
    } else {
      // A session holds one trainer per base model (concepts page): without a reuse field, a second run of the same
      // model in the same session takes over that trainer, as reuse_from_session_id of its own session would.
      const session = input.reuse_from_session_id
        ? this.getSession(p, input.reuse_from_session_id, 'reuse_from_session_id')
        : this.getSession(p, input.session_id, 'session_id');
      prior = [...this.runs.values()]
        .filter((r) => r.session_id === session.id && r.base_model === baseModel && r.team_id === teamId && r.status === 'ACTIVE')
        .sort((a, b) => b.created_at - a.created_at)[0];
    }
    // Best effort, as upstream: a run that is no longer live is replaced by a fresh one.
    if (prior?.status !== 'ACTIVE') return undefined;
    const d = this.deployments.get(prior.deployment_id);
    return d && ['CREATED', 'DEPLOYING', 'RUNNING'].includes(d.status) ? prior : undefined;
  }

  private newSampler(
    o: Ownership,
    teamId: string,
    sessionId: string,
    baseModel: string,
    runId: string | null,
    maxSeqLength: number,
    modelPath: string | null,
    deploymentId: string | null,
  ): SamplerRecord {
    const id = newResourceId();
    const s: SamplerRecord = {
      id,
      session_id: sessionId,
      org_id: o.org_id,
      user_id: o.user_id,
      team_id: teamId,
      model_id: newModelId(),
      model_deployment_id: newResourceId(),
      name: `loops-sampler-${id}`,
      base_model: baseModel,
      run_id: runId,
      created_at: this.clock.now(),
      status: 'BUILDING',
      max_seq_length: maxSeqLength,
      model_path: modelPath,
      replicas: this.options.samplerReplicas,
      deleted: false,
    };
    this.samplers.set(s.id, s);
    this.putSampler(s);
    this.logSampler(s, 'INFO', `Sampler ${s.id} created for ${baseModel}${runId ? ` (paired with run ${runId})` : ''}${deploymentId ? '' : ' (standalone)'}`);
    this.walkSampler(s);
    return s;
  }

  /** The longest input a run or sampler takes now: its own length, within this server's limit (which may have been lowered since it was made). */
  lengthLimit(own: number, ownName: string): { maxLength: number; lengthName: string } {
    const limit = this.options.maxSeqLenLimit;
    return own <= limit ? { maxLength: own, lengthName: ownName } : { maxLength: limit, lengthName: "server's --max-seq-len-limit (raise it to allow longer)" };
  }
}
