import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser } from 'playwright-core';
import { afterEach, describe, expect, it } from 'vitest';
import { EnginePool } from '../../models/index.js';
import { ManualClock, type RunningServer, type StartOptions } from '../index.js';
import { ARTEFACTS, launchBrowser } from './browser.js';
import { startTestServer } from './helpers.js';

// Checkpoints deployed to inference on the dashboard: the overview's `models` (the deploy answer's fields and URLs,
// Baseten's in proxy mode) and the page's Models view in Debian's chromium.

const MODEL = 'Qwen/Qwen3.5-2B';
const engines = new EnginePool();
let server: RunningServer | undefined;
let browser: Browser | undefined;
let dir: string | undefined;
afterEach(async () => {
  await browser?.close();
  browser = undefined;
  await server?.close();
  server = undefined;
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

async function start(options: StartOptions = {}) {
  server = await startTestServer({ engines, ...options });
  const s = server;
  const call = async (method: string, url: string, body?: unknown) => {
    const res = await s.app.inject({
      method: method as 'GET',
      url,
      headers: { authorization: 'Bearer dashboard-models', ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      payload: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.statusCode, body: res.json() as any };
  };
  const op = async (trainer: string, name: string, body: unknown) => {
    const { operation_id } = (await call('POST', `${trainer}/${name}`, body)).body;
    for (;;) {
      const r = await call('GET', `${trainer}/operations/${operation_id}`);
      if (r.status === 408) continue;
      if (r.body.status !== 'done') throw new Error(JSON.stringify(r.body));
      return r.body.result;
    }
  };
  /** A run's sampler checkpoint `name`, deployed through the control plane: the deploy answer. */
  const deploy = async (name: string, modelName: string) => {
    const session = (await call('POST', '/v1/loops/sessions')).body.session.id;
    const run = (await call('POST', '/v1/loops/runs', { session_id: session, base_model: MODEL, lora_rank: 4, seed: 1 })).body.run;
    await op(`/trainer/${run.id}`, 'save_weights_for_sampler', { name });
    const checkpoint = (await call('GET', `/v1/loops/checkpoints?run_id=${run.id}`)).body.checkpoints.find((c: any) => c.target === 'sampler');
    const deployed = await call('POST', '/v1/loops/checkpoints/deploy', { checkpoint_ids: [checkpoint.id], model_name: modelName });
    expect(deployed.status).toBe(200);
    return deployed.body;
  };
  const models = async () => {
    const res = await call('GET', '/_mock/dashboard/overview');
    expect(res.status).toBe(200);
    return res.body.models as any[];
  };
  return { server: s, call, deploy, models };
}

describe('the dashboard lists checkpoints deployed to inference', () => {
  it('in the overview: the deploy answer with its status over the cold start, until deactivated, and gone once deleted', async () => {
    const clock = new ManualClock();
    const c = await start({ clock, modelColdStartMs: 3000 });
    expect(await c.models()).toEqual([]);
    const d = await c.deploy('step-1', 'support tickets');
    const root = `${c.server.url}/model/${d.model_id}/deployment/${d.deployment_id}/sync`;
    const [row, ...rest] = await c.models();
    expect(rest).toEqual([]);
    expect(row).toEqual({ ...d, instance_type_id: 'H100:1x', created_at: new Date(clock.now()).toISOString() });
    expect(row).toMatchObject({
      model_name: 'support tickets',
      base_model: MODEL,
      status: 'BUILDING',
      checkpoints: [{ checkpoint_id: 'step-1', model: 'step-1' }],
      inference: {
        base_url: `${root}/v1`,
        chat_completions: `${root}/v1/chat/completions`,
        completions: `${root}/v1/completions`,
        models: `${root}/v1/models`,
      },
    });
    const seen = [];
    for (let i = 0; i < 3; i++) {
      clock.advance(1000);
      seen.push((await c.models())[0].status);
    }
    expect(seen).toEqual(['DEPLOYING', 'LOADING_MODEL', 'ACTIVE']);

    // A second deploy comes first (newest first); deactivating one leaves it listed as INACTIVE; deleting it drops it.
    const second = await c.deploy('step-2', 'second');
    expect((await c.models()).map((m) => m.model_id)).toEqual([second.model_id, d.model_id]);
    expect((await c.call('POST', `/v1/models/${d.model_id}/deployments/${d.deployment_id}/deactivate`)).status).toBe(200);
    expect((await c.models()).find((m) => m.model_id === d.model_id).status).toBe('INACTIVE');
    expect((await c.call('DELETE', `/v1/models/${d.model_id}`)).status).toBe(200);
    expect((await c.models()).map((m) => m.model_id)).toEqual([second.model_id]);
  }, 120_000);

  it("in proxy mode with Baseten's inference URLs, as the deploy answered them", async () => {
    dir = mkdtempSync(join(tmpdir(), 'dashboard-models-'));
    const c = await start({ proxy: true, caDir: join(dir, 'ca') });
    const d = await c.deploy('step-1', 'proxied');
    const root = `https://model-${d.model_id}.api.baseten.co/deployment/${d.deployment_id}/sync`;
    const [row] = await c.models();
    expect(row.inference).toEqual({
      base_url: `${root}/v1`,
      chat_completions: `${root}/v1/chat/completions`,
      completions: `${root}/v1/completions`,
      models: `${root}/v1/models`,
    });
    expect(row.inference).toEqual(d.inference);
  }, 120_000);

  it('on the page (chromium): model id, deployment, checkpoint name and chat URL, the status moving without a reload', async () => {
    const clock = new ManualClock();
    const c = await start({ clock, modelColdStartMs: 3000 });
    const d = await c.deploy('step-1', 'support tickets');
    browser = await launchBrowser();
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await page.goto(`${c.server.url}/_mock/ui#/models`);
    const row = page.locator(`#models-table tr[data-model-id="${d.model_id}"]`);
    await row.waitFor();
    expect(await page.locator('nav a[aria-current="page"]').innerText()).toBe('Models');
    const cells = row.locator('td');
    expect(await cells.nth(0).innerText()).toContain(d.model_id);
    expect(await cells.nth(0).innerText()).toContain('support tickets');
    expect(await cells.nth(1).innerText()).toContain(d.deployment_id);
    expect(await cells.nth(2).innerText()).toBe('BUILDING');
    expect(await cells.nth(3).innerText()).toBe(MODEL);
    expect(await row.locator('.checkpoint-model code').allInnerTexts()).toEqual(['step-1']);
    const chat = `${c.server.url}/model/${d.model_id}/deployment/${d.deployment_id}/sync/v1/chat/completions`;
    expect(await row.locator('.url-chat').innerText()).toBe(chat);
    expect(await row.locator('.url-completions').innerText()).toBe(d.inference.completions);
    expect(await row.locator('.url-models').innerText()).toBe(d.inference.models);
    clock.advance(3000);
    await row.locator('td:nth-child(3) .badge.ok', { hasText: 'ACTIVE' }).waitFor();

    // Drawn as text, never markup: a name carrying HTML (the deploy route refuses one; the record is planted) shows literally.
    const planted = '<img src=x onerror="window.__xss=1"><b>bold</b>';
    c.server.core.modelDeployments.everything()[0]!.name = planted;
    await row.locator('td').first().getByText(planted, { exact: true }).waitFor();
    expect(await row.locator('img, b').count()).toBe(0);
    expect(await page.evaluate(() => (window as any).__xss)).toBeUndefined();
    await page.screenshot({ path: join(ARTEFACTS, 'dashboard-models.png'), fullPage: true });
  }, 120_000);
});
