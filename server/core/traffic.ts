import { cpuUsage, memoryUsage } from 'node:process';
import type { Clock } from './clock.js';

interface RequestSample {
  at: number;
  status: number;
  latencyMs: number;
  /** Requests in flight on the deployment when this one finished, itself included. */
  concurrent: number;
}

interface ResourceSample {
  at: number;
  cpuCores: number;
  rssBytes: number;
}

export interface SeriesPoint {
  timestamp: number;
  value: number;
}

export interface TrafficReport {
  inference_volume: SeriesPoint[];
  concurrent_requests: SeriesPoint[];
  response_time_stats: { timestamp: number; p50: number | null; p95: number | null; p99: number | null }[];
  inference_volume_by_status: { timestamp: number; status_2xx: number; status_4xx: number; status_5xx: number }[];
  cpu_usage: SeriesPoint[];
  cpu_memory_usage_bytes: SeriesPoint[];
}

const MAX_SAMPLES = 20_000;
const RESOURCE_EVERY_MS = 1000;

/**
 * Request counters per deployment, for `POST /deployments/{id}/metrics`.
 * Kept in memory in a bounded window: metrics are a view of recent traffic,
 * not a record that outlives the process.
 */
export class Traffic {
  private readonly requests = new Map<string, RequestSample[]>();
  private readonly resources = new Map<string, ResourceSample[]>();
  private readonly inFlight = new Map<string, number>();
  private lastCpu = { at: Date.now(), usage: cpuUsage() };

  constructor(private readonly clock: Clock) {}

  /** Marks a request as started; call the returned function when it ends. */
  begin(deploymentId: string): (status: number, latencyMs: number) => void {
    this.inFlight.set(deploymentId, (this.inFlight.get(deploymentId) ?? 0) + 1);
    return (status, latencyMs) => {
      const concurrent = this.inFlight.get(deploymentId) ?? 1;
      this.inFlight.set(deploymentId, concurrent - 1);
      push(this.requests, deploymentId, { at: this.clock.now(), status, latencyMs, concurrent });
      this.sampleResources(deploymentId);
    };
  }

  report(deploymentId: string, startMs: number, endMs: number, stepMs: number, perMs: number): TrafficReport {
    const report: TrafficReport = {
      inference_volume: [],
      concurrent_requests: [],
      response_time_stats: [],
      inference_volume_by_status: [],
      cpu_usage: [],
      cpu_memory_usage_bytes: [],
    };
    const reqs = (this.requests.get(deploymentId) ?? []).filter((r) => r.at >= startMs && r.at <= endMs);
    const res = (this.resources.get(deploymentId) ?? []).filter((r) => r.at >= startMs && r.at <= endMs);
    const rate = (n: number) => (n / stepMs) * perMs;
    for (let t = startMs; t < endMs; t += stepMs) {
      const inBucket = reqs.filter((r) => r.at >= t && r.at < t + stepMs);
      const latencies = inBucket.map((r) => r.latencyMs).sort((a, b) => a - b);
      const count = (lo: number) => inBucket.filter((r) => r.status >= lo && r.status < lo + 100).length;
      report.inference_volume.push({ timestamp: t, value: rate(inBucket.length) });
      report.concurrent_requests.push({ timestamp: t, value: inBucket.reduce((m, r) => Math.max(m, r.concurrent), 0) });
      report.response_time_stats.push({ timestamp: t, p50: quantile(latencies, 0.5), p95: quantile(latencies, 0.95), p99: quantile(latencies, 0.99) });
      report.inference_volume_by_status.push({ timestamp: t, status_2xx: rate(count(200)), status_4xx: rate(count(400)), status_5xx: rate(count(500)) });
      const resInBucket = res.filter((r) => r.at >= t && r.at < t + stepMs);
      if (resInBucket.length) {
        report.cpu_usage.push({ timestamp: t, value: mean(resInBucket.map((r) => r.cpuCores)) });
        report.cpu_memory_usage_bytes.push({ timestamp: t, value: Math.max(...resInBucket.map((r) => r.rssBytes)) });
      }
    }
    return report;
  }

  private sampleResources(deploymentId: string): void {
    const list = this.resources.get(deploymentId);
    const now = this.clock.now();
    if (list?.length && now - list[list.length - 1]!.at < RESOURCE_EVERY_MS) return;
    const wall = Date.now();
    const usage = cpuUsage();
    const elapsedUs = Math.max(1, (wall - this.lastCpu.at) * 1000);
    const cpuCores = (usage.user - this.lastCpu.usage.user + usage.system - this.lastCpu.usage.system) / elapsedUs;
    this.lastCpu = { at: wall, usage };
    push(this.resources, deploymentId, { at: now, cpuCores, rssBytes: memoryUsage.rss() });
  }
}

function push<T>(map: Map<string, T[]>, key: string, value: T): void {
  let list = map.get(key);
  if (!list) {
    list = [];
    map.set(key, list);
  }
  list.push(value);
  if (list.length > MAX_SAMPLES) list.splice(0, list.length - MAX_SAMPLES);
}

function quantile(sorted: number[], q: number): number | null {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!;
}

function mean(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}
