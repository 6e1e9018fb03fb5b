import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Type from 'typebox';
import { ManualClock } from '../core/clock.js';
import type { LoopsCore } from '../core/core.js';
import { conflict, LoopsError, notFound } from '../core/errors.js';
import type { AdminTokenGate } from '../http/auth.js';
import { crossSiteRefusal } from '../http/cross-site.js';
import { applySettings, settingsToWire } from '../core/settings.js';
import { applyScenario, parseScenario, readScenarioSource, shippedScenarioNames } from './scenario.js';
import {
  ClockAdvance,
  ClockState,
  FaultRule,
  FaultRuleInput as FaultRuleBody,
  JournalQuery,
  ProgressRule,
  ProgressRuleInput as ProgressRuleBody,
  ReplicaPatch,
  ReplicaState,
  SamplerPatch,
  SamplerState,
  ScenarioRequest,
  SettingsPatch,
} from './schemas.js';

export interface AdminOptions {
  /** With --admin-token: every admin request needs `Authorization: Bearer <token>` (or the dashboard's cookie). */
  gate?: AdminTokenGate;
}

const Removed = Type.Object({ removed: Type.Integer() });
const ScenarioApplied = Type.Object({ name: Type.Union([Type.String(), Type.Null()]), faults: Type.Integer(), progress: Type.Integer() });

interface RuleSet<I, R> {
  list(): R[];
  add(input: I): R;
  remove(id: string): R;
  clear(): number;
}

/** GET, POST, DELETE one and DELETE all of a rule set at /_mock/<name>; `rules` is read per request (reset rebuilds it). */
function ruleSetRoutes<I, R>(
  app: FastifyInstance,
  set: { name: string; idParam: string; rules: () => RuleSet<I, R>; input: object; rule: object; summaries: [string, string, string, string] },
): void {
  const tags = ['admin'];
  const [listing, adding, removing, clearing] = set.summaries;
  app.get(`/_mock/${set.name}`, { schema: { tags, summary: listing, response: { 200: Type.Object({ [set.name]: Type.Array(set.rule as never) }) } } }, () => ({
    [set.name]: set.rules().list(),
  }));
  app.post(`/_mock/${set.name}`, { schema: { tags, summary: adding, body: set.input, response: { 200: set.rule } } }, (req) => set.rules().add(req.body as I));
  app.delete(
    `/_mock/${set.name}/:${set.idParam}`,
    { schema: { tags, summary: removing, params: Type.Object({ [set.idParam]: Type.String() }), response: { 200: set.rule } } },
    (req) => set.rules().remove((req.params as Record<string, string>)[set.idParam]!),
  );
  app.delete(`/_mock/${set.name}`, { schema: { tags, summary: clearing, response: { 200: Removed } } }, () => ({ removed: set.rules().clear() }));
}

/**
 * The admin API under /_mock/: reset, the request journal, fault and
 * progress rules, sampler replica control, settings, the virtual clock and
 * scenarios. Registered only with --admin.
 */
