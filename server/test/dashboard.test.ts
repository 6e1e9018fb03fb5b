import { join } from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../../models/data/support-tickets.js';
import { ManualClock, type RunningServer, type StartOptions } from '../index.js';
import { ARTEFACTS, launchBrowser } from './browser.js';
import { http, startTestServer, wireDatum } from './helpers.js';

// The dashboard in a real browser (Debian's chromium through playwright-core):
// what a person debugging a training loop or a version floor would look at.

const MODEL = 'Qwen/Qwen3.5-2B';
const tok = new EnginePool().tokenizers.get(MODEL);
const ticketData = (list: [string, string][]) =>
  list.map(([t, l]) => {
    const d = datum(tok, t, l);
    return wireDatum(d.tokens, d.targetTokens!);
  });
const trainSet = ticketData(TICKETS.slice(0, 4));
const evalSet = ticketData(EVAL_TICKETS.slice(0, 2));
const ce = (data: unknown[]) => ({ data, loss_fn: 'cross_entropy' });
const sampleBody = {
  prompt: { chunks: [{ type: 'encoded_text', tokens: tok.encode(prompt(TICKETS[0]![0])) }] },
  num_samples: 1,
  sampling_params: { max_tokens: 4, temperature: 1, seed: 3 },
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let browser: Browser;
let server: RunningServer | undefined;
let page: Page | undefined;
beforeAll(async () => {
  browser = await launchBrowser();
});
afterAll(async () => {
  await browser?.close();
});
afterEach(async () => {
  await page?.close();
  page = undefined;
  await server?.close();
  server = undefined;
});

async function start(options: StartOptions = {}) {
  server = await startTestServer(options);
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  return { server, page };
}

const shot = (p: Page, name: string) => p.screenshot({ path: join(ARTEFACTS, `dashboard-${name}.png`), fullPage: true });

async function newRun(api: ReturnType<typeof http>) {
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 8, seed: 42, name: 'dash' });
  if (res.status !== 200) throw new Error(JSON.stringify(res.body));
  return { run: res.body.run, trainer: new URL(res.body.run.base_url).pathname, sampler: new URL(res.body.run.sampler.base_url).pathname };
}

/** The guide's campaign round: a baseline eval, two steps, an eval, a checkpoint and a publish. */
async function campaign(api: ReturnType<typeof http>, trainer: string) {
  await api.op(trainer, 'forward', ce(evalSet));
  for (let epoch = 0; epoch < 2; epoch++) {
    await api.op(trainer, 'forward_backward', ce(trainSet));
    await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
  }
  await api.op(trainer, 'forward', ce(evalSet));
  await api.op(trainer, 'save_state', { name: 'final' });
  await api.op(trainer, 'save_weights_for_sampler', { name: 'final' });
}

const count = (p: Page, selector: string) => p.locator(selector).count();

