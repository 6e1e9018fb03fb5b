import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Type from 'typebox';
import { ManualClock } from '../core/clock.js';
import type { LoopsCore } from '../core/core.js';
import { conflict, LoopsError, notFound } from '../core/errors.js';
import type { FaultRuleInput } from '../core/faults.js';
import type { ProgressRuleInput } from '../core/progress.js';
import { applySettings, settingsToWire } from '../core/settings.js';
import { applyScenario, parseScenario, readScenarioSource, shippedScenarioNames } from './scenario.js';
import {
  ClockAdvance, ClockState, FaultRule, FaultRuleInput as FaultRuleBody, JournalQuery, ProgressRule, ProgressRuleInput as ProgressRuleBody,
  ReplicaPatch, ReplicaState, SamplerPatch, SamplerState, ScenarioRequest, SettingsPatch,
} from './schemas.js';

export interface AdminOptions {
  /** When set, every admin request needs `Authorization: Bearer <token>`. */
  token?: string;
}

const Removed = Type.Object({ removed: Type.Integer() });
const ScenarioApplied = Type.Object({ name: Type.Union([Type.String(), Type.Null()]), faults: Type.Integer(), progress: Type.Integer() });

/**
 * The admin API under /_mock/: reset, the request journal, fault and
 * progress rules, sampler replica control, settings, the virtual clock and
 * scenarios. Registered only with --admin.
 */
