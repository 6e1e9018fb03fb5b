import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { fuzzCase, judge, routesOf, type FuzzContext } from '../fuzz.js';
import { errorShapeProblem } from '../http.js';
import { parseAnswers } from '../malformed-http.js';
import { failuresOf, runSoak, targetsOf } from '../suite.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('the reliability suite (reduced: npm run soak runs it whole)', () => {
  it('finds no 5xx, misshapen error, hang, lost checkpoint or client error', async () => {
    // The damaged-machine cases run reduced in their own files (corrupt-state, disk-full, proxy-stress).
    const report = await runSoak({
      root,
      seed: 'npm-test',
      cases: 1000,
      rawCases: 200,
      kills: 3,
      waves: [10],
      machineCases: false,
      proxyNames: 0,
      proxyAborted: 0,
    });
    const missed = targetsOf(report).filter((r) => !r.met);
    const failures = failuresOf(report);
    expect({ missed, failures }).toEqual({ missed: [], failures: [] });
    // The cases reach past validation: valid requests the server carried out, in every family.
    expect(report.fuzz.byStatus['200']).toBeGreaterThan(150);
    for (const family of ['control', 'team', 'generic', 'trainer', 'sampler', 'hub', 'admin', 'dashboard', 'stray'])
      expect(report.fuzz.byFamily[family], family).toBeGreaterThan(0);
    // Each life saves at least once before its kill (the kill waits for it).
    expect(report.kills.acknowledged).toBeGreaterThanOrEqual(3);
  }, 300_000);
});

describe('its checks', () => {
  const answer = (status: number, text: string, headers: Record<string, string> = { 'x-loops-mock-version': '0', 'content-type': 'application/json' }) => ({
    kind: 'answer' as const,
    answer: { status, headers, text },
  });
  const ok = '{"error":{"type":"invalid_request","message":"m"}}';
  const c = { i: 0, kind: 'unknown-field', method: 'POST', path: '/x', family: 'control', headers: {}, expect4xx: true };

  it('count a 5xx, a wrong shape, a missing version header, a hang, a reset and accepted invalid input', () => {
    expect(judge(c, answer(500, ok))?.figure).toBe('fiveXx');
    expect(judge(c, answer(400, '{"statusCode":400,"error":"Bad Request"}'))?.figure).toBe('wrongShape');
    expect(judge(c, answer(400, ok, { 'content-type': 'application/json' }))?.figure).toBe('wrongShape');
    expect(judge(c, answer(404, 'not found', { 'x-loops-mock-version': '0', 'content-type': 'text/plain' }))?.figure).toBe('wrongShape');
    expect(judge(c, { kind: 'hang' })?.figure).toBe('hangs');
    expect(judge(c, { kind: 'transport', message: 'socket hang up' })?.figure).toBe('transport');
    expect(judge(c, answer(200, '{}'))?.figure).toBe('invalidAccepted');
    expect(judge({ ...c, expect4xx: false }, answer(200, '{}'))).toBeNull();
    expect(judge(c, answer(400, ok))).toBeNull();
    expect(errorShapeProblem(408, { 'x-loops-mock-version': '0', 'content-type': 'application/json' }, ok)).toBeNull();
    // Baseten's edge shape, a string error, only on a deployed checkpoint's inference door.
    const edge = '{"error":"Model abcd1234 not found."}';
    expect(judge({ ...c, path: '/model/abcd1234/deployment/x/sync/v1/models' }, answer(404, edge))).toBeNull();
    expect(judge(c, answer(404, edge))?.figure).toBe('wrongShape');
    expect(judge({ ...c, path: '/model/abcd1234/deployment/x/sync/v1/models' }, answer(404, '{"error":""}'))?.figure).toBe('wrongShape');
  });

  it('read every answer of a pipelined exchange, sized or chunked', () => {
    const bytes = Buffer.from(
      'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{"a\r\n3\r\n":1\r\n1\r\n}\r\n0\r\n\r\n',
    );
    expect(parseAnswers(bytes)).toEqual([
      { status: 200, headers: { 'content-length': '2' }, body: '{}' },
      { status: 400, headers: { 'transfer-encoding': 'chunked' }, body: '{"a":1}' },
    ]);
  });

  it('make the same case from the same seed, and mutations the protocol makes a 4xx', () => {
    const openapi = {
      paths: {
        '/trainer/{run_id}/forward': {
          post: {
            requestBody: {
              content: {
                'application/json': {
                  schema: {
                    type: 'object',
                    required: ['data', 'loss_fn'],
                    properties: { data: { type: 'array' }, loss_fn: { type: 'string' } },
                    additionalProperties: false,
                  },
                },
              },
            },
          },
        },
      },
    };
    const routes = routesOf(openapi);
    const ctx = { run: 'r1' } as FuzzContext;
    const make = (i: number) => fuzzCase(i, 's', routes, ctx, { authorization: 'Bearer k' }, {});
    expect(make(7)).toEqual(make(7));
    const cases = Array.from({ length: 400 }, (_, i) => make(i));
    const byKind = (k: string) => cases.filter((x) => x.kind === k);
    for (const k of ['unknown-field', 'missing-required', 'non-finite', 'bad-json']) {
      expect(byKind(k).length, k).toBeGreaterThan(0);
      expect(
        byKind(k).every((x) => x.expect4xx),
        k,
      ).toBe(true);
    }
    expect(byKind('non-finite').every((x) => /1e400|1E\+309/i.test(x.body!))).toBe(true);
    expect(byKind('unknown-field').every((x) => JSON.parse(x.body!).zz_unknown === 1)).toBe(true);
    expect(cases.filter((x) => x.kind !== 'stray').every((x) => x.path.startsWith('/trainer/'))).toBe(true);
  });
});
