import { randomUUID } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { diffShapes, fill, pointer, shapeOf, type Fixture } from '../server/record/fixture-format.js';

export interface ReplayTarget {
  /** The control plane URL of the endpoint (loops-mock, or the real service). */
  server: string;
  key: string;
}

export interface ReplayResult {
  flow: string;
  exchanges: number;
  /** Each difference in status, field names or types, naming the exchange. */
  differences: string[];
}

/** The sdk-fixtures folder of this package, from the source tree or from dist/. */
export function defaultFixturesDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 4; i++) {
    const candidate = join(dir, 'sdk-fixtures');
    if (existsSync(candidate) && readdirSync(candidate).some((f) => f.endsWith('.json'))) return candidate;
    dir = dirname(dir);
  }
  throw new Error('no sdk-fixtures folder found beside this package; pass --fixtures DIR');
}

/** Reads every flow in a folder of sdk-fixtures. */
export function readFixtures(dir: string): Fixture[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => JSON.parse(readFileSync(join(dir, f), 'utf8')) as Fixture);
}

/**
 * Replays a flow against an endpoint: placeholders filled from earlier answers,
 * fresh Idempotency-Keys, long polls repeated while they answer 408; every
 * answer's status and shape compared with the fixture.
 */
export async function replayFixture(fixture: Fixture, target: ReplayTarget): Promise<ReplayResult> {
  const base = target.server.replace(/\/+$/, '');
  const vars = new Map<string, string>();
  const keys = new Map<string, string>();
  const fresh = (name: string) => {
    if (!keys.has(name)) keys.set(name, randomUUID().replace(/-/g, ''));
    return keys.get(name)!;
  };
  const differences: string[] = [];
  for (const [i, ex] of fixture.exchanges.entries()) {
    const req = fill(ex.request, vars, fresh);
    const url = req.url.startsWith('/') ? `${base}${req.url}` : req.url;
    const label = `#${i + 1} ${req.method} ${ex.request.url}`;
    if (/\{[A-Za-z0-9_]+\}/.test(url)) {
      differences.push(`${label}: a placeholder was never captured (${url.match(/\{[A-Za-z0-9_]+\}/)![0]})`);
      continue;
    }
    const headers: Record<string, string> = { authorization: `Bearer ${target.key}`, ...(req.headers ?? {}) };
    if (req.body !== undefined) headers['content-type'] = 'application/json';
    let res: Response | undefined;
    for (let attempt = 0; attempt < 200; attempt++) {
      try {
        res = await fetch(url, { method: req.method, headers, body: req.body === undefined ? undefined : JSON.stringify(req.body) });
      } catch (err) {
        differences.push(`${label}: no answer (${(err as Error).message})`);
        break;
      }
      if (!(ex.poll && res.status === 408)) break;
      await res.arrayBuffer();
    }
    if (!res) continue;
    const type = res.headers.get('content-type') ?? '';
    let body: unknown = null;
    if (type.includes('json')) {
      const text = await res.text();
      try {
        body = text ? JSON.parse(text) : null;
      } catch {
        body = text;
      }
    } else {
      await res.arrayBuffer();
    }
    if (res.status !== ex.response.status) differences.push(`${label}: status ${res.status}, the fixture has ${ex.response.status}`);
    const actual = type.includes('json') ? shapeOf(body) : 'binary';
    for (const d of diffShapes(ex.response.shape, actual)) differences.push(`${label}: ${d}`);
    for (const [name, ptr] of Object.entries(ex.capture ?? {})) {
      const v = pointer(body, ptr);
      if (typeof v === 'string') vars.set(name, v);
      else differences.push(`${label}: nothing to capture as {${name}} at ${ptr}`);
    }
  }
  return { flow: fixture.name, exchanges: fixture.exchanges.length, differences };
}
