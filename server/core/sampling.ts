import { SAMPLING_DEFAULTS, sampleSequences, type EnginePool, type LoraAdapter, type SampledSequence, type SamplingParams } from '../../models/index.js';
import type { CompletionsBody, SampleBody, SamplingParamsWire } from '../wire/sampler.js';
import type { Clock } from './clock.js';
import { invalid, LoopsError } from './errors.js';
import type { Fleet } from './fleet.js';
import { imageRule, modelInputTokens, type ModelInputWire } from './model-input.js';
import type { SamplerRecord } from './records.js';
import type { SamplerReplicas, Served } from './replicas.js';
import type { Settings } from './settings.js';
import { checkTemperature } from './value-ranges.js';

/** What a sampling request asks of the replicas: a version floor (X-Min-Policy-Version) and an affinity key (X-Affinity-Key). */
export interface Pin {
  floor?: number;
  affinityKey?: string;
}

const STARTING = new Set(['BUILDING', 'DEPLOYING', 'LOADING_MODEL', 'WAKING_UP', 'UPDATING']);

/**
 * What the sampler plane does for each request: readiness, sampling
 * parameters with their defaults and limits, the prompt's tokens, sampling
 * and scoring on the replica that meets the request's floor, and the
 * OpenAI-style completion. The door only reads headers and shapes replies.
 */
export class Sampling {
  constructor(
    private readonly fleet: Fleet,
    private readonly replicas: SamplerReplicas,
    private readonly engines: EnginePool,
    private readonly clock: Clock,
    private readonly settings: Pick<Settings, 'maxTokensLimit' | 'maxSampledTokens'>,
  ) {}

  /** Refuses what a stopped sampler cannot serve (409) and, while it starts, answers 503 with a retry; a scaled-to-zero one starts waking. */
  ready(s: SamplerRecord): void {
    samplerGate(s);
    this.fleet.wakeSampler(s);
    if (STARTING.has(s.status) || s.status === 'SCALED_TO_ZERO') {
      throw new LoopsError('unavailable', `Sampler ${s.id} is ${s.status}; retry shortly.`, { status: s.status, retry_after_s: 1 });
    }
  }

  /** `num_samples` continuations of a prompt, with prompt logprobs (and their top k) when asked. */
  async sample(s: SamplerRecord, body: SampleBody, pin: Pin) {
    this.ready(s);
    const tokens = this.promptTokens(s, body.prompt);
    const params = this.params(s, body.sampling_params ?? {}, tokens.length, 'sampling_params.');
    this.checkWork(body.num_samples ?? 1, 'num_samples', tokens.length, params.max_tokens);
    const k = body.topk_prompt_logprobs ?? 0;
    const served = await this.replicas.serve(s, pin.floor, pin.affinityKey, async (adapter) => ({
      sequences: await this.draw(s, adapter, tokens, body.num_samples ?? 1, params),
      scores: body.include_prompt_logprobs || k > 0 ? await this.promptScores(s, adapter, tokens, k) : null,
    }));
    return withVersion(served, {
      sequences: served.value.sequences,
      policy_version: served.policyVersion,
      prompt_token_ids: tokens,
      ...(body.include_prompt_logprobs ? { prompt_logprobs: served.value.scores!.logprobs } : {}),
      ...(k > 0 ? { topk_prompt_logprobs: served.value.scores!.top } : {}),
    });
  }

  /** The logprob of each prompt token given those before it (null at 0). */
  async computeLogprobs(s: SamplerRecord, prompt: ModelInputWire, pin: Pin) {
    this.ready(s);
    const tokens = this.promptTokens(s, prompt);
    const served = await this.replicas.serve(s, pin.floor, pin.affinityKey, (adapter) => this.promptScores(s, adapter, tokens, 0));
    return withVersion(served, { logprobs: served.value.logprobs, policy_version: served.policyVersion });
  }