export function adminRoutes(appIn: FastifyInstance, core: LoopsCore, options: AdminOptions): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['admin'];

  // A page of another site may send simple requests here (a bodiless POST resets the server); SameSite=Strict keeps the
  // sign-in cookie from other sites, not from another port of 127.0.0.1 (same-site): so every change must show it is no such request.
  app.addHook('onRequest', async (request) => {
    const crossSite = crossSiteRefusal(request);
    if (crossSite) throw new LoopsError('forbidden', crossSite.message, { field: crossSite.field });
  });
  const gate = options.gate;
  if (gate !== undefined) {
    app.addHook('onRequest', async (request) => {
      if (!gate.admits(request)) {
        throw new LoopsError(
          'unauthorized',
          "The admin API needs 'Authorization: Bearer <admin token>' (the server's --admin-token), or the dashboard's sign-in.",
        );
      }
    });
  }
  // A scenario may be posted as raw YAML.
  for (const type of ['application/yaml', 'application/x-yaml', 'text/yaml', 'text/x-yaml']) {
    app.addContentTypeParser(type, { parseAs: 'string' }, (_request, body, done) => done(null, { text: body as string }));
  }

  app.post(
    '/_mock/reset',
    {
      schema: {
        tags,
        summary: 'Back to an empty server with the start-up configuration: records, checkpoints, operations, rules, journal and settings',
        response: { 200: Type.Object({ reset: Type.Boolean() }) },
      },
    },
    async () => {
      await core.reset();
      return { reset: true };
    },
  );

  // ---- journal -----------------------------------------------------------

  app.get(
    '/_mock/journal',
    {
      schema: { tags, summary: 'Every request in arrival order; ?format=ndjson streams one JSON object per line', querystring: JournalQuery },
    },
    (req, reply) => {
      const { format, ...query } = req.query;
      const entries = core.journal.query(query);
      if (format === 'ndjson') {
        reply.type('application/x-ndjson');
        return entries.map((e) => `${JSON.stringify(e)}\n`).join('');
      }
      return { entries, next_since: entries.length ? entries[entries.length - 1]!.seq : (query.since ?? 0), evicted: core.journal.evicted };
    },
  );

  // ---- faults and operation progress: two rule sets with the same four routes ----

  ruleSetRoutes(app, {
    name: 'faults',
    idParam: 'fault_id',
    rules: () => core.faults,
    input: FaultRuleBody,
    rule: FaultRule,
    summaries: [
      'Fault rules, with how often each matched and acted',
      'Adds a fault rule (acts on the Loops surfaces, never on /_mock)',
      'Removes one fault rule',
      'Removes every fault rule',
    ],
  });
  ruleSetRoutes(app, {
    name: 'progress',
    idParam: 'rule_id',
    rules: () => core.progress,
    input: ProgressRuleBody,
    rule: ProgressRule,
    summaries: [
      'Operation progress rules',
      'Adds a progress rule: operations complete after N polls, after T ms, or when released',
      'Removes one progress rule (operations it holds stay held until released)',
      'Removes every progress rule',
    ],
  });
  app.get(
    '/_mock/operations',
    {
      schema: {
        tags,
        summary: 'Operations whose results a progress rule holds back now',
        response: {
          200: Type.Object({
            held: Type.Array(
              Type.Object({
                operation_id: Type.String(),
                run_id: Type.String(),
                op: Type.String(),
                status: Type.String(),
                rule: Type.String(),
                mode: Type.String(),
                polls_seen: Type.Integer(),
              }),
            ),
          }),
        },
      },
    },
    () => ({ held: core.operations.held() }),
  );
  app.post(
    '/_mock/operations/:operation_id/release',
    {
      schema: {
        tags,
        summary: 'Releases a held operation: its result goes out as soon as it is computed',
        params: Type.Object({ operation_id: Type.String() }),
        response: { 200: Type.Object({ operation_id: Type.String(), status: Type.String() }) },
      },
    },
    (req) => {
      const op = core.operations.release(req.params.operation_id);
      return { operation_id: op.id, status: op.status };
    },
  );

  app.get(
    '/_mock/deployments',
    {
      schema: {
        tags,
        summary: 'Checkpoints deployed to inference that a progress rule (match.op deploy_checkpoint) holds in LOADING_MODEL now',
        response: {
          200: Type.Object({
            held: Type.Array(
              Type.Object({
                model_id: Type.String(),
                deployment_id: Type.String(),
                status: Type.String(),
                rule: Type.String(),
                mode: Type.String(),
                polls_seen: Type.Integer(),
              }),
            ),
          }),
        },
      },
    },
    () => ({ held: core.modelDeployments.held() }),
  );
  app.post(
    '/_mock/deployments/:deployment_id/release',
    {
      schema: {
        tags,
        summary: 'Releases a held deployment: it is ACTIVE once its cold start is over',
        params: Type.Object({ deployment_id: Type.String() }),
        response: { 200: Type.Object({ model_id: Type.String(), deployment_id: Type.String(), status: Type.String() }) },
      },
    },
    (req) => {
      const r = core.modelDeployments.release(req.params.deployment_id);
      return { model_id: r.model_id, deployment_id: r.deployment_id, status: core.modelDeployments.status(r) };
    },
  );

  // ---- samplers ----------------------------------------------------------

  const samplerOf = (id: string) => {
    const s = core.fleet.findSampler(id);
    if (!s) throw notFound(`No sampler '${id}' on this server.`, { field: 'sampler_id' });
    return s;
  };
  const samplerState = (id: string) => {
    const s = samplerOf(id);
    return { sampler_id: s.id, status: s.status, published_version: core.replicas.publishedVersion(s), replicas: core.replicas.replicaStates(s) };
  };
  const SamplerParams = Type.Object({ sampler_id: Type.String() });
  app.get(
    '/_mock/samplers/:sampler_id',
    {
      schema: {
        tags,
        summary: "A sampler's replicas: live, syncing and pending versions, delays, paused",
        params: SamplerParams,
        response: { 200: SamplerState },
      },
    },
    (req) => samplerState(req.params.sampler_id),
  );
  app.patch(
    '/_mock/samplers/:sampler_id',
    { schema: { tags, summary: "Sets a sampler's replica count", params: SamplerParams, body: SamplerPatch, response: { 200: SamplerState } } },
    (req) => {
      core.replicas.setReplicaCount(samplerOf(req.params.sampler_id), req.body.replicas);
      return samplerState(req.params.sampler_id);
    },
  );
  app.patch(
    '/_mock/samplers/:sampler_id/replicas/:replica',
    {
      schema: {
        tags,
        summary: "Sets one replica's sync delay (null: the settings') and pauses or resumes its weight sync",
        params: Type.Object({ sampler_id: Type.String(), replica: Type.Integer({ minimum: 0 }) }),
        body: ReplicaPatch,
        response: { 200: ReplicaState },
      },
    },
    (req) => core.replicas.controlReplica(samplerOf(req.params.sampler_id), req.params.replica, req.body),
  );

  // ---- settings, clock, scenarios ------------------------------------------

  app.get('/_mock/settings', { schema: { tags, summary: 'The live settings', response: { 200: SettingsPatch } } }, () => settingsToWire(core.settings));
  app.patch(
    '/_mock/settings',
    {
      schema: {
        tags,
        summary: 'Changes settings while the server runs (new values apply from the next use)',
        body: SettingsPatch,
        response: { 200: SettingsPatch },
      },
    },
    (req) => {
      applySettings(core.settings, req.body as Record<string, unknown>);
      return settingsToWire(core.settings);
    },
  );

  const clockState = () => ({
    mode: core.clock instanceof ManualClock ? ('virtual' as const) : ('real' as const),
    now: new Date(core.clock.now()).toISOString(),
    now_ms: core.clock.now(),
  });
  app.get('/_mock/clock', { schema: { tags, summary: "The server's time and clock mode", response: { 200: ClockState } } }, clockState);
  app.post(
    '/_mock/clock/advance',
    {
      schema: {
        tags,
        summary: 'Moves virtual time forward, firing every timer on the way (idle timeouts, cold starts, TTLs, sync delays, long-poll windows)',
        body: ClockAdvance,
        response: { 200: ClockState },
      },
    },
    (req) => {
      if (!(core.clock instanceof ManualClock))
        throw conflict('The clock is real: start the server with --clock virtual to move time with /_mock/clock/advance.', { field: 'clock' });
      core.clock.advance(req.body.ms);
      return clockState();
    },
  );

  app.get(
    '/_mock/scenarios',
    {
      schema: {
        tags,
        summary: 'Scenarios shipped with loops-mock (conformance/scenarios/)',
        response: { 200: Type.Object({ scenarios: Type.Array(Type.String()) }) },
      },
    },
    () => ({ scenarios: shippedScenarioNames() }),
  );
  app.post(
    '/_mock/scenario',
    {
      schema: {
        tags,
        summary:
          'Applies a scenario: {name} of a shipped one, {scenario} as JSON, {text} or a YAML body; replaces the fault and progress rules and the settings',
        body: ScenarioRequest,
        response: { 200: ScenarioApplied },
      },
    },
    (req) => {
      const body = req.body as { name?: string; scenario?: unknown; text?: string };
      let spec: ReturnType<typeof parseScenario>;
      if (body.name !== undefined) {
        const { text, source } = readScenarioSource(body.name, false);
        spec = parseScenario(text, source);
      } else {
        spec = parseScenario(body.text ?? JSON.stringify(body.scenario, null, 1), 'scenario');
      }
      return applyScenario(core, spec);
    },
  );
}
