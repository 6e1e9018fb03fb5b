import { buildSchema, GraphQLError, type GraphQLSchema } from 'graphql';
import { checkpointPath } from '../core/checkpoints.js';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import { INSTANCE_TYPES } from '../core/model-deployments.js';
import type { Principal } from '../core/records.js';

/**
 * The part of Baseten's GraphQL API (`{remote}/graphql/`) that truss calls
 * around Loops: `listed_instances` and the inference-template mutation of
 * `truss loops checkpoints deploy`, `organization`/`user` (`truss whoami`),
 * and `range_model_metrics`. Field names are truss's (snake_case; truss
 * aliases them). Anything else is a GraphQL validation error naming it.
 */
const SDL = `
  type Query {
    listed_instances: [InstanceType!]!
    organization: Organization!
    user: User!
    range_model_metrics(model_version_id: String!, start: String, end: String, step_seconds: Int, time_divisor_seconds: Int): ModelMetrics!
  }

  type Mutation {
    create_model_version_from_inference_template(request: CreateModelVersionFromInferenceTemplateRequest!): CreateModelVersionFromInferenceTemplateResponse!
  }

  type InstanceType {
    id: String!
    name: String!
    display_name: String!
    gpu_count: Int!
    default: Boolean!
    gpu_memory: Int
    node_count: Int!
    gpu_type: String
    millicpu_limit: Int!
    memory_limit: Int!
    price: Float
    limited_capacity: Boolean!
  }

  type Organization { id: String!, workspace_name: String! }
  type User { id: String!, email: String! }

  type MetricPoint { timestamp: Float!, value: Float! }
  type ModelMetrics { inference_volume: [MetricPoint!]!, model_concurrent_requests: [MetricPoint!]! }

  input CreateModelVersionFromInferenceTemplateRequest {
    metadata: TemplateMetadata!
    weights_sources: [WeightsSource!]!
    inference_stack: InferenceStack!
    instance_type_id: String!
    dry_run: Boolean
  }
  input TemplateMetadata { oracle_name: String! }
  input WeightsSource {
    weight_source_type: String!
    b10_loops_checkpoint_weights_source: LoopsCheckpointWeightsSource
    b10_training_checkpoint_weights_source: TrainingCheckpointWeightsSource
  }
  input LoopsCheckpointWeightsSource { checkpoint: LoopsCheckpointRef! }
  input LoopsCheckpointRef { loops_checkpoint_id: String! }
  input TrainingCheckpointWeightsSource { checkpoint: TrainingCheckpointRef! }
  input TrainingCheckpointRef { training_job_id: String!, checkpoint_name: String! }
  input InferenceStack { stack_type: String!, environment_variables: [EnvironmentVariable!] }
  input EnvironmentVariable { name: String!, value: String!, is_secret_reference: Boolean }

  type ModelVersion { id: String!, name: String!, model_id: String! }
  type CreateModelVersionFromInferenceTemplateResponse { model_version: ModelVersion, truss_config: String! }
`;

/** GraphQL error codes of the core's error kinds (truss reads `extensions.code` and `extensions.description`). */
const CODES: Record<string, string> = {
  invalid_request: 'BAD_USER_INPUT',
  not_found: 'NOT_FOUND',
  forbidden: 'FORBIDDEN',
  unauthorized: 'UNAUTHENTICATED',
  conflict: 'CONFLICT',
  insufficient_storage: 'INSUFFICIENT_STORAGE',
};

export interface GraphqlContext {
  principal: Principal;
}

interface TemplateRequest {
  metadata: { oracle_name: string };
  weights_sources: { weight_source_type: string; b10_loops_checkpoint_weights_source?: { checkpoint: { loops_checkpoint_id: string } } | null }[];
  inference_stack: { stack_type: string; environment_variables?: { name: string; value: string; is_secret_reference?: boolean | null }[] | null };
  instance_type_id: string;
  dry_run?: boolean | null;
}

function userError(message: string, field: string): GraphQLError {
  return new GraphQLError(message, { extensions: { code: 'BAD_USER_INPUT', description: message, field } });
}

/** A core error as GraphQL reports it: the message, and a code truss prints. */
export function asGraphqlError(err: unknown): unknown {
  if (err instanceof LoopsError)
    return new GraphQLError(err.message, { extensions: { code: CODES[err.kind] ?? 'BAD_USER_INPUT', description: err.message, ...err.details } });
  return err;
}

