import { createHash } from 'node:crypto';
import { readAdapter, zeroAdapter, type EnginePool, type LoraAdapter } from '../../models/index.js';
import { parseCheckpointPath, type Checkpoints } from './checkpoints.js';
import type { Clock, Timer } from './clock.js';
import type { DeploymentLogs } from './deployment-logs.js';
import type { History } from './history.js';
import { LoopsError, notFound } from './errors.js';
import { samplerStopped, type Fleet } from './fleet.js';
import type { SamplerRecord } from './records.js';
import type { Publication, SamplerWeights } from './sampler-weights.js';
import type { Settings } from './settings.js';

export type ReplicaOptions = Pick<Settings, 'weightSyncDelayMs' | 'floorWaitMs'>;

interface Replica {
  index: number;
  liveVersion: number;
  adapter: LoraAdapter | null;
  /** Publication being synced, with its timer. */
  /** The publication on its way live, and when (server clock) it will be. */
  syncing: { version: number; timer: Timer; liveAt: number } | null;
  /** Set through the admin API: this replica's own sync delay instead of the settings'. */
  delayMs: number | null;
  /** A paused replica keeps serving what it has; the newest publication waits here until resumed. */
  paused: boolean;
  pending: Publication | null;
}

/** A replica as the admin API shows it. */
export interface ReplicaState extends ReplicaView {
  syncing_version: number | null;
  sync_delay_ms: number;
  paused: boolean;
  pending_version: number | null;
}

interface SamplerState {
  replicas: Replica[];
  /** Wakes requests waiting for a replica to reach their floor. */
  waiters: Set<() => void>;
  roundRobin: number;
}

export interface ReplicaView {
  replica: number;
  policy_version: number;
}

export interface FloorMiss {
  floor: number;
  replicas: ReplicaView[];
  published_version: number;
  /** The floor is above anything the trainer has published: waiting cannot help. */
  unreachable: boolean;
  retry_after_s: number;
}

/** A request that found no replica at or above its floor in time (HTTP 408). */
export class FloorNotReached extends Error {
  constructor(readonly miss: FloorMiss) {
    super(
      miss.unreachable
        ? `X-Min-Policy-Version ${miss.floor} is above anything published to this sampler (latest ${miss.published_version}): publish with save_weights_for_sampler first.`
        : `No replica has reached policy version ${miss.floor} yet (replicas at ${miss.replicas.map((r) => r.policy_version).join(', ')}); retry.`,
    );
  }
}

export interface Served<T> {
  value: T;
  policyVersion: number;
  replica: number;
}

/**
 * The samplers' replicas: each holds a live adapter and its policy version,
 * syncs publications after its own delay (versions only move forward), and
 * serves requests that meet their version floor.
 */
export class SamplerReplicas {
  private readonly states = new Map<string, SamplerState>();

  constructor(
    private readonly fleet: Fleet,
    private readonly checkpoints: Checkpoints,
    private readonly engines: EnginePool,
    private readonly weights: SamplerWeights,
    private readonly clock: Clock,
    private readonly options: ReplicaOptions,
    private readonly logs: DeploymentLogs,
    private readonly history: History,
    /** Aborted at shutdown or reset: a request waiting for its floor is answered then instead of holding the server open. */
    private readonly stopSignal: AbortSignal = new AbortController().signal,
  ) {
    weights.onPublish((samplerId, publication) => this.sync(samplerId, publication));
    // At shutdown or reset no replica takes a publication live any more: the store it logs to is closing.
    stopSignal.addEventListener('abort', () => {
      for (const state of this.states.values()) for (const r of state.replicas) r.syncing?.timer.cancel();
    });
    // A stopped sampler serves nothing again: its replicas' adapters and the latest publication are let go.
    fleet.onSamplerStopped((s) => {
      const state = this.states.get(s.id);
      for (const r of state?.replicas ?? []) r.syncing?.timer.cancel();
      this.states.delete(s.id);
      weights.release(s.id);
    });
  }

  replicas(s: SamplerRecord): ReplicaView[] {
    return this.state(s).replicas.map((r) => ({ replica: r.index, policy_version: r.liveVersion }));
  }

  publishedVersion(s: SamplerRecord): number {
    return this.weights.version(s.id);
  }

  /** Live adapters, for /v1/models: each replica's distinct live version. */
  liveVersions(s: SamplerRecord): number[] {
    return [
      ...new Set(
        this.state(s)
          .replicas.filter((r) => r.adapter)
          .map((r) => r.liveVersion),
      ),
    ].sort((a, b) => a - b);
  }

