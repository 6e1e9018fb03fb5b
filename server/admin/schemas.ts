/** TypeBox schemas of the admin API (docs/admin.md); scenarios reuse the rule schemas. */
import Type from 'typebox';
import { FAULT_ACTIONS } from '../core/faults.js';
import { SURFACES } from '../core/journal.js';
import { PROGRESS_MODES } from '../core/progress.js';
import { LIVE_SETTING_ROWS, type LiveSettingRow } from '../core/settings.js';

const strict = { additionalProperties: false } as const;
const OneOrMany = (item: ReturnType<typeof Type.String>) => Type.Union([item, Type.Array(item, { minItems: 1 })]);
const Whole = (options: Record<string, unknown> = {}) => Type.Integer({ minimum: 0, ...options });

export const FaultMatch = Type.Object(
  {
    surface: Type.Optional(Type.Union([Type.Enum([...SURFACES]), Type.Array(Type.Enum([...SURFACES]), { minItems: 1 })])),
    method: Type.Optional(OneOrMany(Type.String({ minLength: 1 }))),
    route: Type.Optional(OneOrMany(Type.String({ minLength: 1 }))),
    op: Type.Optional(OneOrMany(Type.String({ minLength: 1 }))),
    run_id: Type.Optional(Type.String({ minLength: 1 })),
    sampler_id: Type.Optional(Type.String({ minLength: 1 })),
    headers: Type.Optional(Type.Record(Type.String(), Type.String())),
  },
  { ...strict, title: 'FaultMatch', description: 'Every field given must match; arrays mean any of them.' },
);

export const FaultAction = Type.Object(
  {
    type: Type.Enum([...FAULT_ACTIONS]),
    status: Type.Optional(Type.Integer({ minimum: 400, maximum: 599, description: 'respond: the status to answer' })),
    error_type: Type.Optional(Type.String({ minLength: 1, description: 'respond: error.type of the body' })),
    message: Type.Optional(Type.String({ description: 'respond: error.message; fail_operation: the operation error message' })),
    body: Type.Optional(Type.Unknown({ description: 'respond: a whole body instead of the error shape' })),
    headers: Type.Optional(Type.Record(Type.String(), Type.String(), { description: 'respond: extra headers' })),
    retry_after_s: Type.Optional(Whole({ maximum: 86_400, description: 'respond: sets Retry-After' })),
    ms: Type.Optional(Whole({ maximum: 600_000, description: 'delay: milliseconds before the request is handled' })),
    phase: Type.Optional(
      Type.Enum(['before', 'after'], { description: 'drop: before handling (nothing happens) or after (the work is done, the answer is lost)' }),
    ),
    error_class: Type.Optional(Type.String({ minLength: 1, description: 'fail_operation: the error_class the operation ends with' })),
  },
  { ...strict, title: 'FaultAction' },
);

export const FaultRuleInput = Type.Object(
  {
    match: Type.Optional(FaultMatch),
    action: FaultAction,
    times: Type.Optional(Type.Integer({ minimum: 1 })),
    skip: Type.Optional(Whole()),
    probability: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
    seed: Type.Optional(Whole({ maximum: 2 ** 32 - 1 })),
    description: Type.Optional(Type.String()),
  },
  { ...strict, title: 'FaultRuleInput' },
);

export const FaultRule = Type.Object(
  {
    id: Type.String(),
    match: Type.Optional(FaultMatch),
    action: FaultAction,
    times: Type.Optional(Type.Integer()),
    skip: Type.Optional(Type.Integer()),
    probability: Type.Optional(Type.Number()),
    seed: Type.Optional(Type.Integer()),
    description: Type.Optional(Type.String()),
    matched: Type.Integer(),
    fired: Type.Integer(),
    remaining: Type.Union([Type.Integer(), Type.Null()]),
  },
  { title: 'FaultRule' },
);

export const ProgressRuleInput = Type.Object(
  {
    match: Type.Optional(
      Type.Object(
        {
          op: Type.Optional(OneOrMany(Type.String({ minLength: 1 }))),
          run_id: Type.Optional(Type.String({ minLength: 1 })),
        },
        strict,
      ),
    ),
    mode: Type.Enum([...PROGRESS_MODES]),
    polls: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000 })),
    ms: Type.Optional(Whole({ maximum: 86_400_000 })),
    times: Type.Optional(Type.Integer({ minimum: 1 })),
    description: Type.Optional(Type.String()),
  },
  { ...strict, title: 'ProgressRuleInput' },
);

