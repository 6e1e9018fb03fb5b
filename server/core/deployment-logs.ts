import type { Clock } from './clock.js';
import type { LogLevel, LogRecord } from './records.js';
import { StorageError } from './storage-errors.js';
import type { LogQuery, Store } from './store.js';

/**
 * The log lines of each deployment: every lifecycle event and every request
 * its trainer or sampler served. What `GET /deployments/{id}/logs` returns.
 */
export class DeploymentLogs {
  /** @param onLifecycle told of every line that is not a request's (lifecycle events, for the server log) */
  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly onLifecycle: (line: LogRecord) => void = () => undefined,
  ) {}

  add(deploymentId: string, level: LogLevel, message: string, replica: string | null = null, requestId: string | null = null): void {
    const line = { deployment_id: deploymentId, ts_ms: this.clock.now(), level, message, replica, request_id: requestId };
    try {
      this.store.appendLog(line);
    } catch (err) {
      // Inside a transaction the failure fails the whole change (its caller answers it); alone, a log line is
      // never worth failing or crashing for: most are written after their request was answered. Counted, told once.
      if (!(err instanceof StorageError) || this.store.inTransaction) throw err;
      this.store.background.failed(err);
    }
    if (requestId === null) this.onLifecycle(line);
  }

  query(q: LogQuery): LogRecord[] {
    return this.store.queryLogs(q);
  }
}
