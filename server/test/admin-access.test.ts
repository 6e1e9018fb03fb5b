import { describe, expect, it } from 'vitest';
import { adminServerPerTest } from './admin-helpers.js';
import { startTestServer } from './helpers.js';

const servers = adminServerPerTest();
const start = servers.start;

describe('admin API access', () => {
  it('is absent without --admin, and needs the token when --admin-token is set', async () => {
    servers.keep(await startTestServer());
    expect((await fetch(`${servers.current.url}/_mock/journal`)).status).toBe(404);
    await servers.current.close();
    const { admin } = await start({ adminToken: 'sesame' });
    expect((await fetch(`${servers.current.url}/_mock/journal`)).status).toBe(401);
    expect((await fetch(`${servers.current.url}/_mock/journal`, { headers: { authorization: 'Bearer wrong' } })).status).toBe(401);
    expect((await admin.journal()).entries.length).toBeGreaterThan(0);
    const doc = await (await fetch(`${servers.current.url}/openapi.json`)).json();
    expect(Object.keys(doc.paths)).toContain('/_mock/faults/{fault_id}');
  });
});

describe('admin input that once broke the server', () => {
  it('refuses, before installing anything, a fault body nested 5,000 (or 40) deep, header names with spaces and values with CR/LF', async () => {
    const { api, admin } = await start();
    // Written as text: building it as an object would test this test's own stack.
    const deep = `{"action":{"type":"respond","status":503,"body":${'{"d":'.repeat(5000)}"bottom"${'}'.repeat(5000)}}}`;
    const bad: [unknown, string, RegExp][] = [
      [deep, 'body', /nests deeper than 64 levels/],
      [`{"action":{"type":"respond","status":503,"body":${'{"d":'.repeat(40)}1${'}'.repeat(40)}}}`, 'action.body', /nests more than 32 levels deep/],
      [{ action: { type: 'respond', status: 503, headers: { 'Bad Name': 'x' } } }, 'action.headers.Bad Name', /not an HTTP header name/],
      [{ action: { type: 'respond', status: 503, headers: { 'X-Ok': 'a\r\nSet-Cookie: y' } } }, 'action.headers.X-Ok', /CR, LF or NUL/],
      [{ match: { headers: { 'has space': 'v' } }, action: { type: 'respond', status: 503 } }, 'match.headers.has space', /not an HTTP header name/],
    ];
    for (const [rule, field, message] of bad) {
      const res = await fetch(`${servers.current.url}/_mock/faults`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: typeof rule === 'string' ? rule : JSON.stringify(rule),
      });
      const body = (await res.json()) as { error: { field: string; message: string } };
      expect([res.status, body.error.field], field).toEqual([400, field]);
      expect(body.error.message).toMatch(message);
    }
    expect(await admin.faults()).toEqual([]);
    expect((await api.call('GET', '/v1/loops/capabilities')).status).toBe(200);
  });

  it('refuses a YAML alias bomb with a 400', async () => {
    await start();
    const bomb = [
      'a: &a ["x","x","x","x","x","x","x","x","x","x"]',
      ...Array.from(
        { length: 8 },
        (_, i) =>
          `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [${Array(10)
            .fill(`*${String.fromCharCode(97 + i)}`)
            .join(',')}]`,
      ),
    ].join('\n');
    const res = await fetch(`${servers.current.url}/_mock/scenario`, { method: 'POST', headers: { 'content-type': 'application/yaml' }, body: bomb });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(/alias/i);
  });

  it('journals and never faults /%5Fmock/... as what it is: the admin API', async () => {
    const { api, admin } = await start();
    await admin.addFault({ action: { type: 'respond', status: 503 } });
    const encoded = await fetch(`${servers.current.url}/%5Fmock/faults`);
    expect(encoded.status).toBe(200);
    expect((await api.call('GET', '/v1/loops/capabilities')).status).toBe(503);
    const entry = servers.current.core.journal.query({}).find((e) => e.path === '/%5Fmock/faults')!;
    expect(entry.surface).toBe('admin');
    expect(entry.fault).toBeUndefined();
  });
});
