import type { FaultRule, FaultRuleInput } from '../core/faults.js';
import type { JournalEntry, JournalQuery } from '../core/journal.js';
import type { ProgressRule, ProgressRuleInput } from '../core/progress.js';
import type { ReplicaState } from '../core/replicas.js';
import type { SettingsWire } from '../core/settings.js';
import type { ScenarioSpec } from './scenario.js';

export interface SamplerAdminState {
  sampler_id: string;
  status: string;
  published_version: number;
  replicas: ReplicaState[];
}

export interface HeldOperationView {
  operation_id: string;
  run_id: string;
  op: string;
  status: string;
  rule: string;
  mode: string;
  polls_seen: number;
}

export interface ClockView {
  mode: 'real' | 'virtual';
  now: string;
  now_ms: number;
}

/** An admin API call that did not answer 2xx: the status and the server's error body. */
export class MockAdminError extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
  ) {
    super(`loops-mock admin API answered ${status}: ${JSON.stringify(body)}`);
  }
}

/**
 * A typed client of the admin API (docs/admin.md), for tests that drive
 * loops-mock: `new MockAdmin(server.url, token)`.
 */
export class MockAdmin {
  constructor(
    private readonly baseUrl: string,
    private readonly token?: string,
  ) {}

  reset(): Promise<{ reset: boolean }> {
    return this.call('POST', '/_mock/reset');
  }

  journal(query: JournalQuery = {}): Promise<{ entries: JournalEntry[]; next_since: number; evicted: number }> {
    const params = new URLSearchParams(
      Object.entries(query)
        .filter(([, v]) => v !== undefined)
        .map(([k, v]) => [k, String(v)]),
    );
    const qs = params.size ? `?${params}` : '';
    return this.call('GET', `/_mock/journal${qs}`);
  }

  addFault(rule: FaultRuleInput): Promise<FaultRule> {
    return this.call('POST', '/_mock/faults', rule);
  }

  async faults(): Promise<FaultRule[]> {
    return (await this.call<{ faults: FaultRule[] }>('GET', '/_mock/faults')).faults;
  }

  removeFault(id: string): Promise<FaultRule> {
    return this.call('DELETE', `/_mock/faults/${encodeURIComponent(id)}`);
  }

  clearFaults(): Promise<{ removed: number }> {
    return this.call('DELETE', '/_mock/faults');
  }

  addProgress(rule: ProgressRuleInput): Promise<ProgressRule> {
    return this.call('POST', '/_mock/progress', rule);
  }

  async progressRules(): Promise<ProgressRule[]> {
    return (await this.call<{ progress: ProgressRule[] }>('GET', '/_mock/progress')).progress;
  }

  clearProgress(): Promise<{ removed: number }> {
    return this.call('DELETE', '/_mock/progress');
  }

  async heldOperations(): Promise<HeldOperationView[]> {
    return (await this.call<{ held: HeldOperationView[] }>('GET', '/_mock/operations')).held;
  }

  release(operationId: string): Promise<{ operation_id: string; status: string }> {
    return this.call('POST', `/_mock/operations/${encodeURIComponent(operationId)}/release`);
  }

  sampler(samplerId: string): Promise<SamplerAdminState> {
    return this.call('GET', `/_mock/samplers/${encodeURIComponent(samplerId)}`);
  }

  setReplicas(samplerId: string, replicas: number): Promise<SamplerAdminState> {
    return this.call('PATCH', `/_mock/samplers/${encodeURIComponent(samplerId)}`, { replicas });
  }

  controlReplica(samplerId: string, replica: number, change: { sync_delay_ms?: number | null; paused?: boolean }): Promise<ReplicaState> {
    return this.call('PATCH', `/_mock/samplers/${encodeURIComponent(samplerId)}/replicas/${replica}`, change);
  }

  settings(): Promise<Required<SettingsWire>> {
    return this.call('GET', '/_mock/settings');
  }

  updateSettings(change: SettingsWire): Promise<Required<SettingsWire>> {
    return this.call('PATCH', '/_mock/settings', change);
  }

  clock(): Promise<ClockView> {
    return this.call('GET', '/_mock/clock');
  }

  advanceClock(ms: number): Promise<ClockView> {
    return this.call('POST', '/_mock/clock/advance', { ms });
  }

  /** Applies a shipped scenario by name, a scenario object, or JSON/YAML text. */
  applyScenario(
    scenario: { name: string } | { scenario: ScenarioSpec } | { text: string },
  ): Promise<{ name: string | null; faults: number; progress: number }> {
    return this.call('POST', '/_mock/scenario', scenario);
  }

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    // Marks the call as no browser's simple request: the admin API refuses changes without it (docs/admin.md, "Who may call it").
    const headers: Record<string, string> = { 'x-loops-mock-admin': '1' };
    if (this.token !== undefined) headers.authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers['content-type'] = 'application/json';
    const res = await fetch(`${this.baseUrl}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    const parsed: unknown = text ? JSON.parse(text) : null;
    if (!res.ok) throw new MockAdminError(res.status, parsed);
    return parsed as T;
  }
}
