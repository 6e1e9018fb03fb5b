import type { Clock, Timer } from './clock.js';
import type { DeploymentLogs } from './deployment-logs.js';
import { StorageError } from './storage-errors.js';
import type { DeploymentRecord, DeploymentStatus, RunRecord, SamplerRecord, SamplerStatus, SessionRecord } from './records.js';
import type { Settings } from './settings.js';
import type { Store } from './store.js';

export type FleetOptions = Pick<Settings, 'coldStartMs' | 'deactivationMs' | 'samplerReplicas' | 'runIdleTimeoutMs' | 'samplerIdleMs' | 'maxSeqLenLimit'>;

/** Samplers in these states serve no one and never come back. */
export const DEAD_SAMPLER: ReadonlySet<SamplerStatus> = new Set(['DEACTIVATING', 'INACTIVE', 'FAILED', 'BUILD_FAILED', 'DEPLOY_FAILED', 'BUILD_STOPPED']);

/**
 * The fleet's records and how they move on their own: cold starts walking a
 * deployment or sampler to ready, idle timeouts scaling runs and samplers to
 * zero, a wake-up, deactivation and its delay, and stopping whatever a
 * restart left running. Fleet (fleet.ts) adds the requests that create, find
 * and change them.
 */
export abstract class FleetLifecycle {
  protected readonly sessions = new Map<string, SessionRecord>();
  protected readonly runs = new Map<string, RunRecord>();
  protected readonly deployments = new Map<string, DeploymentRecord>();
  protected readonly samplers = new Map<string, SamplerRecord>();
  /** Last trainer activity per run, for the idle timeout. */
  protected readonly lastActivity = new Map<string, number>();
  /** Last request per sampler, for the sampler idle timeout (samplerIdleMs). */
  private readonly samplerActivity = new Map<string, number>();
  private readonly timers = new Set<Timer>();
  /** Called whenever a run stops, with the reason (the trainer fails its pending operations). */
  private readonly runStoppedListeners: ((run: RunRecord, reason: string) => void)[] = [];
  /** Called when a sampler stops serving for good (DEACTIVATING or INACTIVE): its replicas' weights can go. */
  private readonly samplerStoppedListeners: ((sampler: SamplerRecord) => void)[] = [];

  constructor(
    protected readonly store: Store,
    protected readonly clock: Clock,
    protected readonly logs: DeploymentLogs,
    protected readonly options: FleetOptions,
  ) {
    for (const s of store.load<SessionRecord>('session')) this.sessions.set(s.id, s);
    for (const r of store.load<RunRecord>('run')) this.runs.set(r.id, r);
    for (const d of store.load<DeploymentRecord>('deployment')) this.deployments.set(d.id, d);
    for (const s of store.load<SamplerRecord>('sampler')) this.samplers.set(s.id, s);
    this.stopEverythingLeftRunning();
  }

  /** Any trainer request keeps its run warm. */
  touchRun(runId: string): void {
    if (this.runs.get(runId)?.status === 'ACTIVE') this.lastActivity.set(runId, Math.max(this.clock.now(), this.lastActivity.get(runId) ?? 0));
  }

  /** Any sampler request keeps its sampler warm. */
  touchSampler(samplerId: string): void {
    if (this.samplers.has(samplerId)) this.samplerActivity.set(samplerId, this.clock.now());
  }

  /** Milliseconds until a run's trainer has finished its cold start (0 when ready). */
  coldStartLeft(run: RunRecord): number {
    return Math.max(0, run.created_at + this.options.coldStartMs - this.clock.now());
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

  /** Where a sampler's traffic and logs are counted: its run's deployment, or its own id when standalone. */
  deploymentOfSampler(id: string): string {
    const s = this.samplers.get(id);
    const run = s?.run_id ? this.runs.get(s.run_id) : undefined;
    return run?.deployment_id ?? id;
  }

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

  /** BUILDING → DEPLOYING → LOADING_MODEL → ACTIVE over the cold start; each step only if nothing stopped it meanwhile. */
  protected walkSampler(s: SamplerRecord): void {
    const steps: [SamplerStatus, SamplerStatus][] = [
      ['BUILDING', 'DEPLOYING'],
      ['DEPLOYING', 'LOADING_MODEL'],
      ['LOADING_MODEL', 'ACTIVE'],
    ];
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
  protected walkDeployment(d: DeploymentRecord): void {
    const steps: [DeploymentStatus, DeploymentStatus][] = [
      ['CREATED', 'DEPLOYING'],
      ['DEPLOYING', 'RUNNING'],
    ];
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
    steps.forEach(([from, to], i) => {
      this.after((total * (i + 1)) / steps.length, () => apply(from, to));
    });
  }

  protected armIdleTimer(run: RunRecord): void {
    const check = () => {
      if (run.status !== 'ACTIVE') return;
      const idleFor = this.clock.now() - (this.lastActivity.get(run.id) ?? run.created_at);
      const limit = this.idleLimitMs(run);
      const why =
        this.options.runIdleTimeoutMs === null
          ? `idle for ${run.scale_down_delay_seconds}s (scale_down_delay_seconds)`
          : `idle for ${limit} ms (run_idle_timeout_ms setting)`;
      if (idleFor >= limit) this.store.transaction(() => this.stopRun(run, why, 'SCALED_TO_ZERO'));
      else this.after(limit - idleFor, check);
    };
    this.after(this.idleLimitMs(run) + this.options.coldStartMs, check);
  }

  private idleLimitMs(run: RunRecord): number {
    return this.options.runIdleTimeoutMs ?? run.scale_down_delay_seconds * 1000;
  }

  /** Stops a run, its deployment and its paired sampler. */
  protected stopRun(run: RunRecord, reason: string, deploymentStatus: DeploymentStatus): void {
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

  protected markRunInactive(run: RunRecord, reason: string): void {
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

  protected stopDeployment(d: DeploymentRecord, status: DeploymentStatus, reason: string): void {
    d.status = status;
    d.active_run_id = null;
    this.putDeployment(d);
    this.logs.add(d.id, 'INFO', `Trainer deployment ${d.id} ${status}: ${reason}`, 'trainer-0');
  }

  /** DEACTIVATING, then INACTIVE after the deactivation delay. */
  protected stopSampler(s: SamplerRecord, reason: string): void {
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

  protected logSampler(s: SamplerRecord, level: 'INFO' | 'WARNING', message: string): void {
    // Paired samplers log into their run's deployment; standalone ones into their own id.
    this.logs.add(this.deploymentOfSampler(s.id), level, message, 'sampler-0');
  }

  protected putSampler(s: SamplerRecord): void {
    this.store.put('sampler', s.id, s);
  }

  protected putDeployment(d: DeploymentRecord): void {
    this.store.put('deployment', d.id, d);
  }
}
