/** TypeBox schemas of the sampler data plane (docs/protocol.md; the route names and bodies are the mock's choice). */
import Type, { type Static } from 'typebox';
import { STOP_MAX_CHARS, STOP_MAX_STRINGS } from '../../models/sampling.js';
import { ModelInput } from './trainer.js';

const strict = { additionalProperties: false } as const;
// Bounded: every generated token is matched against each stop string.
const StopString = Type.String({ maxLength: STOP_MAX_CHARS });
const Stop = Type.Optional(
  Type.Union([StopString, Type.Array(StopString, { maxItems: STOP_MAX_STRINGS }), Type.Array(Type.Integer(), { maxItems: STOP_MAX_STRINGS }), Type.Null()]),
);

export const SamplingParams = Type.Object(
  {
    max_tokens: Type.Optional(Type.Integer({ minimum: 0 })),
    temperature: Type.Optional(Type.Number({ minimum: 0 })),
    top_p: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
    top_k: Type.Optional(Type.Integer({ minimum: -1 })),
    seed: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
    stop: Stop,
  },
  { ...strict, title: 'SamplingParams' },
);

export const SampleRequest = Type.Object(
  {
    prompt: ModelInput,
    num_samples: Type.Optional(Type.Integer({ minimum: 1, maximum: 128 })),
    sampling_params: Type.Optional(SamplingParams),
    include_prompt_logprobs: Type.Optional(Type.Boolean()),
    topk_prompt_logprobs: Type.Optional(Type.Integer({ minimum: 0, maximum: 100 })),
  },
  { ...strict, title: 'SampleRequest' },
);

export const ComputeLogprobsRequest = Type.Object({ prompt: ModelInput }, { ...strict, title: 'ComputeLogprobsRequest' });

/** OpenAI/vLLM completions: unknown fields are ignored, as OpenAI clients send many. */
export const CompletionsRequest = Type.Object(
  {
    model: Type.Optional(Type.String()),
    prompt: Type.Union([Type.String(), Type.Array(Type.Integer(), { minItems: 1 })]),
    max_tokens: Type.Optional(Type.Union([Type.Integer({ minimum: 0 }), Type.Null()])),
    temperature: Type.Optional(Type.Union([Type.Number({ minimum: 0 }), Type.Null()])),
    top_p: Type.Optional(Type.Union([Type.Number({ exclusiveMinimum: 0, maximum: 1 }), Type.Null()])),
    top_k: Type.Optional(Type.Union([Type.Integer({ minimum: -1 }), Type.Null()])),
    seed: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
    stop: Stop,
    n: Type.Optional(Type.Union([Type.Integer({ minimum: 1, maximum: 128 }), Type.Null()])),
    logprobs: Type.Optional(Type.Union([Type.Integer({ minimum: 0, maximum: 20 }), Type.Null()])),
    echo: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
    stream: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  },
  { additionalProperties: true, title: 'CompletionRequest' },
);

export const SamplerParams = Type.Object({ sampler_id: Type.String() });

export type SamplingParamsWire = Static<typeof SamplingParams>;
export type SampleBody = Static<typeof SampleRequest>;
export type CompletionsBody = Static<typeof CompletionsRequest>;
