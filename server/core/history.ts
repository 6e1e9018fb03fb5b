import type { Clock } from './clock.js';
import type { Operation } from './operations.js';

/** One finished trainer operation, as the dashboard charts it. */
export interface OperationEvent {
  operation_id: string;
  op: string;
  status: 'done' | 'error';
  submitted_at: number;
  finished_at: number;
  duration_ms: number;
  /** Optimizer steps applied when it ran (an optim_step: before it): the x of a loss point. */
  step: number;
  loss?: number;
  grad_norm?: number;
  learning_rate?: number;
  policy_version?: number;
  path?: string;
  error_class?: string;
}

/** A publication to a sampler, or a replica taking one live. */
export interface SamplerEvent {
  at: number;
  kind: 'published' | 'live';
  version: number;
  replica?: number;
  path?: string;
}

/** Events kept per run and per sampler: a long run keeps its newest. */
const KEEP = 5000;

/**
 * What happened to each run and sampler over time, for the dashboard: every
 * finished operation with its loss, grad norm and learning rate, every
 * publication and each replica taking it live, and the scenario last
 * applied. Bounded per run and sampler; rebuilt empty by a reset.
 */
export class History {
  private readonly runs = new Map<string, OperationEvent[]>();
  private readonly samplers = new Map<string, SamplerEvent[]>();
  /** The scenario applied last (at start or through the admin API). */
  scenario: { name: string | null; applied_at: number } | null = null;

  /** `stepOf` says how many optimizer steps a run's trainer has applied now: read as each operation finishes, before the next one runs. */
  constructor(
    private readonly clock: Clock,
    private readonly stepOf: (runId: string) => number,
  ) {}

  operationFinished(op: Operation): void {
    // An optim_step is charted at the step it advanced from; anything else at the step it ran at.
    const now = this.stepOf(op.runId);
    const step = op.op === 'optim_step' && op.status === 'done' ? Math.max(0, now - 1) : now;
    const result = (op.result ?? {}) as { loss?: number; policy_version?: number; path?: string; metrics?: Record<string, number> };
    const event: OperationEvent = {
      operation_id: op.id,
      op: op.op,
      status: op.status === 'done' ? 'done' : 'error',
      submitted_at: op.submittedAt,
      finished_at: op.finishedAt ?? this.clock.now(),
      duration_ms: (op.finishedAt ?? this.clock.now()) - op.submittedAt,
      step,
      ...(typeof result.loss === 'number' ? { loss: result.loss } : {}),
      ...(typeof result.metrics?.grad_norm === 'number' ? { grad_norm: result.metrics.grad_norm } : {}),
      ...(typeof result.metrics?.learning_rate === 'number' ? { learning_rate: result.metrics.learning_rate } : {}),
      ...(typeof result.policy_version === 'number' ? { policy_version: result.policy_version } : {}),
      ...(typeof result.path === 'string' ? { path: result.path } : {}),
      ...(op.error ? { error_class: op.error.error_class } : {}),
    };
    push(this.runs, op.runId, event);
  }

  published(samplerId: string, version: number, path: string): void {
    push(this.samplers, samplerId, { at: this.clock.now(), kind: 'published', version, path });
  }

  replicaLive(samplerId: string, replica: number, version: number): void {
    push(this.samplers, samplerId, { at: this.clock.now(), kind: 'live', version, replica });
  }

  ofRun(runId: string): OperationEvent[] {
    return this.runs.get(runId) ?? [];
  }

  ofSampler(samplerId: string): SamplerEvent[] {
    return this.samplers.get(samplerId) ?? [];
  }
}

function push<T>(map: Map<string, T[]>, key: string, event: T): void {
  let list = map.get(key);
  if (!list) {
    list = [];
    map.set(key, list);
  }
  list.push(event);
  if (list.length > KEEP) list.splice(0, list.length - KEEP);
}