  /**
   * Runs `work` on a replica whose live version is at least `floor` (the
   * affinity key's replica when given), waiting up to the floor wait for one.
   */
  async serve<T>(s: SamplerRecord, floor: number | undefined, affinityKey: string | undefined, work: (adapter: LoraAdapter) => Promise<T>): Promise<Served<T>> {
    const state = this.state(s);
    const pinned = affinityKey === undefined ? undefined : state.replicas[stableHash(affinityKey) % state.replicas.length]!;
    const pick = (): Replica | undefined => {
      if (pinned) return floor === undefined || pinned.liveVersion >= floor ? pinned : undefined;
      const ok = state.replicas.filter((r) => floor === undefined || r.liveVersion >= floor);
      if (!ok.length) return undefined;
      return ok[state.roundRobin++ % ok.length];
    };
    let replica = pick();
    if (!replica) {
      const published = this.weights.version(s.id);
      if (floor! > published) throw new FloorNotReached(this.miss(s, floor!, true));
      if (this.options.floorWaitMs <= 0) throw new FloorNotReached(this.miss(s, floor!, false));
      replica = await new Promise<Replica | undefined>((resolve, reject) => {
        const check = () => {
          const r = pick();
          if (r) {
            done();
            resolve(r);
          }
        };
        const stop = () => {
          done();
          reject(new LoopsError('unavailable', 'loops-mock is shutting down (or was reset) while this request waited for its policy version floor.'));
        };
        const timer = this.clock.setTimer(this.options.floorWaitMs, () => {
          done();
          resolve(undefined);
        });
        const done = () => {
          state.waiters.delete(check);
          timer.cancel();
          this.stopSignal.removeEventListener('abort', stop);
        };
        if (this.stopSignal.aborted) return stop();
        this.stopSignal.addEventListener('abort', stop);
        state.waiters.add(check);
      });
      if (!replica) throw new FloorNotReached(this.miss(s, floor!, false));
    }
    // The adapter as it is at the start of the request: a sync mid-request does not mix versions.
    const version = replica.liveVersion;
    const adapter = replica.adapter ?? this.baseAdapter(s.base_model);
    const value = await work(adapter);
    return { value, policyVersion: version, replica: replica.index };
  }

  private readonly baseAdapters = new Map<string, LoraAdapter>();

  /** The base model as an adapter, one per base model: requests on it share one identity, so they batch and cache. */
  private baseAdapter(model: string): LoraAdapter {
    let a = this.baseAdapters.get(model);
    if (!a) {
      a = zeroAdapter(this.engines.get(model).sites);
      this.baseAdapters.set(model, a);
    }
    return a;
  }

  private miss(s: SamplerRecord, floor: number, unreachable: boolean): FloorMiss {
    return { floor, replicas: this.replicas(s), published_version: this.weights.version(s.id), unreachable, retry_after_s: this.retryAfterS(s, floor) };
  }

  /**
   * Seconds until a replica can serve the floor: the soonest one already
   * syncing a version at or above it. With none on its way (paused, or the
   * floor not yet published), the slowest replica's sync delay.
   */
  private retryAfterS(s: SamplerRecord, floor: number): number {
    const replicas = this.state(s).replicas;
    const arriving = replicas.filter((r) => r.syncing && r.syncing.version >= floor).map((r) => r.syncing!.liveAt - this.clock.now());
    const ms = arriving.length ? Math.min(...arriving) : Math.max(0, ...replicas.map((r) => this.delayOf(r)));
    return Math.max(1, Math.ceil(ms / 1000));
  }

  private state(s: SamplerRecord): SamplerState {
    let state = this.states.get(s.id);
    if (!state) {
      state = { replicas: Array.from({ length: s.replicas }, (_, index) => newReplica(index)), waiters: new Set(), roundRobin: 0 };
      this.states.set(s.id, state);
      // A standalone sampler of a checkpoint serves that adapter from the start.
      if (s.model_path) {
        const where = parseCheckpointPath(s.model_path, 'model_path');
        const c = this.checkpoints.find(where.runId, where.target, where.name);
        if (c) {
          const adapter = readAdapter(this.checkpoints.readFiles(c), this.engines.get(s.base_model).sites, s.base_model);
          for (const r of state.replicas) r.adapter = adapter;
        }
      }
    }
    return state;
  }