describe('the dashboard after a campaign round over HTTP', () => {
  it('shows the run, one loss point per step, working checkpoint links and the journal, and updates without a reload', async () => {
    const { server, page } = await start();
    const api = http(server.url);
    const { run, trainer } = await newRun(api);
    await campaign(api, trainer);

    await page.goto(`${server.url}/_mock/ui`);
    const row = page.locator(`#runs-table tr[data-run-id="${run.id}"]`);
    await row.waitFor();
    expect(await row.innerText()).toMatch(/ACTIVE/);
    expect(await row.locator('td').nth(4).innerText()).toBe('2');
    await shot(page, 'runs');

    await row.getByRole('link', { name: run.id }).click();
    await page.locator('#loss-chart').waitFor();
    // Train losses: one point per step (steps 0 and 1); evals before and after training (steps 0 and 2).
    const steps = await page.locator('#loss-chart .point-train').evaluateAll((els) => els.map((e) => Number(e.getAttribute('data-step'))));
    expect(steps).toEqual([0, 1]);
    const evals = await page
      .locator('#loss-chart .point-eval')
      .evaluateAll((els) => els.map((e) => [Number(e.getAttribute('data-step')), Number(e.getAttribute('data-value'))]));
    expect(evals.map(([s]) => s)).toEqual([0, 2]);
    expect(evals[1]![1]).toBeLessThan(evals[0]![1]!);
    expect(await count(page, '#grad-chart .point-grad')).toBe(2);
    expect(await page.locator('#lr-chart .point-lr').first().getAttribute('data-value')).toBe('0.001');
    expect(await page.locator('#loss-chart').getAttribute('aria-label')).toMatch(/4 points/);

    // Each checkpoint file's link downloads exactly the bytes the row says it has.
    const links = page.locator('#checkpoints a.download');
    const listed = (await api.call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints;
    let files = 0;
    for (const c of listed) files += (await api.call('GET', `/v1/loops/checkpoints/${c.id}/files`)).body.presigned_urls.length;
    expect(listed).toHaveLength(2);
    expect(await links.count()).toBe(files);
    for (const link of await links.all()) {
      const href = (await link.getAttribute('href'))!;
      const res = await page.request.get(new URL(href, server.url).toString());
      expect(res.status()).toBe(200);
      expect((await res.body()).length).toBe(Number(await link.getAttribute('data-size')));
    }
    const rows = await page.locator('#checkpoints tbody tr').allInnerTexts();
    expect(rows.join('\n')).toMatch(/weights\/final/);
    expect(rows.join('\n')).toMatch(/sampler_weights\/final/);
    expect(await count(page, '#operations tbody tr')).toBe(8);
    await shot(page, 'run');

    // Live: one more step over HTTP appears on the open page.
    await api.op(trainer, 'forward_backward', ce(trainSet));
    await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
    await page.waitForFunction(() => document.querySelectorAll('#loss-chart .point-train').length === 3, undefined, { timeout: 10_000 });

    // The journal: the client's requests, a filter, a request's detail by keyboard.
    await page.getByRole('link', { name: 'Journal' }).click();
    await page.locator('#journal-table tbody tr').first().waitFor();
    const paths = await page.locator('#journal-table tbody tr td:nth-child(5)').allInnerTexts();
    expect(paths).toContain(`${trainer}/forward_backward`);
    expect(paths.some((p) => p.startsWith('/_mock/'))).toBe(false);
    await page.locator('#filter-surface').selectOption('control');
    await page.waitForFunction(
      () => {
        const cells = [...document.querySelectorAll('#journal-table tbody tr td:nth-child(3)')].map((td) => td.textContent);
        return cells.length > 0 && cells.every((c) => c === 'control');
      },
      undefined,
      { timeout: 10_000 },
    );
    const firstRow = page.locator('#journal-table tbody tr').last();
    await firstRow.focus();
    await page.keyboard.press('Enter');
    expect(await page.locator('#journal-detail').innerText()).toMatch(/"surface": "control"/);
    await shot(page, 'journal');
    await page.locator('#filter-surface').selectOption('');
    await page.locator('#filter-status').fill('404');
    await page.waitForFunction(() => document.querySelector('#journal-table tbody')!.children.length === 0, undefined, { timeout: 10_000 });
    await page.locator('#filter-status').fill('40');
    await page.locator('#journal-problem').waitFor();
    expect(await page.locator('#journal-problem').innerText()).toMatch(/Status takes a code \(408\) or a class \(4xx\)/);

    // Its own polling is kept out of the journal it shows.
    expect(server.core.journal.query({}).filter((e) => e.path.startsWith('/_mock/'))).toEqual([]);

    // Read-only without --admin: rules are shown, no control is.
    await page.getByRole('link', { name: 'Faults & scenario' }).click();
    await page.locator('#controls').getByText('Read-only').waitFor();
    expect(await count(page, '#apply-scenario')).toBe(0);
  }, 180_000);
});

describe('the sampler timeline under the lagging-replica scenario', () => {
  it('shows the publication, the 408s a pinned client got, and the replica catching up; controls act with --admin', async () => {
    const { server, page } = await start({ scenario: 'lagging-replica', admin: true });
    const api = http(server.url);
    const { run, trainer, sampler } = await newRun(api);
    await api.op(trainer, 'forward_backward', ce(trainSet));
    await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
    await api.op(trainer, 'save_weights_for_sampler', { name: 'v1' });
    // A pinned client retries after each 408 until replica 0 makes v1 live (1.5 s).
    const statuses: number[] = [];
    for (let i = 0; i < 40 && statuses.at(-1) !== 200; i++) {
      const res = await api.call('POST', `${sampler}/sample`, sampleBody, { 'x-min-policy-version': '1' });
      statuses.push(res.status);
      if (res.status === 408) await sleep(200);
    }
    expect(statuses[0]).toBe(408);
    expect(statuses.at(-1)).toBe(200);
    const timeouts = statuses.filter((s) => s === 408).length;

    await page.goto(`${server.url}/_mock/ui#/sampler/${run.sampler.id}`);
    await page.locator('#timeline').waitFor();
    expect(await count(page, '#timeline .req-408')).toBe(timeouts);
    expect(await count(page, '#timeline .req-ok')).toBe(1);
    expect(await count(page, '#timeline .publication-mark[data-version="1"]')).toBe(1);
    expect(await page.locator('#timeline .replica-line[data-replica="0"]').getAttribute('data-live-version')).toBe('1');
    expect(await count(page, '#sampler-requests tr[data-status="408"]')).toBe(timeouts);
    // Every 408 sits before replica 0's step up to v1, and the served request after it.
    const xs = await page.evaluate(() => {
      const x = (el: Element) => (el as SVGGraphicsElement).getBBox().x + (el as SVGGraphicsElement).getBBox().width / 2;
      const replica0 = document.querySelector('#timeline .replica-line[data-replica="0"]') as SVGPathElement;
      const step = /L([\d.]+),[\d.]+ L\1,/.exec(replica0.getAttribute('d')!)!;
      return {
        refused: [...document.querySelectorAll('#timeline .req-408')].map(x),
        served: x(document.querySelector('#timeline .req-ok')!),
        live: Number(step[1]),
      };
    });
    expect(Math.max(...xs.refused)).toBeLessThanOrEqual(xs.live + 1);
    expect(xs.served).toBeGreaterThanOrEqual(xs.live - 1);
    // Replica 1 lags further (6 s): the page shows it catch up without a reload.
    await page.waitForFunction(
      () => document.querySelector('#timeline .replica-line[data-replica="1"]')?.getAttribute('data-live-version') === '1',
      undefined,
      { timeout: 15_000 },
    );
    await shot(page, 'sampler-timeline');

    // The scenario is shown; a fault rule added from the page acts on the server and is removed from it.
    await page.getByRole('link', { name: 'Faults & scenario' }).click();
    await page.getByText(/lagging-replica at/).waitFor();
    await page.locator('#add-fault').click();
    await page.locator('#faults-table tbody tr').waitFor();
    expect(server.core.faults.list()).toHaveLength(1);
    await shot(page, 'rules');
    const id = server.core.faults.list()[0]!.id;
    await page.getByRole('button', { name: `Remove fault rule ${id}` }).click();
    await page.locator('#faults-table.empty, p#faults-table').waitFor();
    expect(server.core.faults.list()).toHaveLength(0);
    await page.locator('#fault-json').fill('{"action": {"type": "teleport"}}');
    await page.locator('#add-fault').click();
    await page.locator('#control-result .error-box').waitFor();
    expect(await page.locator('#control-result').innerText()).toMatch(/refused \(400\).*action\.type/s);
  }, 180_000);
});

describe('the controls with --admin and a virtual clock', () => {
  it('releases a held operation and moves the clock from the page', async () => {
    const clock = new ManualClock();
    const { server, page } = await start({ admin: true, clock });
    const api = http(server.url);
    const { trainer } = await newRun(api);
    server.core.progress.add({ mode: 'manual', match: { op: 'optim_step' } });
    const held = (await api.call('POST', `${trainer}/optim_step`, { adam_params: { learning_rate: 1e-3 } })).body.operation_id;
    await page.goto(`${server.url}/_mock/ui#/rules`);
    await page.getByRole('button', { name: `Release ${held}` }).click();
    await page.locator('#held-table.empty, p#held-table').waitFor();
    expect(server.core.operations.held()).toEqual([]);
    const before = clock.now();
    await page.locator('#clock-ms').fill('60000');
    await page.locator('#advance-clock').click();
    await page
      .locator('#control-result')
      .getByText(/Advance the clock 60000 ms: done/)
      .waitFor();
    expect(clock.now() - before).toBe(60_000);
    expect(await page.locator('#server-facts').innerText()).toMatch(/clock virtual/);
  }, 60_000);
});

describe('the dashboard with --api-key', () => {
  it('refuses without the admin token, signs in with it, and never shows an API key', async () => {
    const { server, page } = await start({ apiKeys: [{ key: 'sk-dashboard-secret-1' }], admin: true, adminToken: 'sesame' });
    const api = http(server.url, 'sk-dashboard-secret-1');
    const { run } = await newRun(api);

    expect((await fetch(`${server.url}/_mock/dashboard/overview`)).status).toBe(401);
    await page.goto(`${server.url}/_mock/ui`);
    await page.locator('#login').waitFor();
    expect(await page.locator('#refusal').innerText()).toMatch(/admin token/);
    expect(await count(page, '#runs-table')).toBe(0);
    await shot(page, 'sign-in');

    await page.locator('#admin-token').fill('open sesame');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('#login-problem').waitFor();
    expect(await page.locator('#login-problem').innerText()).toMatch(/not the admin token/);

    await page.locator('#admin-token').fill('sesame');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator(`#runs-table tr[data-run-id="${run.id}"]`).waitFor();
    expect(await page.content()).not.toContain('sk-dashboard-secret-1');
    // The cookie works the admin API's controls too.
    await page.getByRole('link', { name: 'Faults & scenario' }).click();
    await page.locator('#apply-scenario').click();
    await page.locator('#control-result').getByText(/done/).waitFor();
    expect(server.core.history.scenario?.name).toBeTruthy();
  }, 120_000);

  it('with --api-key and no --admin-token, refuses everyone and says what to start it with', async () => {
    const { server, page } = await start({ apiKeys: [{ key: 'k1' }] });
    const res = await fetch(`${server.url}/_mock/dashboard/overview`, { headers: { authorization: 'Bearer k1' } });
    expect(res.status).toBe(403);
    await page.goto(`${server.url}/_mock/ui`);
    await page.locator('#refusal').waitFor();
    expect(await page.locator('#refusal').innerText()).toMatch(/--admin-token/);
    expect(await count(page, '#login')).toBe(0);
  }, 60_000);
});
