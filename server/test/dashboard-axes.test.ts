import type { Browser, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Operation } from '../core/operations.js';
import type { RunningServer } from '../index.js';
import { launchBrowser } from './browser.js';
import { http, startTestServer, wireDatum } from './helpers.js';

// The dashboard in Debian's chromium (as dashboard.test.ts): a deactivated run's policy version, and axis
// labels that tell apart values differing only in their fourth digit.

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

async function newRun(api: ReturnType<typeof http>) {
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: 'Qwen/Qwen3.5-2B', lora_rank: 4, seed: 7 });
  if (res.status !== 200) throw new Error(JSON.stringify(res.body));
  return res.body.run;
}

describe('the dashboard', () => {
  it('shows the policy version a run reached after it is deactivated, in the runs table and on its page', async () => {
    server = await startTestServer();
    page = await browser.newPage();
    const api = http(server.url);
    const run = await newRun(api);
    const trainer = new URL(run.base_url).pathname;
    const data = [wireDatum([11, 12, 13, 14], [12, 13, 14, 15])];
    for (let i = 0; i < 3; i++) {
      await api.op(trainer, 'forward_backward', { data, loss_fn: 'cross_entropy' });
      await api.op(trainer, 'optim_step', { adam_params: { learning_rate: 1e-3 } });
    }
    expect((await api.call('POST', `/v1/loops/runs/${run.id}/deactivate`)).status).toBe(200);

    await page.goto(`${server.url}/_mock/ui#/runs`);
    const row = page.locator(`#runs-table tr[data-run-id="${run.id}"]`);
    await row.waitFor();
    expect(await row.innerText()).toMatch(/INACTIVE/);
    expect(await row.locator('td').nth(4).innerText()).toBe('3');
    await page.goto(`${server.url}/_mock/ui#/run/${run.id}`);
    await page.locator('#grad-chart').waitFor();
    expect(await page.locator('dt:text-is("Policy version") + dd').innerText()).toBe('3');
  });

  it('labels every tick of the grad-norm axis differently when the norms differ in the fourth digit', async () => {
    server = await startTestServer();
    page = await browser.newPage();
    const run = await newRun(http(server.url));
    // Three optim_steps whose norms differ past the third significant digit, as the history records them.
    [14.2961, 14.3003, 14.3042].forEach((grad_norm, i) => {
      server!.core.history.operationFinished({
        id: `op-${i}`,
        runId: run.id,
        op: 'optim_step',
        status: 'done',
        submittedAt: 0,
        finishedAt: 1,
        result: { policy_version: i + 1, metrics: { grad_norm, learning_rate: 1e-4 } },
      } as Operation);
    });

    await page.goto(`${server.url}/_mock/ui#/run/${run.id}`);
    await page.locator('#grad-chart .tick-y').first().waitFor();
    const labels = await page.locator('#grad-chart .tick-y').allTextContents();
    expect(labels).toEqual(['14.296', '14.298', '14.300', '14.302', '14.304', '14.306']);
    // A flat learning rate and the integer step axis stay short and distinct too.
    const lr = await page.locator('#lr-chart .tick-y').allTextContents();
    expect(new Set(lr).size).toBe(lr.length);
    expect(lr.every((l) => l.length <= 8)).toBe(true);
    expect(await page.locator('#grad-chart .tick-x').allTextContents()).toEqual(['1', '2', '3']);
  });
});
