import { afterEach, describe, expect, it } from 'vitest';
import { FULL_ENTRY_LIMIT_CHARS, FULL_JOURNAL_BUDGET_CHARS, Journal, type JournalEntry } from '../core/journal.js';
import type { RunningServer } from '../index.js';
import { http, startTestServer } from './helpers.js';

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

const entry = (seq: number, body: unknown): JournalEntry => ({
  seq,
  time: '',
  surface: 'control',
  method: 'POST',
  path: '/x',
  route: '/x',
  status: 200,
  latency_ms: 1,
  headers: { auth: 'bearer' },
  body,
  response_body: { ok: true },
});

// Issue 31 item 16: with --journal-detail full, each GET /_mock/journal answer was journaled whole, so the
// journal grew ~3x a read until the route answered 500.
describe('the journal stays bounded in full detail', () => {
  it("never keeps the journal's own answers: reading it twenty-five times costs the same each time", async () => {
    server = await startTestServer({ admin: true, journalDetail: 'full' });
    // Over real HTTP: the journal records a request when its connection is done with it.
    const api = http(server.url);
    const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
    expect((await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4 })).status).toBe(200);
    const sizes: number[] = [];
    for (let i = 0; i < 25; i++) {
      const res = await api.call('GET', '/_mock/journal');
      expect(res.status).toBe(200);
      sizes.push(JSON.stringify(res.body).length);
    }
    await new Promise((r) => setTimeout(r, 50));
    const reads = server.core.journal.query({ surface: 'admin' }).filter((e) => e.route === '/_mock/journal');
    expect(reads).toHaveLength(25);
    for (const e of reads) expect(e.response_body).toBeUndefined();
    // Each read adds one small entry: the 25th answer is not thousands of times the first.
    expect(sizes.at(-1)!).toBeLessThan(sizes[0]! + 25 * 1000);
    // Other answers keep their whole body.
    expect(server.core.journal.query({ surface: 'control' }).find((e) => e.path === '/v1/loops/runs')!.response_body).toMatchObject({
      run: { base_model: 'Qwen/Qwen3.5-2B' },
    });
  });

  it('summarises an entry over the per-entry limit and lets the oldest go beyond the budget', () => {
    const journal = new Journal(10_000, undefined, 'full');
    const big = { data: Array.from({ length: 300_000 }, (_, i) => i) };
    journal.record(entry(1, big));
    const [kept] = journal.query({});
    expect(JSON.stringify(kept).length).toBeLessThan(FULL_ENTRY_LIMIT_CHARS);
    expect((kept!.body as { data: unknown[] }).data.at(-1)).toMatch(/\+299992 items/);

    const almostMegabyte = 'x'.repeat(FULL_ENTRY_LIMIT_CHARS - 1000);
    const n = Math.ceil(FULL_JOURNAL_BUDGET_CHARS / almostMegabyte.length) + 10;
    for (let seq = 2; seq < 2 + n; seq++) journal.record(entry(seq, { name: almostMegabyte }));
    const entries = journal.query({});
    const total = entries.reduce((sum, e) => sum + JSON.stringify(e).length, 0);
    expect(total).toBeLessThanOrEqual(FULL_JOURNAL_BUDGET_CHARS);
    expect(entries.at(-1)!.seq).toBe(1 + n);
    expect(journal.evicted).toBe(1 + n - entries.length);
    expect(entries[0]!.body).toEqual({ name: almostMegabyte });
  });
});