export function adminRoutes(appIn: FastifyInstance, core: LoopsCore, options: AdminOptions): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['admin'];

  if (options.token !== undefined) {
    const expected = `Bearer ${options.token}`;
    app.addHook('onRequest', async (request) => {
      if (request.headers.authorization !== expected) {
        throw new LoopsError('unauthorized', "The admin API needs 'Authorization: Bearer <admin token>' (the server's --admin-token).");
      }
    });
  }
  // A scenario may be posted as raw YAML.
  for (const type of ['application/yaml', 'application/x-yaml', 'text/yaml', 'text/x-yaml']) {
    app.addContentTypeParser(type, { parseAs: 'string' }, (_request, body, done) => done(null, { text: body as string }));
  }

  app.post('/_mock/reset', {
    schema: { tags, summary: 'Back to an empty server with the start-up configuration: records, checkpoints, operations, rules, journal and settings', response: { 200: Type.Object({ reset: Type.Boolean() }) } },
  }, () => {
    core.reset();
    return { reset: true };
  });

  // ---- journal -----------------------------------------------------------

  app.get('/_mock/journal', {
    schema: { tags, summary: 'Every request in arrival order; ?format=ndjson streams one JSON object per line', querystring: JournalQuery },
  }, (req, reply) => {
    const { format, ...query } = req.query;
    const entries = core.journal.query(query);
    if (format === 'ndjson') {
      reply.type('application/x-ndjson');
      return entries.map((e) => `${JSON.stringify(e)}\n`).join('');
    }
    return { entries, next_since: entries.length ? entries[entries.length - 1]!.seq : query.since ?? 0, evicted: core.journal.evicted };
  });

  // ---- faults ------------------------------------------------------------

  app.get('/_mock/faults', { schema: { tags, summary: 'Fault rules, with how often each matched and acted', response: { 200: Type.Object({ faults: Type.Array(FaultRule) }) } } },
    () => ({ faults: core.faults.list() }));
  app.post('/_mock/faults', { schema: { tags, summary: 'Adds a fault rule (acts on the Loops surfaces, never on /_mock)', body: FaultRuleBody, response: { 200: FaultRule } } },
    (req) => core.faults.add(req.body as FaultRuleInput));
  app.delete('/_mock/faults/:fault_id', { schema: { tags, summary: 'Removes one fault rule', params: Type.Object({ fault_id: Type.String() }), response: { 200: FaultRule } } },
    (req) => core.faults.remove(req.params.fault_id));
  app.delete('/_mock/faults', { schema: { tags, summary: 'Removes every fault rule', response: { 200: Removed } } },
    () => ({ removed: core.faults.clear() }));

  // ---- operation progress ------------------------------------------------

  app.get('/_mock/progress', { schema: { tags, summary: 'Operation progress rules', response: { 200: Type.Object({ progress: Type.Array(ProgressRule) }) } } },
    () => ({ progress: core.progress.list() }));
  app.post('/_mock/progress', { schema: { tags, summary: 'Adds a progress rule: operations complete after N polls, after T ms, or when released', body: ProgressRuleBody, response: { 200: ProgressRule } } },
    (req) => core.progress.add(req.body as ProgressRuleInput));
  app.delete('/_mock/progress/:rule_id', { schema: { tags, summary: 'Removes one progress rule (operations it holds stay held until released)', params: Type.Object({ rule_id: Type.String() }), response: { 200: ProgressRule } } },
    (req) => core.progress.remove(req.params.rule_id));
  app.delete('/_mock/progress', { schema: { tags, summary: 'Removes every progress rule', response: { 200: Removed } } },
    () => ({ removed: core.progress.clear() }));
  app.get('/_mock/operations', {
    schema: { tags, summary: 'Operations whose results a progress rule holds back now', response: { 200: Type.Object({ held: Type.Array(Type.Object({ operation_id: Type.String(), run_id: Type.String(), op: Type.String(), status: Type.String(), rule: Type.String(), mode: Type.String(), polls_seen: Type.Integer() })) }) } },
  }, () => ({ held: core.operations.held() }));
  app.post('/_mock/operations/:operation_id/release', {
    schema: { tags, summary: 'Releases a held operation: its result goes out as soon as it is computed', params: Type.Object({ operation_id: Type.String() }), response: { 200: Type.Object({ operation_id: Type.String(), status: Type.String() }) } },
  }, (req) => {
    const op = core.operations.release(req.params.operation_id);
    return { operation_id: op.id, status: op.status };
  });

  // ---- samplers ----------------------------------------------------------

  const samplerOf = (id: string) => {
    const s = core.fleet.findSampler(id);
    if (!s) throw notFound(`No sampler '${id}' on this server.`, { field: 'sampler_id' });
    return s;
  };
  const samplerState = (id: string) => {
    const s = samplerOf(id);
    return { sampler_id: s.id, status: s.status, published_version: core.sampling.publishedVersion(s), replicas: core.sampling.replicaStates(s) };
  };
  const SamplerParams = Type.Object({ sampler_id: Type.String() });
  app.get('/_mock/samplers/:sampler_id', { schema: { tags, summary: "A sampler's replicas: live, syncing and pending versions, delays, paused", params: SamplerParams, response: { 200: SamplerState } } },
    (req) => samplerState(req.params.sampler_id));
  app.patch('/_mock/samplers/:sampler_id', { schema: { tags, summary: "Sets a sampler's replica count", params: SamplerParams, body: SamplerPatch, response: { 200: SamplerState } } }, (req) => {
    core.sampling.setReplicaCount(samplerOf(req.params.sampler_id), req.body.replicas);
    return samplerState(req.params.sampler_id);
  });
  app.patch('/_mock/samplers/:sampler_id/replicas/:replica', {
    schema: { tags, summary: "Sets one replica's sync delay (null: the settings') and pauses or resumes its weight sync", params: Type.Object({ sampler_id: Type.String(), replica: Type.Integer({ minimum: 0 }) }), body: ReplicaPatch, response: { 200: ReplicaState } },
  }, (req) => core.sampling.controlReplica(samplerOf(req.params.sampler_id), req.params.replica, req.body));

  // ---- settings, clock, scenarios ------------------------------------------

  app.get('/_mock/settings', { schema: { tags, summary: 'The live settings', response: { 200: SettingsPatch } } }, () => settingsToWire(core.settings));
  app.patch('/_mock/settings', { schema: { tags, summary: 'Changes settings while the server runs (new values apply from the next use)', body: SettingsPatch, response: { 200: SettingsPatch } } }, (req) => {
    applySettings(core.settings, req.body as Record<string, unknown>);
    return settingsToWire(core.settings);
  });

  const clockState = () => ({ mode: core.clock instanceof ManualClock ? 'virtual' as const : 'real' as const, now: new Date(core.clock.now()).toISOString(), now_ms: core.clock.now() });
  app.get('/_mock/clock', { schema: { tags, summary: "The server's time and clock mode", response: { 200: ClockState } } }, clockState);
  app.post('/_mock/clock/advance', {
    schema: { tags, summary: 'Moves virtual time forward, firing every timer on the way (idle timeouts, cold starts, TTLs, sync delays, long-poll windows)', body: ClockAdvance, response: { 200: ClockState } },
  }, (req) => {
    if (!(core.clock instanceof ManualClock)) throw conflict('The clock is real: start the server with --clock virtual to move time with /_mock/clock/advance.', { field: 'clock' });
    core.clock.advance(req.body.ms);
    return clockState();
  });

  app.get('/_mock/scenarios', { schema: { tags, summary: 'Scenarios shipped with loops-mock (conformance/scenarios/)', response: { 200: Type.Object({ scenarios: Type.Array(Type.String()) }) } } },
    () => ({ scenarios: shippedScenarioNames() }));
  app.post('/_mock/scenario', {
    schema: { tags, summary: 'Applies a scenario: {name} of a shipped one, {scenario} as JSON, {text} or a YAML body; replaces the fault and progress rules and the settings', body: ScenarioRequest, response: { 200: ScenarioApplied } },
  }, (req) => {
    const body = req.body as { name?: string; scenario?: unknown; text?: string };
    let spec;
    if (body.name !== undefined) {
      const { text, source } = readScenarioSource(body.name, false);
      spec = parseScenario(text, source);
    } else {
      spec = parseScenario(body.text ?? JSON.stringify(body.scenario, null, 1), 'scenario');
    }
    return applyScenario(core, spec);
  });
}
