import { statfsSync } from 'node:fs';
import { totalmem } from 'node:os';
import type { FastifyRequest } from 'fastify';
import type { Static } from 'typebox';
import { invalid } from '../core/errors.js';
import type { ControlContext, TypedApp } from './context.js';
import { keptAnswer, replies } from './context.js';
import {
  DeactivateRunResponse,
  DeploymentIdParams,
  DeploymentResponse,
  GetLoopsDeploymentMetricsRequestV1,
  ListDeploymentsResponse,
  LogsQuery,
  LogsResponse,
  MetricsResponse,
  ScopeQuery,
} from './schemas.js';

const HOUR_MS = 3_600_000;
const MAX_POINTS = 1000;
const MAX_EPOCH_MS = 253_402_300_799_999;
/** Baseten's logs routes: without a start, the window is the 30 minutes before its end; at most 7 days wide. */
const DEFAULT_LOG_WINDOW_MS = 30 * 60_000;
const MAX_LOG_WINDOW_MS = 7 * 24 * HOUR_MS;

/** A logs request's filters, from a query string (GET) or a JSON body (POST, where null means absent). */
export type LogFilter = { [K in keyof Static<typeof LogsQuery>]?: Static<typeof LogsQuery>[K] | null };

/** Within years 1970..9999: beyond, a Date cannot show it, and near 2^53 a step no longer moves the time at all. */
function checkEpochMillis(v: number | null | undefined, field: string): void {
  if (v !== undefined && v !== null && !(Number.isSafeInteger(v) && v >= 0 && v <= MAX_EPOCH_MS)) {
    throw invalid(`${field.split('.').pop()} must be epoch milliseconds from 0 to ${MAX_EPOCH_MS} (the year 9999), got ${v}.`, { field });
  }
}

/**
 * A logs answer: lines of one deployment (of one kind of replica, e.g. a sampler's) within the window, newest
 * first unless `direction` is asc. `where` names the request part the filters came from (query or body).
 */
export function logsReply(ctx: ControlContext, deploymentId: string, q: LogFilter, where: 'query' | 'body', replicaPrefix?: string) {
  checkEpochMillis(q.start_epoch_millis, `${where}.start_epoch_millis`);
  checkEpochMillis(q.end_epoch_millis, `${where}.end_epoch_millis`);
  const endMs = q.end_epoch_millis ?? ctx.core.clock.now();
  const startMs = q.start_epoch_millis ?? Math.max(0, endMs - DEFAULT_LOG_WINDOW_MS);
  if (startMs > endMs) {
    throw invalid(`start_epoch_millis (${startMs}) must not be after end_epoch_millis (${endMs}${q.end_epoch_millis == null ? ', now: the default' : ''}).`, {
      field: `${where}.start_epoch_millis`,
    });
  }
  if (endMs - startMs > MAX_LOG_WINDOW_MS) {
    throw invalid(
      `The window from start_epoch_millis to end_epoch_millis is ${((endMs - startMs) / (24 * HOUR_MS)).toFixed(1)} days; it must not exceed 7 days. Ask for a later start or an earlier end.`,
      { field: `${where}.start_epoch_millis` },
    );
  }
  const logs = ctx.core.logs.query({
    deploymentId,
    startMs,
    endMs,
    direction: q.direction ?? 'desc',
    limit: q.limit ?? 500,
    minLevel: q.min_level ?? undefined,
    replicaPrefix,
  });
  return { logs: logs.map((l) => ctx.views.log(l)) };
}

/**
 * A logs answer for a GET: kept while the records stand still only when the window is fixed by the request
 * (an end is given); without one the window ends now, so the answer changes with the clock alone.
 */
export function logsAnswer(ctx: ControlContext, request: FastifyRequest, deploymentId: string, q: Static<typeof LogsQuery>, replicaPrefix?: string) {
  const build = () => logsReply(ctx, deploymentId, q, 'query', replicaPrefix);
  return q.end_epoch_millis === undefined ? build() : keptAnswer(ctx, request, build);
}