export function graphqlSchema(): GraphQLSchema {
  return buildSchema(SDL);
}

/** Resolvers of Query and Mutation fields (graphql-js's root value). */
export function rootValue(core: LoopsCore) {
  const guard =
    <A, T>(fn: (args: A, ctx: GraphqlContext) => T) =>
    (args: A, ctx: GraphqlContext) => {
      try {
        return fn(args, ctx);
      } catch (err) {
        throw asGraphqlError(err);
      }
    };
  return {
    listed_instances: () => INSTANCE_TYPES,
    organization: guard((_: unknown, { principal }) => ({ id: principal.org_id, workspace_name: core.accounts.team(principal, principal.team_id).name })),
    user: guard((_: unknown, { principal }) => ({ id: principal.user_id, email: principal.email })),
    range_model_metrics: guard(
      (args: { model_version_id: string; start?: string | null; end?: string | null; step_seconds?: number | null }, { principal }) => {
        const r = core.modelDeployments.list(principal).find((d) => d.deployment_id === args.model_version_id);
        if (!r)
          throw userError(
            `model_version_id '${args.model_version_id}' is not a model version of yours: it is the deployment_id of a deployed checkpoint.`,
            'model_version_id',
          );
        const time = (v: string | null | undefined, field: string, fallback: number) => {
          if (v === undefined || v === null) return fallback;
          const ms = /^\d+(\.\d+)?$/.test(v) ? Number(v) * 1000 : Date.parse(v);
          if (!Number.isFinite(ms)) throw userError(`${field} '${v}' is not a time: give ISO 8601 or epoch seconds.`, field);
          return ms;
        };
        const end = time(args.end, 'end', core.clock.now());
        const start = time(args.start, 'start', end - 3_600_000);
        const step = args.step_seconds ?? 60;
        if (!(step >= 1) || !(end > start) || (end - start) / (step * 1000) > 10_000)
          throw userError('Give start < end and step_seconds >= 1, with at most 10000 steps between them.', 'step_seconds');
        return core.inference.metrics(r, start, end, step * 1000);
      },
    ),
    create_model_version_from_inference_template: guard(({ request }: { request: TemplateRequest }, { principal }) => {
      if (request.inference_stack.stack_type !== 'VLLM')
        throw userError(`inference_stack.stack_type '${request.inference_stack.stack_type}' is not served here: use VLLM.`, 'inference_stack.stack_type');
      if (!INSTANCE_TYPES.some((t) => t.id === request.instance_type_id))
        throw userError(
          `instance_type_id '${request.instance_type_id}' is not listed: listed_instances gives ${INSTANCE_TYPES.map((t) => t.id).join(', ')}.`,
          'instance_type_id',
        );
      const ids = request.weights_sources.map((w, i) => {
        const id = w.b10_loops_checkpoint_weights_source?.checkpoint.loops_checkpoint_id;
        if (w.weight_source_type !== 'B10_LOOPS_CHECKPOINTING' || !id) {
          throw userError(
            `weights_sources[${i}] must be a B10_LOOPS_CHECKPOINTING source with b10_loops_checkpoint_weights_source.checkpoint.loops_checkpoint_id (got ${w.weight_source_type}): loops-mock deploys Loops checkpoints only.`,
            `weights_sources[${i}]`,
          );
        }
        return id;
      });
      const env = request.inference_stack.environment_variables ?? [];
      const secret = env.find((v) => v.is_secret_reference)?.value ?? null;
      const input = { checkpoint_ids: ids, model_name: request.metadata.oracle_name, instance_type_id: request.instance_type_id, hf_secret_name: secret };
      const checkpoints = core.modelDeployments.check(principal, input);
      const trussConfig = JSON.stringify({
        model_name: request.metadata.oracle_name,
        base_model: checkpoints[0]!.base_model,
        inference_stack: 'VLLM',
        resources: { instance_type: request.instance_type_id },
        weights: checkpoints.map((c) => ({ source: checkpointPath(c), loops_checkpoint_id: c.id, served_model_name: c.name })),
        environment_variables: Object.fromEntries(env.map((v) => [v.name, v.is_secret_reference ? `secret:${v.value}` : v.value])),
      });
      if (request.dry_run) return { model_version: null, truss_config: trussConfig };
      const r = core.modelDeployments.deploy(principal, input);
      return { model_version: { id: r.deployment_id, name: r.name, model_id: r.model_id }, truss_config: trussConfig };
    }),
  };
}
