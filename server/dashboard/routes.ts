import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Type from 'typebox';
import type { ModelViews } from '../control/models.js';
import type { Views } from '../control/views.js';
import { ADMIN_COOKIE, type AdminTokenGate } from '../http/auth.js';
import { checkpointPath } from '../core/checkpoints.js';
import { ManualClock } from '../core/clock.js';
import type { LoopsCore } from '../core/core.js';
import { LoopsError, notFound } from '../core/errors.js';
import type { JournalEntry, Surface } from '../core/journal.js';
import type { ModelDeploymentRecord, Principal, RunRecord, SamplerRecord } from '../core/records.js';
import { VERSION } from '../version.js';
import { JournalFilter, JournalPage, Overview, RunDetail, SamplerTimeline } from './schemas.js';

export interface DashboardOptions {
  /** The admin API is served (--admin): the page shows its controls. */
  admin: boolean;
  /** The admin token's check (--admin-token), shared with the admin API: wrong tokens are limited per address. */
  gate?: AdminTokenGate;
  views: Views;
  /** The deploy answer's view: the deployed models' rows carry its fields and inference URLs. */
  models: ModelViews;
}

/**
 * The page's files: beside this module in the sources; built (dist/server/dashboard, or the command's bundle in
 * dist/bundle), at server/dashboard/assets under the package root, the nearest folder above that has them.
 */
function assetsDir(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [join(here, 'assets')];
  for (let dir = here, up = 0; up < 4; up++) {
    dir = dirname(dir);
    candidates.push(join(dir, 'server', 'dashboard', 'assets'));
  }
  const found = candidates.find((d) => existsSync(join(d, 'index.html')));
  if (!found) throw new Error(`the dashboard's files are missing (looked in ${candidates.join(', ')})`);
  return found;
}

/** The page's files by how their names end: index.html, style.css, and its ES modules (app.js and what it imports). */
const ASSET_TYPES: Record<string, string> = { '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8', '.html': 'text/html; charset=utf-8' };
const assetType = (name: string) => ASSET_TYPES[extname(name)];

/**
 * The live dashboard at /_mock/ui and its read-only data under
 * /_mock/dashboard/ (docs/dashboard.md): runs, a run's losses, operations
 * and checkpoints, a sampler's publications and replicas over time with the
 * requests that met them, checkpoints deployed to inference, the journal,
 * and the rules. Open in a default
 * start; with --api-key it needs the admin token (header, or the login
 * form's cookie), and without one it is refused. Controls call the admin API
 * and exist only with --admin.
 */
