import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { EnginePool } from '../../models/index.js';
import { Accounts, type ApiKeySpec } from './accounts.js';
import { Checkpoints } from './checkpoints.js';
import { RealClock, type Clock } from './clock.js';
import { DeploymentLogs } from './deployment-logs.js';
import { Fleet } from './fleet.js';
import { Faults } from './faults.js';
import { History } from './history.js';
import { HubRepos } from './hub-repos.js';
import { Inference } from './inference.js';
import { Journal, type JournalDetail } from './journal.js';
import { ModelDeployments } from './model-deployments.js';
import { Operations } from './operations.js';
import { Progress } from './progress.js';
import type { LogRecord } from './records.js';
import { SamplerWeights } from './sampler-weights.js';
import { Trainers } from './trainers.js';
import { SamplerReplicas } from './replicas.js';
import { Sampling } from './sampling.js';
import { DEFAULT_SETTINGS, type Settings } from './settings.js';
import { Store } from './store.js';
import { Traffic } from './traffic.js';
import { UserConfigs } from './user-config.js';

export interface CoreOptions {
  /** Folder for durable state; without it everything lives in memory. */
  dataDir?: string;
  /** When non-empty, only these keys are accepted. */
  apiKeys?: ApiKeySpec[];
  clock?: Clock;
  /** Behaviour knobs (cold starts, replicas, floors, long polls...); the rest take their defaults. */
  settings?: Partial<Settings>;
  /** How long a presigned checkpoint-file URL stays valid. */
  presignTtlMs?: number;
  /** The model engines' compute: built lazily, one per base model, on first training or sampling. */
  engines?: EnginePool;
  /** Requests the journal keeps in memory (default 10000), and a file it also appends them to. */
  journalSize?: number;
  journalFile?: string;
  journalDetail?: JournalDetail;
  /** Seed of fault rules that give none. */
  faultSeed?: number;
}

/**
 * The domain core: owns every record and behaviour, knows nothing of HTTP.
 * Front doors (server/control, trainer, sampler, admin) call into it.
 * Everything but the engines, the clock and the journal is rebuilt by
 * `reset()`, so front doors read the parts through the core on each request.
 */
export class LoopsCore {
  readonly clock: Clock;
  readonly engines: EnginePool;
  readonly journal: Journal;
  /** The Hugging Face repositories the mirror serves (the tokenizers' files: nothing a reset changes). */
  readonly hub: HubRepos;
  /** What the server started with; `settings` is the live copy scenarios and the admin API change. */
  readonly startupSettings: Settings;
  settings!: Settings;
  store!: Store;
  accounts!: Accounts;
  logs!: DeploymentLogs;
  traffic!: Traffic;
  checkpoints!: Checkpoints;
  fleet!: Fleet;
  userConfigs!: UserConfigs;
  operations!: Operations;
  samplerWeights!: SamplerWeights;
  trainers!: Trainers;
  replicas!: SamplerReplicas;
  sampling!: Sampling;
  faults!: Faults;
  progress!: Progress;
  /** Checkpoints deployed to inference (Baseten models) and their OpenAI-compatible serving. */
  modelDeployments!: ModelDeployments;
  inference!: Inference;
  /** Each run's operations and each sampler's publications over time (the dashboard). */
  history!: History;
  private closed = false;
  /** Aborted when this generation of parts stops (shutdown or reset): every wait that could outlast it ends. */
  private stopping = new AbortController();
  private readonly resetListeners: (() => void)[] = [];
  private readonly lifecycleListeners: ((line: LogRecord) => void)[] = [];
  private readonly storageListeners: ((level: 'warn' | 'info', message: string) => void)[] = [];
  private readonly tellStorage = (level: 'warn' | 'info', message: string) => {
    for (const l of this.storageListeners) l(level, message);
  };

  constructor(private readonly options: CoreOptions = {}) {
    this.clock = options.clock ?? new RealClock();
    this.engines = options.engines ?? new EnginePool();
    this.journal = new Journal(options.journalSize ?? 10_000, options.journalFile, options.journalDetail);
    this.journal.fileFailures.tellTo(this.tellStorage);
    this.hub = new HubRepos(this.engines);
    this.startupSettings = { ...DEFAULT_SETTINGS, ...options.settings };
    this.build();
  }

