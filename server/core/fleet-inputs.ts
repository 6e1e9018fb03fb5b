// What the fleet's requests take, and the checks and orderings that need no state: run and sampler inputs, list scopes, base models, lengths.
import { findBaseModel, supportedModelNames } from '../../models/registry.js';
import { invalid } from './errors.js';
import type { Ownership, Principal } from './records.js';

/** Largest LoRA rank the engine builds adapters for. */
export const MAX_LORA_RANK = 128;

export interface CreateRunInput {
  session_id: string;
  base_model: string;
  name?: string | null;
  max_seq_len?: number | null;
  lora_rank?: number;
  seed?: number | null;
  scale_down_delay_seconds?: number;
  availability_model?: 'dedicated' | 'spot';
  replicas?: number;
  path?: string | null;
  reuse_from_run_id?: string | null;
  reuse_from_session_id?: string | null;
}

export interface CreateSamplerInput {
  session_id: string;
  base_model?: string | null;
  run_id?: string | null;
  max_seq_length?: number | null;
  model_path?: string | null;
  reuse_from_session_id?: string | null;
}

export interface ListScope {
  /** `org` lists the organisation's resources; otherwise the caller's own. */
  scope?: string;
  /** Team-scoped routes list only that team's resources. */
  teamId?: string;
}

/** The records a principal sees: its organisation's, its own unless scope=org, one team's on team-scoped routes. */
export function visibleTo<T extends Ownership>(items: T[], p: Principal, filter: ListScope): T[] {
  if (filter.scope !== undefined && filter.scope !== 'org')
    throw invalid(`scope '${filter.scope}' is not supported: use scope=org for your organisation's resources, or omit it for your own.`, { field: 'scope' });
  return items.filter(
    (x) => x.org_id === p.org_id && (filter.scope === 'org' || x.user_id === p.user_id) && (filter.teamId === undefined || x.team_id === filter.teamId),
  );
}

/** A supported base model by name, or a 400 naming the field and the supported ones. */
export function requireBaseModel(name: string, field: string) {
  const model = findBaseModel(name);
  if (!model)
    throw invalid(`${field} '${name}' is not a supported base model. Supported: ${supportedModelNames().join(', ')}.`, {
      field,
      supported: supportedModelNames(),
    });
  return model;
}

/** A run's max_seq_len or a sampler's max_seq_length: within the model's context; omitted, the model's maximum. */
export function checkSeqLength(requested: number | null | undefined, baseModel: string, field = 'max_seq_length'): number {
  const max = findBaseModel(baseModel)!.maxContextLength;
  // A declaration, defaulting to the model's maximum as documented: what a request actually sends is bounded by
  // this server's --max-seq-len-limit at that request (lengthLimit).
  const value = requested ?? max;
  if (value < 1 || value > max) throw invalid(`${field} ${value} is out of range for ${baseModel}: use 1..${max}, or omit it.`, { field });
  return value;
}

/** Newest first; records created in the same millisecond keep their reverse creation order (maps iterate in insertion order). */
export function newestFirst<T extends { created_at: number }>(items: T[]): T[] {
  return items.reverse().sort((a, b) => b.created_at - a.created_at);
}

export function owner(p: Ownership, teamId: string): Ownership {
  return { org_id: p.org_id, user_id: p.user_id, team_id: teamId };
}