export const ProgressRule = Type.Object(
  {
    id: Type.String(),
    match: Type.Optional(Type.Unknown()),
    mode: Type.String(),
    polls: Type.Optional(Type.Integer()),
    ms: Type.Optional(Type.Integer()),
    times: Type.Optional(Type.Integer()),
    description: Type.Optional(Type.String()),
    applied: Type.Integer(),
    remaining: Type.Union([Type.Integer(), Type.Null()]),
  },
  { title: 'ProgressRule' },
);

/** The schema of one live setting's value, from its row: the range, and a list or null where the shape allows. */
function settingValueSchema(row: LiveSettingRow) {
  const one = () => Type.Integer({ minimum: row.range[0], maximum: row.range[1] });
  switch (row.shape) {
    case 'whole':
      return one();
    case 'list':
      return Type.Union([one(), Type.Array(one(), { minItems: 1 })]);
    case 'nullable':
      return Type.Union([one(), Type.Null()]);
  }
}

/** Body of PATCH /_mock/settings and a scenario's `settings`: every live setting, by wire name, each optional (server/core/settings.ts). */
export const SettingsPatch = Type.Object(Object.fromEntries(LIVE_SETTING_ROWS.map((row) => [row.wire, Type.Optional(settingValueSchema(row))])), {
  ...strict,
  title: 'Settings',
});

export const Scenario = Type.Object(
  {
    name: Type.Optional(Type.String({ minLength: 1 })),
    description: Type.Optional(Type.String()),
    /** Seed of this scenario's fault rules that give none. */
    seed: Type.Optional(Whole({ maximum: 2 ** 32 - 1 })),
    settings: Type.Optional(SettingsPatch),
    faults: Type.Optional(Type.Array(FaultRuleInput)),
    progress: Type.Optional(Type.Array(ProgressRuleInput)),
    /** Read by the conformance suite (which tasks and checks this scenario is for); the server ignores it. */
    conformance: Type.Optional(Type.Unknown()),
  },
  { ...strict, title: 'Scenario' },
);

export const ScenarioRequest = Type.Union(
  [
    Type.Object({ name: Type.String({ minLength: 1, description: 'a scenario shipped in conformance/scenarios/' }) }, strict),
    Type.Object({ scenario: Scenario }, strict),
    Type.Object({ text: Type.String({ minLength: 1, description: 'a scenario as JSON or YAML text' }) }, strict),
  ],
  { title: 'ScenarioRequest' },
);

export const ReplicaState = Type.Object({
  replica: Type.Integer(),
  policy_version: Type.Integer(),
  syncing_version: Type.Union([Type.Integer(), Type.Null()]),
  pending_version: Type.Union([Type.Integer(), Type.Null()]),
  sync_delay_ms: Type.Integer(),
  paused: Type.Boolean(),
});

export const SamplerState = Type.Object({
  sampler_id: Type.String(),
  status: Type.String(),
  published_version: Type.Integer(),
  replicas: Type.Array(ReplicaState),
});

export const SamplerPatch = Type.Object({ replicas: Type.Integer({ minimum: 1, maximum: 64 }) }, strict);
export const ReplicaPatch = Type.Object(
  {
    sync_delay_ms: Type.Optional(Type.Union([Whole({ maximum: 86_400_000 }), Type.Null()])),
    paused: Type.Optional(Type.Boolean()),
  },
  strict,
);

export const JournalQuery = Type.Object(
  {
    surface: Type.Optional(Type.Enum([...SURFACES])),
    run_id: Type.Optional(Type.String()),
    sampler_id: Type.Optional(Type.String()),
    since: Type.Optional(Whole()),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100_000 })),
    format: Type.Optional(Type.Enum(['json', 'ndjson'])),
  },
  strict,
);

export const ClockAdvance = Type.Object({ ms: Whole({ maximum: 365 * 86_400_000 }) }, strict);
export const ClockState = Type.Object({ mode: Type.Enum(['real', 'virtual']), now: Type.String(), now_ms: Type.Integer() });