  /** Each replica makes a publication live after its own delay; a newer one supersedes an older one still syncing. */
  private sync(samplerId: string, publication: Publication): void {
    const s = this.fleet.findSampler(samplerId);
    if (!s) return;
    // The replicas exist from the sampler's creation: even a first publication goes live after each one's delay.
    const state = this.state(s);
    this.log(s, `Sampler ${s.id}: policy version ${publication.version} published (${publication.path}); ${state.replicas.length} replica(s) syncing`);
    this.history.published(s.id, publication.version, publication.path);
    for (const replica of state.replicas) this.syncReplica(s, state, replica, publication);
  }

  private syncReplica(s: SamplerRecord, state: SamplerState, replica: Replica, publication: Publication): void {
    if (publication.version < replica.liveVersion) return;
    if (replica.paused) {
      if (!replica.pending || replica.pending.version < publication.version) replica.pending = publication;
      return;
    }
    if (replica.syncing && replica.syncing.version > publication.version) return;
    replica.syncing?.timer.cancel();
    const delay = this.delayOf(replica);
    const goLive = () => {
      replica.syncing = null;
      if (publication.version < replica.liveVersion) return;
      replica.adapter = publication.adapter;
      replica.liveVersion = publication.version;
      this.log(s, `Sampler ${s.id} replica ${replica.index}: policy version ${publication.version} live`, replica.index);
      this.history.replicaLive(s.id, replica.index, publication.version);
      for (const w of [...state.waiters]) w();
    };
    if (delay <= 0) goLive();
    else replica.syncing = { version: publication.version, timer: this.clock.setTimer(delay, goLive), liveAt: this.clock.now() + delay };
  }

  private requireRunning(s: SamplerRecord): void {
    if (samplerStopped(s))
      throw new LoopsError('conflict', `Sampler ${s.id} is ${s.deleted ? 'deleted' : s.status}: it has no replicas to change.`, { sampler_id: s.id });
  }

  private log(s: SamplerRecord, message: string, replica = 0): void {
    this.logs.add(this.fleet.deploymentOfSampler(s.id), 'INFO', message, `sampler-${replica}`);
  }

  private delayOf(replica: Replica): number {
    if (replica.delayMs !== null) return replica.delayMs;
    const delays = this.options.weightSyncDelayMs;
    return delays[Math.min(replica.index, delays.length - 1)] ?? 0;
  }

  // ---- replica control (admin API) ------------------------------------------

  replicaStates(s: SamplerRecord): ReplicaState[] {
    // A stopped sampler's replicas are gone (and their weights with them).
    if (samplerStopped(s)) return [];
    return this.state(s).replicas.map((r) => ({
      replica: r.index,
      policy_version: r.liveVersion,
      syncing_version: r.syncing?.version ?? null,
      sync_delay_ms: this.delayOf(r),
      paused: r.paused,
      pending_version: r.pending?.version ?? null,
    }));
  }

  /** Grows or shrinks a sampler's replicas; a new replica starts with the newest publication live, as a freshly booted one would. */
  setReplicaCount(s: SamplerRecord, count: number): void {
    this.requireRunning(s);
    const state = this.state(s);
    while (state.replicas.length > count) state.replicas.pop()!.syncing?.timer.cancel();
    const latest = this.weights.get(s.id);
    while (state.replicas.length < count) {
      const r = newReplica(state.replicas.length);
      if (latest) {
        r.adapter = latest.adapter;
        r.liveVersion = latest.version;
      } else r.adapter = state.replicas[0]?.adapter ?? null;
      state.replicas.push(r);
    }
    this.fleet.setSamplerReplicas(s, count);
    for (const w of [...state.waiters]) w();
  }

  /** Sets one replica's sync delay (null: back to the settings') and pauses or resumes its sync. */
  controlReplica(s: SamplerRecord, index: number, change: { sync_delay_ms?: number | null; paused?: boolean }): ReplicaState {
    this.requireRunning(s);
    const state = this.state(s);
    const replica = state.replicas[index];
    if (!replica)
      throw notFound(`Sampler ${s.id} has no replica ${index}: it has ${state.replicas.length} (0..${state.replicas.length - 1}).`, { field: 'replica' });
    if (change.sync_delay_ms !== undefined) replica.delayMs = change.sync_delay_ms;
    if (change.paused === true) replica.paused = true;
    if (change.paused === false && replica.paused) {
      replica.paused = false;
      const pending = replica.pending;
      replica.pending = null;
      if (pending) this.syncReplica(s, state, replica, pending);
    }
    return this.replicaStates(s)[index]!;
  }
}

function newReplica(index: number): Replica {
  return { index, liveVersion: 0, adapter: null, syncing: null, delayMs: null, paused: false, pending: null };
}

function stableHash(key: string): number {
  return createHash('sha256').update(key).digest().readUInt32LE(0);
}
