/** The trainer data plane's bodies (Baseten's trainer docs; docs/protocol.md): the door validates with these schemas, the core takes their static types. */
import Type, { type Static } from 'typebox';

const strict = { additionalProperties: false } as const;

export const TensorData = Type.Object(
  {
    data: Type.Array(Type.Number()),
    dtype: Type.Enum(['int64', 'float32']),
    shape: Type.Optional(Type.Union([Type.Array(Type.Integer({ minimum: 0 })), Type.Null()])),
  },
  { ...strict, title: 'TensorData' },
);

/**
 * One chunk: `encoded_text` (tokens) or `image` (data: base64 bytes, format: png | jpeg, expected_tokens, as the
 * SDK's ImageChunk). One open shape rather than a union, so the core names the exact field a chunk gets wrong
 * (server/core/model-input.ts checks each type's fields).
 */
export const ModelInputChunk = Type.Object(
  {
    type: Type.String(),
    tokens: Type.Optional(Type.Array(Type.Integer())),
    data: Type.Optional(Type.String()),
    format: Type.Optional(Type.String()),
    expected_tokens: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
  },
  { additionalProperties: true, title: 'ModelInputChunk' },
);

export const ModelInput = Type.Object(
  {
    chunks: Type.Array(ModelInputChunk, { minItems: 1 }),
  },
  { ...strict, title: 'ModelInput' },
);

export const Datum = Type.Object(
  {
    model_input: ModelInput,
    loss_fn_inputs: Type.Optional(Type.Record(Type.String(), TensorData)),
  },
  { ...strict, title: 'Datum' },
);

export const ForwardRequest = Type.Object(
  {
    data: Type.Array(Datum, { minItems: 1 }),
    // Optional: the SDK's default, and a plain `{"data": [...]}`, is cross_entropy.
    loss_fn: Type.Optional(Type.String()),
    loss_fn_config: Type.Optional(Type.Union([Type.Record(Type.String(), Type.Number()), Type.Null()])),
    // 0..MAX_TOP_K_LOGPROBS, checked in the core (a 400 naming the field and the range); null or 0: none.
    top_k_logprobs: Type.Optional(Type.Union([Type.Integer(), Type.Null()])),
  },
  { ...strict, title: 'ForwardBackwardRequest' },
);

export const OptimStepRequest = Type.Object(
  {
    adam_params: Type.Optional(
      Type.Union([
        Type.Object(
          {
            learning_rate: Type.Optional(Type.Number()),
            beta1: Type.Optional(Type.Number()),
            beta2: Type.Optional(Type.Number()),
            eps: Type.Optional(Type.Number()),
            weight_decay: Type.Optional(Type.Number()),
            grad_clip_norm: Type.Optional(Type.Number()),
          },
          strict,
        ),
        Type.Null(),
      ]),
    ),
  },
  { ...strict, title: 'OptimStepRequest' },
);

export const SaveRequest = Type.Object({ name: Type.String({ minLength: 1 }) }, { ...strict, title: 'SaveStateRequest' });
export const SaveForSamplerRequest = Type.Object(
  {
    name: Type.String({ minLength: 1 }),
    trainer_server_id: Type.Optional(Type.Union([Type.String(), Type.Null()])),
  },
  { ...strict, title: 'SaveWeightsForSamplerRequest' },
);
export const LoadRequest = Type.Object({ path: Type.String({ minLength: 1 }) }, { ...strict, title: 'LoadStateRequest' });
export const InitRequest = Type.Object(
  {
    lora_rank: Type.Integer(),
    lora_alpha: Type.Optional(Type.Number()),
  },
  { ...strict, title: 'InitTrainerServerRequest' },
);

export const OperationIdResponse = Type.Object({ operation_id: Type.String() });
export const PolicyVersionResponse = Type.Object({ policy_version: Type.Integer() });
export const HealthResponse = Type.Object({ status: Type.String() });
export const OperationResponse = Type.Object({
  status: Type.Enum(['done', 'error']),
  result: Type.Optional(Type.Unknown()),
  error: Type.Optional(Type.Object({ message: Type.String(), error_class: Type.String() })),
});

/** Each operation's body schema: the route validates with it, the core takes its static type. */
export const TRAINER_BODIES = {
  forward: ForwardRequest,
  forward_backward: ForwardRequest,
  optim_step: OptimStepRequest,
  save_state: SaveRequest,
  save_weights_for_sampler: SaveForSamplerRequest,
  load_state: LoadRequest,
  load_state_with_optimizer: LoadRequest,
  init_trainer_server: InitRequest,
} as const;

export type TrainerOp = keyof typeof TRAINER_BODIES;
export const TRAINER_OPS = Object.keys(TRAINER_BODIES) as TrainerOp[];
export type TrainerBody<O extends TrainerOp> = Static<(typeof TRAINER_BODIES)[O]>;
export type ForwardBody = Static<typeof ForwardRequest>;
export type WireDatum = Static<typeof Datum>;
export type WireTensorData = Static<typeof TensorData>;