export function dashboardRoutes(appIn: FastifyInstance, core: LoopsCore, options: DashboardOptions): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['dashboard'];
  const dir = assetsDir();
  // Every module beside index.html is served, so a view split into its own file needs no list kept here.
  const files = new Map(
    readdirSync(dir)
      .filter((name) => assetType(name) !== undefined)
      .map((name) => [name, readFileSync(join(dir, name))]),
  );

  /** With keys enforced, the dashboard is the admin's: the token, or nothing. */
  const guard = async (request: FastifyRequest) => {
    if (!core.accounts.enforced) return;
    if (options.gate === undefined) {
      throw new LoopsError('forbidden', 'With --api-key the dashboard needs an admin token: start loops-mock with --admin-token TOKEN, then sign in with it.', {
        login: '/_mock/ui',
      });
    }
    if (!options.gate.admits(request)) {
      throw new LoopsError(
        'unauthorized',
        "The dashboard needs the server's admin token: sign in at /_mock/ui, or send 'Authorization: Bearer <admin token>'.",
        { login: '/_mock/ui' },
      );
    }
  };

  // The page itself holds nothing: it signs in, then reads the data routes below.
  app.get('/_mock/ui', { schema: { hide: true } as object }, (_req, reply) => reply.type(assetType('index.html')!).send(files.get('index.html')));
  app.get('/_mock/ui/:file', { schema: { hide: true } as object }, (req, reply) => {
    const name = (req.params as { file: string }).file;
    const body = files.get(name);
    if (!body || name === 'index.html') throw notFound(`The dashboard has no file '${name}'.`);
    return reply.type(assetType(name)!).header('cache-control', 'no-cache').send(body);
  });

  app.post(
    '/_mock/ui/login',
    {
      schema: {
        tags,
        summary: 'Signs the dashboard in with the admin token: sets its cookie',
        body: Type.Object({ token: Type.String({ minLength: 1 }) }, { additionalProperties: false }),
      },
    },
    (req, reply) => {
      if (options.gate === undefined || !options.gate.accepts(req, req.body.token)) {
        throw new LoopsError(
          'unauthorized',
          options.gate === undefined ? 'This server has no admin token to sign in with (start it with --admin-token).' : 'That is not the admin token.',
          { field: 'token' },
        );
      }
      reply.header('set-cookie', `${ADMIN_COOKIE}=${encodeURIComponent(req.body.token)}; Path=/_mock; HttpOnly; SameSite=Strict`);
      return { signed_in: true };
    },
  );

  app.register(async (data) => {
    data.addHook('onRequest', guard);
    const typed = data.withTypeProvider<TypeBoxTypeProvider>();

    typed.get(
      '/_mock/dashboard/overview',
      {
        schema: {
          tags,
          summary: 'Everything at a glance: runs, samplers and their replicas, checkpoints deployed to inference, rules, scenario, clock',
          response: { 200: Overview },
        },
      },
      (req) => {
        const { runs, samplers } = core.fleet.everything();
        return {
          version: VERSION,
          admin: options.admin,
          token_needed: options.gate !== undefined,
          signed_in: options.gate?.carries(req) ?? false,
          clock: { mode: core.clock instanceof ManualClock ? ('virtual' as const) : ('real' as const), now: new Date(core.clock.now()).toISOString() },
          scenario: core.history.scenario && { ...core.history.scenario, applied_at: new Date(core.history.scenario.applied_at).toISOString() },
          runs: runs.map((r) => runSummary(r)),
          samplers: samplers.map((s) => samplerSummary(s)),
          models: core.modelDeployments.everything().map((m) => modelSummary(m)),
          faults: core.faults.list(),
          progress: core.progress.list(),
          held: core.operations.held(),
        };
      },
    );

    typed.get(
      '/_mock/dashboard/runs/:run_id',
      {
        schema: {
          tags,
          summary: 'A run: its operations over time (losses, grad norm, learning rate), checkpoints with download links',
          params: Type.Object({ run_id: Type.String() }),
          response: { 200: RunDetail },
        },
      },
      (req) => {
        const run = core.fleet.findRun(req.params.run_id);
        if (!run) throw notFound(`No run '${req.params.run_id}' on this server.`, { field: 'run_id' });
        const owner = ownerOf(run);
        const checkpoints = core.checkpoints.list(owner, { run_id: run.id }).map((c) => ({
          ...options.views.checkpoint(c),
          name: c.name,
          // The bt:// path a client loads it by: checkpoint_id is the bare name, shared by a run's trainer and sampler checkpoints of one name.
          path: checkpointPath(c),
          // href: the same presigned download on this server, whatever host the API's url names (proxy mode names Baseten's).
          files: core.checkpoints.files(owner, c.id, 1000, 0).files.map((f) => ({ ...options.views.checkpointFile(f), href: f.path })),
        }));
        return { run: { ...runSummary(run), view: options.views.run(run) }, operations: core.history.ofRun(run.id).map(withTimes), checkpoints };
      },
    );

    typed.get(
      '/_mock/dashboard/samplers/:sampler_id',
      {
        schema: {
          tags,
          summary: "A sampler's timeline: publications, each replica's live version, and the requests that met them (with their floors and 408s)",
          params: Type.Object({ sampler_id: Type.String() }),
          response: { 200: SamplerTimeline },
        },
      },
      (req) => {
        const s = core.fleet.findSampler(req.params.sampler_id);
        if (!s) throw notFound(`No sampler '${req.params.sampler_id}' on this server.`, { field: 'sampler_id' });
        const requests = core.journal
          .query({ surface: 'sampler', sampler_id: s.id })
          .filter((e) => e.op === 'sample' || e.op === 'compute_logprobs' || e.op === 'completions')
          .map((e) => ({
            seq: e.seq,
            time: e.time,
            op: e.op!,
            status: e.status,
            floor: e.headers.min_policy_version === undefined ? null : Number(e.headers.min_policy_version),
            policy_version: e.response?.policy_version ?? null,
            retry_after: e.response?.retry_after ?? null,
          }));
        return {
          sampler: samplerSummary(s),
          created_at: new Date(s.created_at).toISOString(),
          events: core.history.ofSampler(s.id).map((e) => ({ ...e, at: new Date(e.at).toISOString() })),
          requests,
          now: new Date(core.clock.now()).toISOString(),
        };
      },
    );

    typed.get(
      '/_mock/dashboard/journal',
      {
        schema: {
          tags,
          summary: 'The journal, filtered, from a cursor: entries after `since`',
          querystring: JournalFilter,
          response: { 200: JournalPage },
        },
      },
      (req) => {
        const { since, limit = 200, surface, run_id, status, q } = req.query;
        const matches = (e: JournalEntry) =>
          (!status || (status.endsWith('xx') ? String(e.status)[0] === status[0] : String(e.status) === status)) &&
          (!q || JSON.stringify(e).toLowerCase().includes(q.toLowerCase()));
        const all = core.journal.query({ since, surface: surface as Surface | undefined, run_id }).filter(matches);
        const entries = all.slice(-limit);
        return { entries, next_since: all.at(-1)?.seq ?? since ?? 0, evicted: core.journal.evicted };
      },
    );
  });

  const ownerOf = (r: RunRecord): Principal => ({ org_id: r.org_id, user_id: r.user_id, team_id: r.team_id, email: core.accounts.emailOf(r.user_id) ?? '' });
  const runSummary = (r: RunRecord) => ({
    id: r.id,
    name: r.name,
    base_model: r.base_model,
    lora_rank: r.lora_rank,
    status: r.status,
    inactive_reason: r.inactive_reason,
    policy_version: core.trainers.policyVersion(r),
    session_id: r.session_id,
    sampler_id: r.sampler_id,
    created_at: new Date(r.created_at).toISOString(),
    deactivated_at: deactivatedAt(r),
  });
  const deactivatedAt = (r: RunRecord) => {
    if (r.status === 'ACTIVE') return null;
    const line = core.logs.query({ deploymentId: r.deployment_id, direction: 'desc', limit: 200 }).find((l) => l.message.startsWith(`Run ${r.id} INACTIVE`));
    return line ? new Date(line.ts_ms).toISOString() : null;
  };
  const samplerSummary = (s: SamplerRecord) => ({
    id: s.id,
    base_model: s.base_model,
    status: s.status,
    run_id: s.run_id,
    model_id: s.model_id,
    replicas: core.replicas.replicaStates(s),
    published_version: core.replicas.publishedVersion(s),
  });
  // The deploy answer's own fields and URLs (proxy mode: Baseten's), so the page shows what a client was told.
  const modelSummary = (m: ModelDeploymentRecord) => ({
    ...options.models.deployed(m),
    instance_type_id: m.instance_type_id,
    created_at: new Date(m.created_at).toISOString(),
  });
  const withTimes = (e: ReturnType<LoopsCore['history']['ofRun']>[number]) => ({
    ...e,
    submitted_at: new Date(e.submitted_at).toISOString(),
    finished_at: new Date(e.finished_at).toISOString(),
  });
}
