import { findBaseModel, supportedModelNames } from '../../models/registry.js';
import type { Accounts } from './accounts.js';
import type { Checkpoints } from './checkpoints.js';
import type { Clock, Timer } from './clock.js';
import type { DeploymentLogs } from './deployment-logs.js';
import { invalid, notFound } from './errors.js';
import { StorageError } from './storage-errors.js';
import { newModelId, newResourceId } from './ids.js';
import type {
  DeploymentRecord, DeploymentStatus, Ownership, Principal, RunRecord, SamplerRecord, SamplerStatus, SessionRecord,
} from './records.js';
import type { Settings } from './settings.js';
import type { Store } from './store.js';

export type FleetOptions = Pick<Settings, 'coldStartMs' | 'deactivationMs' | 'samplerReplicas' | 'runIdleTimeoutMs' | 'samplerIdleMs' | 'maxSeqLenLimit'>;

/** Largest LoRA rank the engine builds adapters for. */
export const MAX_LORA_RANK = 128;

export interface CreateRunInput {
  session_id: string;
  base_model: string;
  name?: string | null;
  max_seq_len?: number | null;
  lora_rank?: number;
  seed?: number | null;
  scale_down_delay_seconds?: number;
  availability_model?: 'dedicated' | 'spot';
  replicas?: number;
  path?: string | null;
  reuse_from_run_id?: string | null;
  reuse_from_session_id?: string | null;
}

export interface CreateSamplerInput {
  session_id: string;
  base_model?: string | null;
  run_id?: string | null;
  max_seq_length?: number | null;
  model_path?: string | null;
  reuse_from_session_id?: string | null;
}

export interface ListScope {
  /** `org` lists the organisation's resources; otherwise the caller's own. */
  scope?: string;
  /** Team-scoped routes list only that team's resources. */
  teamId?: string;
}

/** Samplers in these states serve no one and never come back. */
const DEAD_SAMPLER: ReadonlySet<SamplerStatus> = new Set(['DEACTIVATING', 'INACTIVE', 'FAILED', 'BUILD_FAILED', 'DEPLOY_FAILED', 'BUILD_STOPPED']);

/** Whether a sampler has stopped for good (or was deleted): it has no replicas any more. */
export function samplerStopped(s: SamplerRecord): boolean {
  return s.deleted || DEAD_SAMPLER.has(s.status);
}

/**
 * Sessions, runs, their deployments and samplers, and how they move through
 * their lifecycles: cold start, idle timeout, deactivation, reuse.
 */
