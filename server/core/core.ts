import { EnginePool } from '../../models/index.js';
import { Accounts, type ApiKeySpec } from './accounts.js';
import { Checkpoints } from './checkpoints.js';
import { RealClock, type Clock } from './clock.js';
import { DeploymentLogs } from './deployment-logs.js';
import { Fleet } from './fleet.js';
import { Operations } from './operations.js';
import { SamplerWeights } from './sampler-weights.js';
import { Trainers } from './trainers.js';
import { Sampling, type SamplingOptions } from './sampling.js';
import { Store } from './store.js';
import { Traffic } from './traffic.js';
import { UserConfigs } from './user-config.js';

export interface CoreOptions {
  /** Folder for durable state; without it everything lives in memory. */
  dataDir?: string;
  /** When non-empty, only these keys are accepted. */
  apiKeys?: ApiKeySpec[];
  clock?: Clock;
  coldStartMs?: number;
  deactivationMs?: number;
  samplerReplicas?: number;
  /** How long a presigned checkpoint-file URL stays valid. */
  presignTtlMs?: number;
  /** Sampler replicas: weight-sync delay per replica, floor wait, max_tokens limit. */
  sampling?: Partial<SamplingOptions>;
  /** How long a finished operation's result stays retrievable (default 10 minutes). */
  operationTtlMs?: number;
  /** The model engines' compute: built lazily, one per base model, on first training or sampling. */
  engines?: EnginePool;
}

/**
 * The domain core: owns every record and behaviour, knows nothing of HTTP.
 * Front doors (server/control, later trainer, sampler, admin) call into it.
 */
export class LoopsCore {
  readonly clock: Clock;
  readonly store: Store;
  readonly accounts: Accounts;
  readonly logs: DeploymentLogs;
  readonly traffic: Traffic;
  readonly checkpoints: Checkpoints;
  readonly fleet: Fleet;
  readonly userConfigs: UserConfigs;
  readonly engines: EnginePool;
  readonly operations: Operations;
  readonly samplerWeights: SamplerWeights;
  readonly trainers: Trainers;
  readonly sampling: Sampling;
  private closed = false;

  constructor(options: CoreOptions = {}) {
    this.clock = options.clock ?? new RealClock();
    this.store = new Store(options.dataDir);
    this.accounts = new Accounts(this.store, this.clock, options.apiKeys ?? []);
    this.logs = new DeploymentLogs(this.store, this.clock);
    this.traffic = new Traffic(this.clock);
    this.checkpoints = new Checkpoints(this.store, this.clock, options.dataDir, options.presignTtlMs ?? 3_600_000);
    this.fleet = new Fleet(this.store, this.clock, this.logs, this.checkpoints, {
      coldStartMs: options.coldStartMs ?? 0,
      deactivationMs: options.deactivationMs ?? 0,
      samplerReplicas: options.samplerReplicas ?? 1,
    });
    this.userConfigs = new UserConfigs(this.store);
    this.engines = options.engines ?? new EnginePool();
    this.operations = new Operations(this.clock, { ttlMs: options.operationTtlMs ?? 600_000 });
    this.samplerWeights = new SamplerWeights();
    this.trainers = new Trainers(this.fleet, this.checkpoints, this.engines, this.operations, this.samplerWeights);
    this.sampling = new Sampling(this.fleet, this.checkpoints, this.engines, this.samplerWeights, this.clock, {
      weightSyncDelayMs: options.sampling?.weightSyncDelayMs ?? [0],
      floorWaitMs: options.sampling?.floorWaitMs ?? 2000,
      maxTokensLimit: options.sampling?.maxTokensLimit ?? 4096,
    });
  }

  /** Stops accepting work: long polls answer 503 from now on. */
  beginShutdown(): void {
    this.operations.shutdown();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Stops timers and closes storage. Every write was already committed. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.operations.shutdown();
    void this.engines.close();
    this.fleet.close();
    this.store.close();
  }
}