  /** An OpenAI/vLLM `text_completion` object; `id` is the completion's id. */
  async complete(s: SamplerRecord, body: CompletionsBody, id: string, pin: Pin) {
    this.ready(s);
    if (body.stream) throw invalid('stream is not supported by loops-mock: send stream: false (or omit it).', { field: 'stream' });
    const served = this.modelIds(s);
    if (body.model !== undefined && !served.includes(body.model))
      throw new LoopsError('not_found', `model '${body.model}' is not served here; GET {sampler}/v1/models lists ${served.join(', ')}.`, { field: 'model' });
    const tok = this.engines.tokenizers.get(s.base_model);
    const tokens = this.promptTokens(s, {
      chunks: [{ type: 'encoded_text', tokens: typeof body.prompt === 'string' ? tok.encode(body.prompt) : body.prompt }],
    });
    const params = this.params(
      s,
      {
        max_tokens: body.max_tokens ?? 16,
        temperature: body.temperature ?? 1,
        top_p: body.top_p ?? 1,
        top_k: body.top_k ?? -1,
        seed: body.seed ?? null,
        stop: body.stop,
      },
      tokens.length,
      '',
    );
    this.checkWork(body.n ?? 1, 'n', tokens.length, params.max_tokens);
    const wantLogprobs = body.logprobs !== undefined && body.logprobs !== null;
    const result = await this.replicas.serve(s, pin.floor, pin.affinityKey, async (adapter) => ({
      sequences: await this.draw(s, adapter, tokens, body.n ?? 1, params),
      prompt: body.echo && wantLogprobs ? await this.promptScores(s, adapter, tokens, 0) : null,
    }));
    const { sequences, prompt } = result.value;
    const promptText = body.echo ? (typeof body.prompt === 'string' ? body.prompt : tok.decode(tokens)) : '';
    const choices = sequences.map((seq, index) => {
      const pieces = seq.tokens.map((t) => tok.decode([t]));
      const allTokens = body.echo ? [...tokens.map((t) => tok.decode([t])), ...pieces] : pieces;
      const allLogprobs = body.echo ? [...(prompt?.logprobs ?? tokens.map(() => null)), ...seq.logprobs] : seq.logprobs;
      let offset = 0;
      return {
        index,
        text: promptText + tok.decode(seq.tokens),
        logprobs: wantLogprobs
          ? {
              tokens: allTokens,
              token_logprobs: allLogprobs,
              top_logprobs: null,
              text_offset: allTokens.map((p) => {
                const start = offset;
                offset += p.length;
                return start;
              }),
            }
          : null,
        finish_reason: seq.stop_reason,
      };
    });
    const completion = sequences.reduce((n, q) => n + q.tokens.length, 0);
    return withVersion(result, {
      id,
      object: 'text_completion',
      created: Math.floor(this.clock.now() / 1000),
      model: body.model ?? s.base_model,
      choices,
      usage: { prompt_tokens: tokens.length, completion_tokens: completion, total_tokens: tokens.length + completion },
      policy_version: result.policyVersion,
    });
  }

  /** Served models in vLLM's format: the base model (parent null) and each live adapter (parent = base model). */
  models(s: SamplerRecord) {
    samplerGate(s);
    const created = Math.floor(s.created_at / 1000);
    const entry = (id: string, parent: string | null) => ({
      id,
      object: 'model',
      created,
      owned_by: 'loops-mock',
      root: s.base_model,
      parent,
      max_model_len: s.max_seq_length,
    });
    return { object: 'list', data: [entry(s.base_model, null), ...this.replicas.liveVersions(s).map((v) => entry(adapterModelId(s, v), s.base_model))] };
  }

  /** Each replica's live policy version, the highest, and the latest published. */
  policyVersions(s: SamplerRecord) {
    samplerGate(s);
    const replicas = this.replicas.replicas(s);
    return { policy_version: Math.max(...replicas.map((r) => r.policy_version)), replicas, published_version: this.replicas.publishedVersion(s) };
  }

  private modelIds(s: SamplerRecord): string[] {
    return [s.base_model, ...this.replicas.liveVersions(s).map((v) => adapterModelId(s, v))];
  }