export class Fleet {
  private readonly sessions = new Map<string, SessionRecord>();
  private readonly runs = new Map<string, RunRecord>();
  private readonly deployments = new Map<string, DeploymentRecord>();
  private readonly samplers = new Map<string, SamplerRecord>();
  /** Last trainer activity per run, for the idle timeout. */
  private readonly lastActivity = new Map<string, number>();
  /** Last request per sampler, for the sampler idle timeout (samplerIdleMs). */
  private readonly samplerActivity = new Map<string, number>();
  private readonly timers = new Set<Timer>();
  /** Called whenever a run stops, with the reason (the trainer fails its pending operations). */
  private readonly runStoppedListeners: ((run: RunRecord, reason: string) => void)[] = [];
  /** Called when a sampler stops serving for good (DEACTIVATING or INACTIVE): its replicas' weights can go. */
  private readonly samplerStoppedListeners: ((sampler: SamplerRecord) => void)[] = [];

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly logs: DeploymentLogs,
    private readonly checkpoints: Checkpoints,
    private readonly options: FleetOptions,
    /** Teams are a boundary for changes inside an organisation (accounts.requireMember). */
    private readonly accounts: Pick<Accounts, 'requireMember'>,
  ) {
    for (const s of store.load<SessionRecord>('session')) this.sessions.set(s.id, s);
    for (const r of store.load<RunRecord>('run')) this.runs.set(r.id, r);
    for (const d of store.load<DeploymentRecord>('deployment')) this.deployments.set(d.id, d);
    for (const s of store.load<SamplerRecord>('sampler')) this.samplers.set(s.id, s);
    this.stopEverythingLeftRunning();
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
    const model = this.requireModel(input.base_model, 'base_model');
    const maxSeqLen = this.checkSeqLength(input.max_seq_len, model.name, 'max_seq_len');
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
          id: newResourceId(), ...owner(p, teamId), base_model: model.name, created_at: now, status: 'CREATED',
          active_run_id: null, latest_run_id: null, sampler_id: null, availability_model: run.availability_model, node_count: run.replicas,
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
    return newestFirst(this.visible([...this.runs.values()], p, filter)
      .filter((r) => (filter.run_id === undefined || r.id === filter.run_id) && (filter.base_model === undefined || r.base_model === filter.base_model)));
  }

  deactivateRun(p: Principal, id: string): RunRecord {
    const run = this.getRun(p, id);
    this.accounts.requireMember(p, run.team_id, `deactivate run ${run.id}`);
    this.store.transaction(() => this.stopRun(run, 'deactivated by request', 'STOPPED'));
    return run;
  }

  /** Any trainer request keeps its run warm. */
  touchRun(runId: string): void {
    if (this.runs.get(runId)?.status === 'ACTIVE') this.lastActivity.set(runId, Math.max(this.clock.now(), this.lastActivity.get(runId) ?? 0));
  }

  /** Any sampler request keeps its sampler warm. */
  touchSampler(samplerId: string): void {
    if (this.samplers.has(samplerId)) this.samplerActivity.set(samplerId, this.clock.now());
  }

  /** The admin API changed a sampler's replica count. */
  setSamplerReplicas(s: SamplerRecord, count: number): void {
    s.replicas = count;
    this.putSampler(s);
    this.logSampler(s, 'INFO', `Sampler ${s.id} now has ${count} replica(s)`);
  }

  /** Deactivates a run or sampler as if from outside (a fault rule's `deactivate`), with the reason logged. */
  deactivateNow(target: { run?: RunRecord; sampler?: SamplerRecord }, reason: string): void {
    this.store.transaction(() => {
      if (target.run && target.run.status === 'ACTIVE') this.stopRun(target.run, reason, 'STOPPED');
      if (target.sampler) this.stopSampler(target.sampler, reason);
    });
  }

  onRunStopped(listener: (run: RunRecord, reason: string) => void): void {
    this.runStoppedListeners.push(listener);
  }

  onSamplerStopped(listener: (sampler: SamplerRecord) => void): void {
    this.samplerStoppedListeners.push(listener);
  }

  /** init_trainer_server changes the adapter's rank: later loads are checked against it. */
  setLoraRank(run: RunRecord, rank: number): void {
    run.lora_rank = rank;
    this.store.put('run', run.id, run);
  }

  /** Milliseconds until a run's trainer has finished its cold start (0 when ready). */
  coldStartLeft(run: RunRecord): number {
    return Math.max(0, run.created_at + this.options.coldStartMs - this.clock.now());
  }

  // ---- deployments -------------------------------------------------------

  /** Deployments not STOPPED, as Baseten lists them (what is provisioned now); getDeployment still finds a stopped one. */
  listDeployments(p: Principal, filter: ListScope): DeploymentRecord[] {
    return newestFirst(this.visible([...this.deployments.values()].filter((d) => d.status !== 'STOPPED'), p, filter));
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
        throw invalid(`base_model '${input.base_model}' differs from run ${run.id}'s base model '${run.base_model}': omit base_model when pairing with run_id.`, { field: 'base_model' });
      }
      if (input.model_path) throw invalid('model_path is for standalone samplers: a paired sampler serves the weights its run publishes. Omit model_path or run_id.', { field: 'model_path' });
      if (run.status !== 'ACTIVE') throw invalid(`Run ${run.id} is INACTIVE (${run.inactive_reason ?? 'stopped'}); an inactive run cannot get a sampler. Create a new run.`, { field: 'run_id' });
      const maxSeqLength = this.checkSeqLength(input.max_seq_length, run.base_model);
      return this.pairSampler(run, maxSeqLength);
    }
    if (!input.base_model) throw invalid('Give base_model for a standalone sampler, or run_id to pair a sampler with a run.', { field: 'base_model' });
    const model = this.requireModel(input.base_model, 'base_model');
    const maxSeqLength = this.checkSeqLength(input.max_seq_length, model.name);
    if (input.model_path) {
      const c = this.checkpoints.resolve(p, input.model_path, 'model_path', 'sampler');
      if (c.base_model !== model.name) throw invalid(`model_path '${input.model_path}' is a checkpoint of ${c.base_model}, not ${model.name}.`, { field: 'model_path' });
    }
    if (input.reuse_from_session_id) {
      const prior = this.getSession(p, input.reuse_from_session_id, 'reuse_from_session_id');
      const live = [...this.samplers.values()]
        .filter((s) => s.session_id === prior.id && s.run_id === null && s.base_model === model.name && s.model_path === (input.model_path ?? null) && !s.deleted && !DEAD_SAMPLER.has(s.status))
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
      if (d) { d.sampler_id = s.id; this.putDeployment(d); }
      return s;
    });
  }

  listSamplers(p: Principal, filter: ListScope): SamplerRecord[] {
    return newestFirst(this.visible([...this.samplers.values()], p, filter));
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

  /** Where a sampler's traffic and logs are counted: its run's deployment, or its own id when standalone. */
  deploymentOfSampler(id: string): string {
    const s = this.samplers.get(id);
    const run = s?.run_id ? this.runs.get(s.run_id) : undefined;
    return run?.deployment_id ?? id;
  }

  /** A request to a SCALED_TO_ZERO sampler wakes it: WAKING_UP, then ACTIVE after the cold start. */
  wakeSampler(s: SamplerRecord): void {
    if (s.status !== 'SCALED_TO_ZERO') return;
    this.moveSampler(s, 'WAKING_UP', 'a request arrived');
    const ready = () => {
      if (s.status === 'WAKING_UP') this.moveSampler(s, 'ACTIVE');
    };
    if (this.options.coldStartMs > 0) this.after(this.options.coldStartMs, ready);
    else ready();
  }

  /** A sampler through the generic model-deployment API (`/v1/models/{model_id}/deployments/{deployment_id}`). */
  getModelDeployment(p: Principal, modelId: string, deploymentId: string): SamplerRecord {
    for (const s of this.samplers.values()) {
      if (s.model_id === modelId && s.model_deployment_id === deploymentId && s.org_id === p.org_id && !s.deleted) return s;
    }
    throw notFound(`Deployment '${deploymentId}' of model '${modelId}' not found. A sampler's model_id and deployment_id come from GET /v1/loops/samplers/{sampler_id}.`, { field: 'deployment_id' });
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

  // ---- lifecycle ---------------------------------------------------------

  /** Cancels every pending transition (server shutdown). */
  close(): void {
    for (const t of this.timers) t.cancel();
    this.timers.clear();
  }

  /** After a restart nothing is running: every live run, deployment and sampler is stopped, with the reason logged. */
  private stopEverythingLeftRunning(): void {
    const stop = () => {
      for (const run of this.runs.values()) if (run.status === 'ACTIVE') this.markRunInactive(run, 'server restarted');
      for (const d of this.deployments.values()) if (d.status !== 'STOPPED' && d.status !== 'FAILED') this.stopDeployment(d, 'STOPPED', 'server restarted');
      for (const s of this.samplers.values()) {
        if (s.status !== 'INACTIVE') this.moveSampler(s, 'INACTIVE', 'server restarted');
      }
    };
    try {
      this.store.transaction(stop);
    } catch (err) {
      // A start on a full disk still serves reads: what the refused transaction left undone is done in memory
      // (refused writes counted, not thrown), and the next start writes the stops again.
      if (!(err instanceof StorageError)) throw err;
      this.store.background.failed(err);
      this.store.bestEffort(stop);
    }
  }

  private findReusable(p: Principal, input: CreateRunInput, baseModel: string, teamId: string): RunRecord | undefined {
    let prior: RunRecord | undefined;
    if (input.reuse_from_run_id) {
      prior = this.getRun(p, input.reuse_from_run_id, 'reuse_from_run_id');
      if (prior.base_model !== baseModel) throw invalid(`reuse_from_run_id: run ${prior.id} uses ${prior.base_model}, not ${baseModel}; reuse needs the same base model.`, { field: 'reuse_from_run_id' });
      if (prior.team_id !== teamId) throw invalid(`reuse_from_run_id: run ${prior.id} belongs to another team; reuse needs the same team.`, { field: 'reuse_from_run_id' });
    } else {
      // A session holds one trainer per base model (concepts page): without a reuse field, a second run of the same
      // model in the same session takes over that trainer, as reuse_from_session_id of its own session would.
      const session = input.reuse_from_session_id ? this.getSession(p, input.reuse_from_session_id, 'reuse_from_session_id') : this.getSession(p, input.session_id, 'session_id');
      prior = [...this.runs.values()]
        .filter((r) => r.session_id === session.id && r.base_model === baseModel && r.team_id === teamId && r.status === 'ACTIVE')
        .sort((a, b) => b.created_at - a.created_at)[0];
    }
    // Best effort, as upstream: a run that is no longer live is replaced by a fresh one.
    if (!prior || prior.status !== 'ACTIVE') return undefined;
    const d = this.deployments.get(prior.deployment_id);
    return d && ['CREATED', 'DEPLOYING', 'RUNNING'].includes(d.status) ? prior : undefined;
  }

  private newSampler(o: Ownership, teamId: string, sessionId: string, baseModel: string, runId: string | null, maxSeqLength: number, modelPath: string | null, deploymentId: string | null): SamplerRecord {
    const id = newResourceId();
    const s: SamplerRecord = {
      id, session_id: sessionId, org_id: o.org_id, user_id: o.user_id, team_id: teamId,
      model_id: newModelId(), model_deployment_id: newResourceId(), name: `loops-sampler-${id}`,
      base_model: baseModel, run_id: runId, created_at: this.clock.now(), status: 'BUILDING',
      max_seq_length: maxSeqLength, model_path: modelPath, replicas: this.options.samplerReplicas, deleted: false,
    };
    this.samplers.set(s.id, s);
    this.putSampler(s);
    this.logSampler(s, 'INFO', `Sampler ${s.id} created for ${baseModel}${runId ? ` (paired with run ${runId})` : ''}${deploymentId ? '' : ' (standalone)'}`);
    this.walkSampler(s);
    return s;
  }

  /** BUILDING → DEPLOYING → LOADING_MODEL → ACTIVE over the cold start; each step only if nothing stopped it meanwhile. */
  private walkSampler(s: SamplerRecord): void {
    const steps: [SamplerStatus, SamplerStatus][] = [['BUILDING', 'DEPLOYING'], ['DEPLOYING', 'LOADING_MODEL'], ['LOADING_MODEL', 'ACTIVE']];
    this.walk(steps, (from, to) => {
      if (s.status === from) this.moveSampler(s, to);
    });
  }

  /** With samplerIdleMs set, an ACTIVE sampler with no request for that long is SCALED_TO_ZERO; the next request wakes it. */
  private armSamplerIdleTimer(s: SamplerRecord): void {
    const limit = this.options.samplerIdleMs;
    if (limit === null) return;
    this.samplerActivity.set(s.id, Math.max(this.clock.now(), this.samplerActivity.get(s.id) ?? 0));
    const check = () => {
      const current = this.options.samplerIdleMs;
      if (s.status !== 'ACTIVE' || current === null) return;
      const idleFor = this.clock.now() - (this.samplerActivity.get(s.id) ?? s.created_at);
      if (idleFor < current) return this.after(current - idleFor, check);
      this.moveSampler(s, 'SCALED_TO_ZERO', `no request for ${current} ms`);
    };
    this.after(limit, check);
  }

  /** CREATED → DEPLOYING → RUNNING over the cold start. */
  private walkDeployment(d: DeploymentRecord): void {
    const steps: [DeploymentStatus, DeploymentStatus][] = [['CREATED', 'DEPLOYING'], ['DEPLOYING', 'RUNNING']];
    this.walk(steps, (from, to) => {
      if (d.status !== from) return;
      d.status = to;
      this.putDeployment(d);
      this.logs.add(d.id, 'INFO', `Trainer deployment ${d.id} is ${to}`, 'trainer-0');
    });
  }

  private walk<S>(steps: [S, S][], apply: (from: S, to: S) => void): void {
    const total = this.options.coldStartMs;
    if (total <= 0) {
      for (const [from, to] of steps) apply(from, to);
      return;
    }
    steps.forEach(([from, to], i) => this.after((total * (i + 1)) / steps.length, () => apply(from, to)));
  }

  private armIdleTimer(run: RunRecord): void {
    const check = () => {
      if (run.status !== 'ACTIVE') return;
      const idleFor = this.clock.now() - (this.lastActivity.get(run.id) ?? run.created_at);
      const limit = this.idleLimitMs(run);
      const why = this.options.runIdleTimeoutMs === null ? `idle for ${run.scale_down_delay_seconds}s (scale_down_delay_seconds)` : `idle for ${limit} ms (run_idle_timeout_ms setting)`;
      if (idleFor >= limit) this.store.transaction(() => this.stopRun(run, why, 'SCALED_TO_ZERO'));
      else this.after(limit - idleFor, check);
    };
    this.after(this.idleLimitMs(run) + this.options.coldStartMs, check);
  }

  private idleLimitMs(run: RunRecord): number {
    return this.options.runIdleTimeoutMs ?? run.scale_down_delay_seconds * 1000;
  }

  /** Stops a run, its deployment and its paired sampler. */
  private stopRun(run: RunRecord, reason: string, deploymentStatus: DeploymentStatus): void {
    const d = this.deployments.get(run.deployment_id);
    // A run replaced through reuse no longer owns its deployment or sampler: stopping it stops nothing shared.
    const ownsDeployment = d?.active_run_id === run.id;
    if (run.status === 'ACTIVE') this.markRunInactive(run, reason);
    if (d && ownsDeployment) this.stopDeployment(d, deploymentStatus, reason);
    const s = run.sampler_id ? this.samplers.get(run.sampler_id) : undefined;
    if (s && s.run_id === run.id && !DEAD_SAMPLER.has(s.status)) {
      if (deploymentStatus === 'SCALED_TO_ZERO') this.moveSampler(s, 'SCALED_TO_ZERO', reason);
      else this.stopSampler(s, reason);
    }
  }

  private markRunInactive(run: RunRecord, reason: string): void {
    run.status = 'INACTIVE';
    run.inactive_reason = reason;
    this.lastActivity.delete(run.id);
    this.store.put('run', run.id, run);
    this.logs.add(run.deployment_id, 'INFO', `Run ${run.id} INACTIVE: ${reason}`, 'trainer-0');
    for (const listener of this.runStoppedListeners) listener(run, reason);
    const d = this.deployments.get(run.deployment_id);
    if (d && d.active_run_id === run.id) {
      d.active_run_id = null;
      this.putDeployment(d);
    }
  }

  private stopDeployment(d: DeploymentRecord, status: DeploymentStatus, reason: string): void {
    d.status = status;
    d.active_run_id = null;
    this.putDeployment(d);
    this.logs.add(d.id, 'INFO', `Trainer deployment ${d.id} ${status}: ${reason}`, 'trainer-0');
  }

  /** DEACTIVATING, then INACTIVE after the deactivation delay. */
  private stopSampler(s: SamplerRecord, reason: string): void {
    if (s.status === 'INACTIVE' || s.status === 'DEACTIVATING') return;
    const finish = () => {
      if (s.status === 'DEACTIVATING') this.moveSampler(s, 'INACTIVE', reason);
    };
    this.moveSampler(s, 'DEACTIVATING', reason);
    if (this.options.deactivationMs > 0) this.after(this.options.deactivationMs, finish);
    else finish();
  }

  private after(ms: number, fn: () => void): void {
    const timer = this.clock.setTimer(ms, () => {
      this.timers.delete(timer);
      try {
        fn();
      } catch (err) {
        // A timed change (cold start, idle scale-down) nobody waits on: a write the disk refused is counted and told, never a crash.
        if (!(err instanceof StorageError)) throw err;
        this.store.background.failed(err);
      }
    });
    this.timers.add(timer);
  }

  /** Every status change of a sampler: stored, logged (with why, when there is a why), and an ACTIVE one's idle timer armed. */
  private moveSampler(s: SamplerRecord, to: SamplerStatus, why?: string): void {
    const wasDead = DEAD_SAMPLER.has(s.status);
    s.status = to;
    this.putSampler(s);
    this.logSampler(s, 'INFO', why === undefined ? `Sampler ${s.id} is ${to}` : `Sampler ${s.id} ${to}: ${why}`);
    if (to === 'ACTIVE') this.armSamplerIdleTimer(s);
    if (DEAD_SAMPLER.has(to) && !wasDead) for (const listener of this.samplerStoppedListeners) listener(s);
  }

  private logSampler(s: SamplerRecord, level: 'INFO' | 'WARNING', message: string): void {
    // Paired samplers log into their run's deployment; standalone ones into their own id.
    this.logs.add(this.deploymentOfSampler(s.id), level, message, 'sampler-0');
  }

  private visible<T extends Ownership>(items: T[], p: Principal, filter: ListScope): T[] {
    if (filter.scope !== undefined && filter.scope !== 'org') throw invalid(`scope '${filter.scope}' is not supported: use scope=org for your organisation's resources, or omit it for your own.`, { field: 'scope' });
    return items.filter((x) =>
      x.org_id === p.org_id && (filter.scope === 'org' || x.user_id === p.user_id) && (filter.teamId === undefined || x.team_id === filter.teamId));
  }

  private requireModel(name: string, field: string) {
    const model = findBaseModel(name);
    if (!model) throw invalid(`${field} '${name}' is not a supported base model. Supported: ${supportedModelNames().join(', ')}.`, { field, supported: supportedModelNames() });
    return model;
  }

  /** A run's max_seq_len or a sampler's max_seq_length: within the model's context; omitted, the model's maximum. */
  private checkSeqLength(requested: number | null | undefined, baseModel: string, field = 'max_seq_length'): number {
    const max = findBaseModel(baseModel)!.maxContextLength;
    // A declaration, defaulting to the model's maximum as documented: what a request actually sends is bounded by
    // this server's --max-seq-len-limit at that request (lengthLimit).
    const value = requested ?? max;
    if (value < 1 || value > max) throw invalid(`${field} ${value} is out of range for ${baseModel}: use 1..${max}, or omit it.`, { field });
    return value;
  }

  /** The longest input a run or sampler takes now: its own length, within this server's limit (which may have been lowered since it was made). */
  lengthLimit(own: number, ownName: string): { maxLength: number; lengthName: string } {
    const limit = this.options.maxSeqLenLimit;
    return own <= limit ? { maxLength: own, lengthName: ownName } : { maxLength: limit, lengthName: "server's --max-seq-len-limit (raise it to allow longer)" };
  }

  private putSampler(s: SamplerRecord): void {
    this.store.put('sampler', s.id, s);
  }

  private putDeployment(d: DeploymentRecord): void {
    this.store.put('deployment', d.id, d);
  }
}

/** Newest first; records created in the same millisecond keep their reverse creation order (maps iterate in insertion order). */
function newestFirst<T extends { created_at: number }>(items: T[]): T[] {
  return items.reverse().sort((a, b) => b.created_at - a.created_at);
}

function owner(p: Ownership, teamId: string): Ownership {
  return { org_id: p.org_id, user_id: p.user_id, team_id: teamId };
}