/** Loops deployments (the long-lived trainer + sampler pairs), with their logs and metrics. */
export function deploymentRoutes(app: TypedApp, ctx: ControlContext, dataDir: string | undefined): void {
  const { core, views } = ctx;
  const tags = ['deployments'];

  app.get(
    '/v1/loops/deployments',
    {
      schema: {
        tags,
        summary: 'List deployments that are not STOPPED (your own unless scope=org); GET by id still finds a stopped one',
        querystring: ScopeQuery,
        response: replies(ListDeploymentsResponse),
      },
    },
    (req) => keptAnswer(ctx, req, () => ({ deployments: core.fleet.listDeployments(req.principal, req.query).map((d) => views.deployment(d)) })),
  );

  app.get(
    '/v1/loops/deployments/:deployment_id',
    {
      schema: { tags, summary: 'Get a deployment', params: DeploymentIdParams, response: replies(DeploymentResponse) },
    },
    (req) => ({ deployment: views.deployment(core.fleet.getDeployment(req.principal, req.params.deployment_id)) }),
  );

  app.post(
    '/v1/loops/deployments/:deployment_id/deactivate',
    {
      schema: {
        tags,
        summary: 'Deactivate a deployment: its active run and sampler stop',
        params: DeploymentIdParams,
        response: replies(DeactivateRunResponse),
      },
    },
    (req) => {
      const d = core.fleet.deactivateDeployment(req.principal, req.params.deployment_id);
      return { id: d.id, base_model: d.base_model, user: views.user(d) };
    },
  );

  app.get(
    '/v1/loops/deployments/:deployment_id/logs',
    {
      schema: {
        tags,
        summary:
          "The deployment's log lines: lifecycle events and every request its trainer and sampler served (newest first; the last 30 minutes unless a range is given)",
        params: DeploymentIdParams,
        querystring: LogsQuery,
        response: replies(LogsResponse),
      },
    },
    (req) => logsAnswer(ctx, req, core.fleet.getDeployment(req.principal, req.params.deployment_id).id, req.query),
  );

  app.post(
    '/v1/loops/deployments/:deployment_id/metrics',
    {
      schema: {
        tags,
        summary: "The deployment's request counters and process resources over a time range",
        params: DeploymentIdParams,
        body: GetLoopsDeploymentMetricsRequestV1,
        response: replies(MetricsResponse),
      },
    },
    (req) => {
      const d = core.fleet.getDeployment(req.principal, req.params.deployment_id);
      const body = req.body ?? {};
      for (const field of ['start_epoch_millis', 'end_epoch_millis'] as const) checkEpochMillis(body[field], `body.${field}`);
      const end = body.end_epoch_millis ?? core.clock.now();
      const start = body.start_epoch_millis ?? end - HOUR_MS;
      if (start >= end) throw invalid('start_epoch_millis must be before end_epoch_millis.', { field: 'body.start_epoch_millis' });
      // Like upstream: without step_seconds, wide windows get coarser steps (at most 60 points).
      const stepMs = body.step_seconds ? body.step_seconds * 1000 : Math.max(1000, Math.ceil((end - start) / 60 / 1000) * 1000);
      if ((end - start) / stepMs > MAX_POINTS) {
        throw invalid(`step_seconds ${body.step_seconds} gives more than ${MAX_POINTS} points over this range: use a larger step or a shorter range.`, {
          field: 'body.step_seconds',
        });
      }
      const perMs = (body.time_divisor_seconds ?? 1) * 1000;
      const t = core.traffic.report(d.id, start, end, stepMs, perMs);
      const at = (ms: number) => new Date(ms).toISOString();
      const series = (points: { timestamp: number; value: number }[]) => points.map((p) => ({ timestamp: at(p.timestamp), value: p.value }));
      const usedBytes = core.checkpoints.totalBytes(new Set(core.fleet.runsOf(d.id).map((r) => r.id)));
      const capacity = dataDir
        ? (() => {
            const s = statfsSync(dataDir);
            return s.blocks * s.bsize;
          })()
        : totalmem();
      const storage = {
        usage_bytes: [{ timestamp: at(end), value: usedBytes }],
        utilization: [{ timestamp: at(end), value: capacity ? usedBytes / capacity : 0 }],
      };
      const cpu = series(t.cpu_usage);
      const memory = series(t.cpu_memory_usage_bytes);
      return {
        deployment_id: d.id,
        metrics: {
          inference_volume: series(t.inference_volume),
          concurrent_requests: series(t.concurrent_requests),
          response_time_stats: t.response_time_stats.map((p) => ({ ...p, timestamp: at(p.timestamp) })),
          inference_volume_by_status: t.inference_volume_by_status.map((p) => ({ ...p, timestamp: at(p.timestamp) })),
          // loops-mock computes on CPU: no GPU series exist.
          gpu_memory_usage_bytes: {},
          gpu_utilization: {},
          cpu_usage: cpu,
          cpu_memory_usage_bytes: memory,
          ephemeral_storage: storage,
          per_node_metrics: [
            { node_id: 'node-0', gpu_memory_usage_bytes: {}, gpu_utilization: {}, cpu_usage: cpu, cpu_memory_usage_bytes: memory, ephemeral_storage: storage },
          ],
        },
      };
    },
  );
}