  private build(): void {
    const o = this.options;
    this.settings = structuredClone(this.startupSettings);
    this.stopping = new AbortController();
    this.store = new Store(o.dataDir, this.tellStorage);
    this.accounts = new Accounts(this.store, this.clock, o.apiKeys ?? []);
    this.logs = new DeploymentLogs(this.store, this.clock, (line) => {
      for (const l of this.lifecycleListeners) l(line);
    });
    this.traffic = new Traffic(this.clock);
    this.checkpoints = new Checkpoints(this.store, this.clock, o.dataDir, o.presignTtlMs ?? 3_600_000);
    this.fleet = new Fleet(this.store, this.clock, this.logs, this.checkpoints, this.settings, this.accounts);
    this.userConfigs = new UserConfigs(this.store);
    this.progress = new Progress(this.clock);
    this.faults = new Faults(o.faultSeed ?? 1);
    this.operations = new Operations(this.clock, this.settings, this.progress);
    this.history = new History(this.clock, (runId) => {
      const run = this.fleet.findRun(runId);
      return run ? this.trainers.policyVersion(run) : 0;
    });
    this.operations.onFinish((op) => this.history.operationFinished(op));
    this.samplerWeights = new SamplerWeights();
    this.trainers = new Trainers(this.fleet, this.checkpoints, this.engines, this.operations, this.samplerWeights, this.settings);
    this.replicas = new SamplerReplicas(
      this.fleet,
      this.checkpoints,
      this.engines,
      this.samplerWeights,
      this.clock,
      this.settings,
      this.logs,
      this.history,
      this.stopping.signal,
    );
    this.sampling = new Sampling(this.fleet, this.replicas, this.engines, this.clock, this.settings);
    this.modelDeployments = new ModelDeployments(this.store, this.clock, this.checkpoints, this.engines, this.logs, this.settings, this.progress);
    this.inference = new Inference(this.modelDeployments, this.engines, this.clock, this.logs, this.settings);
  }

  /**
   * Back to an empty server with the configuration it started with: every
   * record, checkpoint, operation, fault and progress rule and journal entry
   * gone, settings as at start. Long polls in flight are answered 503.
   */
  async reset(): Promise<void> {
    this.stopping.abort();
    this.operations.shutdown();
    // A running operation finishes into the old store before it is closed and its files removed.
    await this.operations.drain();
    this.fleet.close();
    this.store.close();
    if (this.options.dataDir) {
      for (const name of ['loops-mock.sqlite', 'loops-mock.sqlite-wal', 'loops-mock.sqlite-shm', 'checkpoints']) {
        rmSync(join(this.options.dataDir, name), { recursive: true, force: true });
      }
    }
    this.journal.clear();
    this.build();
    for (const listener of this.resetListeners) listener();
  }

  /** Told of every lifecycle event (run created, sampler ACTIVE, a publication live on a replica, a run stopped...), across resets. */
  onLifecycle(listener: (line: LogRecord) => void): void {
    this.lifecycleListeners.push(listener);
  }

  /** Told when background writes (log lines, the journal file) start failing, and when they work again; across resets. */
  onStorageNotice(listener: (level: 'warn' | 'info', message: string) => void): void {
    this.storageListeners.push(listener);
  }

  /** Runs after each reset, on the fresh parts (the start-up scenario is applied again this way). */
  onReset(listener: () => void): void {
    this.resetListeners.push(listener);
  }

  /** Stops accepting work: long polls answer 503 from now on. */
  beginShutdown(): void {
    this.stopping.abort();
    this.operations.shutdown();
  }

  /** Aborted at shutdown or reset: waits that a client holds open (fault delays, held polls, floor waits) end then. */
  get stopSignal(): AbortSignal {
    return this.stopping.signal;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Waits for the operations that were running when shutdown began: what they write lands before storage closes. */
  drain(): Promise<void> {
    return this.operations.drain();
  }

  /** Stops timers and closes storage. Every write was already committed. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stopping.abort();
    this.operations.shutdown();
    // Engines handed in belong to the caller (several servers may share them).
    if (!this.options.engines) void this.engines.close();
    this.fleet.close();
    this.store.close();
  }
}