  /** The request's sampling parameters over the SDK's defaults, within the sampler's token budget. */
  private params(s: SamplerRecord, given: SamplingParamsWire, promptLength: number, at: string): SamplingParams {
    const set = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined && v !== null));
    const merged = { ...SAMPLING_DEFAULTS, ...set } as SamplingParams;
    const stop = given.stop === undefined || given.stop === null ? [] : Array.isArray(given.stop) ? given.stop : [given.stop];
    const cap = this.settings.maxTokensLimit;
    const length = this.fleet.lengthLimit(s.max_seq_length, "sampler's max_seq_length").maxLength;
    const limit = Math.min(cap, length - promptLength);
    if (merged.max_tokens > limit)
      throw invalid(
        `max_tokens ${merged.max_tokens} is over this sampler's limit of ${limit} (max_seq_length ${length} minus the ${promptLength}-token prompt, at most ${cap}).`,
        { field: 'max_tokens' },
      );
    if (merged.top_k === 0) throw invalid('top_k must be -1 (off) or at least 1.', { field: 'top_k' });
    checkTemperature(merged.temperature, `${at}temperature`);
    return { ...merged, stop };
  }

  /** Every sample holds a cache of its prompt and the tokens it draws: their product is bounded (issue 31 item 13). */
  private checkWork(samples: number, field: string, promptLength: number, maxTokens: number): void {
    checkSampledTokens(samples, field, promptLength, maxTokens, this.settings.maxSampledTokens);
  }

  /** A prompt's tokens, checked against the sampler's model and max_seq_length. */
  private promptTokens(s: SamplerRecord, prompt: ModelInputWire): number[] {
    return modelInputTokens(prompt, 'prompt', {
      vocabulary: { size: this.engines.vocabSize(s.base_model), model: s.base_model },
      ...this.fleet.lengthLimit(s.max_seq_length, "sampler's max_seq_length"),
      images: () => imageRule(this.engines, s.base_model),
    });
  }

  private draw(s: SamplerRecord, adapter: LoraAdapter, prompt: number[], n: number, params: SamplingParams): Promise<SampledSequence[]> {
    return sampleSequences(this.engines.get(s.base_model), adapter, prompt, n, params, this.engines.sampleCodec(s.base_model));
  }

  /** Prompt logprobs (null at 0) and, with k > 0, the top-k tokens at each position. */
  private async promptScores(s: SamplerRecord, adapter: LoraAdapter, tokens: number[], k: number) {
    const engine = this.engines.get(s.base_model);
    const seq = { tokens, targets: [...tokens.slice(1), 0] };
    if (k > 0) {
      const { logprobs, top } = await engine.topk([seq], adapter, k);
      return {
        logprobs: [null, ...Array.from(logprobs[0]!.subarray(0, tokens.length - 1))],
        top: [null, ...top[0]!.slice(0, tokens.length - 1).map((t) => t.ids.map((id, j) => [id, t.logprobs[j]!] as [number, number]))],
      };
    }
    const [lp] = await engine.forward([{ ...seq, scored: tokens.slice(1).map((_, i) => i) }], adapter);
    return { logprobs: [null, ...Array.from(lp!.subarray(0, tokens.length - 1))], top: null };
  }
}

/** samples × (prompt + max_tokens) within --max-sampled-tokens: the positions a request's sequences hold at once. */
export function checkSampledTokens(samples: number, field: string, promptLength: number, maxTokens: number, limit: number): void {
  const positions = samples * (promptLength + maxTokens);
  if (positions <= limit) return;
  const most = Math.floor(limit / (promptLength + maxTokens));
  throw invalid(
    `${field} ${samples} × (the ${promptLength}-token prompt + max_tokens ${maxTokens}) is ${positions} positions; one request may hold at most ${limit} (the server's --max-sampled-tokens): ${most > 0 ? `ask for at most ${most} at this length, or` : 'shorten the prompt or max_tokens, or'} send several requests.`,
    { field, limit: 'max_sampled_tokens', limit_value: limit },
  );
}

/** A reply and the replica that served it (the door puts both into headers). */
export interface ServedReply<T> {
  reply: T;
  policyVersion: number;
  replica: number;
}

function withVersion<T>(served: Served<unknown>, reply: T): ServedReply<T> {
  return { reply, policyVersion: served.policyVersion, replica: served.replica };
}

function adapterModelId(s: SamplerRecord, version: number): string {
  return `${s.id}/policy-v${version}`;
}

/** A stopped or deleted sampler serves nothing: 409 naming what to do instead. */
export function samplerGate(s: SamplerRecord): void {
  if (s.deleted || s.status === 'INACTIVE' || s.status === 'DEACTIVATING' || s.status === 'FAILED') {
    throw new LoopsError(
      'conflict',
      `Sampler ${s.id} is ${s.deleted ? 'deleted' : s.status}: it no longer serves requests. Create a new sampler (POST /v1/loops/samplers).`,
      { type_detail: 'sampler_inactive', sampler_id: s.id },
    );
  }
}
