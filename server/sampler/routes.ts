import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { SAMPLING_DEFAULTS, type LoraAdapter, type SamplingParams } from '../../models/index.js';
import type { LoopsCore } from '../core/core.js';
import { invalid, LoopsError } from '../core/errors.js';
import type { SamplerRecord } from '../core/records.js';
import { FloorNotReached, samplerGate, type Served } from '../core/sampling.js';
import { sendError } from '../http/errors.js';
import { planeTargets } from '../http/plane.js';
import { ComputeLogprobsRequest, CompletionsRequest, SampleRequest, SamplerParams } from '../wire/sampler.js';

const STARTING = new Set(['BUILDING', 'DEPLOYING', 'LOADING_MODEL', 'WAKING_UP', 'UPDATING']);

/** The sampler of each sampler id at `sampler.base_url` = `{public_url}/sampler/{sampler_id}`. */
export function samplerPlaneRoutes(appIn: FastifyInstance, core: LoopsCore): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['sampler'];
  const targetOf = planeTargets(appIn, core, 'sampler');
  const target = (req: FastifyRequest) => targetOf(req).record;

  /** Refuses requests a stopped or starting sampler cannot serve; wakes a scaled-to-zero one. */
  const ready = (s: SamplerRecord, reply: FastifyReply) => {
    samplerGate(s);
    core.fleet.wakeSampler(s);
    if (STARTING.has(s.status) || s.status === 'SCALED_TO_ZERO') {
      reply.header('retry-after', '1');
      throw new LoopsError('unavailable', `Sampler ${s.id} is ${s.status}; retry shortly.`, { status: s.status, retry_after_s: 1 });
    }
    return s;
  };

  /** Serves within the floor of X-Min-Policy-Version, or answers 408 with the replicas' versions. */
  const served = async <T>(req: FastifyRequest, reply: FastifyReply, s: SamplerRecord, work: (a: LoraAdapter) => Promise<T>): Promise<Served<T> | null> => {
    const raw = req.headers['x-min-policy-version'];
    const text = Array.isArray(raw) ? raw[0] : raw;
    if (text !== undefined && !/^\d+$/.test(text.trim())) throw invalid(`X-Min-Policy-Version must be a whole number >= 0 (got '${text}').`, { field: 'X-Min-Policy-Version' });
    const floor = text === undefined ? undefined : Number(text);
    const affinity = req.headers['x-affinity-key'];
    try {
      const result = await core.sampling.serve(s, floor, Array.isArray(affinity) ? affinity[0] : affinity, work);
      reply.header('x-policy-version', String(result.policyVersion));
      reply.header('x-loops-mock-replica', String(result.replica));
      return result;
    } catch (err) {
      if (!(err instanceof FloorNotReached)) throw err;
      reply.header('retry-after', String(err.miss.retry_after_s));
      void sendError(reply, 408, 'policy_version_floor', err.message, { ...err.miss });
      return null;
    }
  };

  const params = (p: Omit<Partial<SamplingParams>, 'stop' | 'seed'> & { seed?: number | null; stop?: unknown }, promptLength: number, s: SamplerRecord): SamplingParams => {
    const merged = { ...SAMPLING_DEFAULTS, ...Object.fromEntries(Object.entries(p).filter(([, v]) => v !== undefined && v !== null)) } as SamplingParams;
    const stop = p.stop === undefined || p.stop === null ? [] : Array.isArray(p.stop) ? p.stop : [p.stop];
    const limit = Math.min(core.sampling.maxTokensLimit, s.max_seq_length - promptLength);
    if (merged.max_tokens > limit) throw invalid(`max_tokens ${merged.max_tokens} is over this sampler's limit of ${limit} (max_seq_length ${s.max_seq_length} minus the ${promptLength}-token prompt, at most ${core.sampling.maxTokensLimit}).`, { field: 'max_tokens' });
    if (merged.top_k === 0) throw invalid('top_k must be -1 (off) or at least 1.', { field: 'top_k' });
    return { ...merged, stop: stop as (string | number)[] };
  };


  /** Prompt logprobs (null at 0) and optionally the top-k tokens at each position. */
  const promptScores = async (s: SamplerRecord, adapter: LoraAdapter, tokens: number[], k: number) => {
    const engine = core.engines.get(s.base_model);
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
  };

  app.post('/sampler/:sampler_id/sample', {
    schema: { tags, summary: 'Sample num_samples continuations of a prompt (honours X-Min-Policy-Version and X-Affinity-Key)', params: SamplerParams, body: SampleRequest },
  }, async (req, reply) => {
    const s = ready(target(req), reply);
    const tokens = core.sampling.promptTokens(s, req.body.prompt);
    const sp = params(req.body.sampling_params ?? {}, tokens.length, s);
    const k = req.body.topk_prompt_logprobs ?? 0;
    const out = await served(req, reply, s, async (adapter) => {
      const sequences = await core.sampling.sample(s, adapter, tokens, req.body.num_samples ?? 1, sp);
      const scores = req.body.include_prompt_logprobs || k > 0 ? await promptScores(s, adapter, tokens, k) : null;
      return { sequences, scores };
    });
    if (!out) return reply;
    return {
      sequences: out.value.sequences,
      policy_version: out.policyVersion,
      ...(req.body.include_prompt_logprobs ? { prompt_logprobs: out.value.scores!.logprobs } : {}),
      ...(k > 0 ? { topk_prompt_logprobs: out.value.scores!.top } : {}),
    };
  });

  app.post('/sampler/:sampler_id/compute_logprobs', {
    schema: { tags, summary: 'Logprob of each prompt token given those before it (null at 0)', params: SamplerParams, body: ComputeLogprobsRequest },
  }, async (req, reply) => {
    const s = ready(target(req), reply);
    const tokens = core.sampling.promptTokens(s, req.body.prompt);
    const out = await served(req, reply, s, (adapter) => promptScores(s, adapter, tokens, 0));
    if (!out) return reply;
    return { logprobs: out.value.logprobs, policy_version: out.policyVersion };
  });

  app.post('/sampler/:sampler_id/v1/completions', {
    schema: { tags, summary: 'OpenAI/vLLM-compatible completions (text or token-id prompt)', params: SamplerParams, body: CompletionsRequest },
  }, async (req, reply) => {
    const s = ready(target(req), reply);
    const b = req.body;
    if (b.stream) throw invalid('stream is not supported by loops-mock: send stream: false (or omit it).', { field: 'stream' });
    if (b.model !== undefined && !modelIds(s).includes(b.model)) throw new LoopsError('not_found', `model '${b.model}' is not served here; GET ${'{sampler}'}/v1/models lists ${modelIds(s).join(', ')}.`, { field: 'model' });
    const tok = core.engines.tokenizers.get(s.base_model);
    const tokens = core.sampling.promptTokens(s, { chunks: [{ type: 'encoded_text', tokens: typeof b.prompt === 'string' ? tok.encode(b.prompt) : b.prompt }] });
    const sp = params({ max_tokens: b.max_tokens ?? 16, temperature: b.temperature ?? 1, top_p: b.top_p ?? 1, top_k: b.top_k ?? -1, seed: b.seed ?? null, stop: b.stop }, tokens.length, s);
    const wantLogprobs = b.logprobs !== undefined && b.logprobs !== null;
    const out = await served(req, reply, s, async (adapter) => ({
      sequences: await core.sampling.sample(s, adapter, tokens, b.n ?? 1, sp),
      prompt: b.echo && wantLogprobs ? await promptScores(s, adapter, tokens, 0) : null,
    }));
    if (!out) return reply;
    const promptText = b.echo ? (typeof b.prompt === 'string' ? b.prompt : tok.decode(tokens)) : '';
    const created = Math.floor(Date.now() / 1000);
    const choices = out.value.sequences.map((seq, index) => {
      const pieces = seq.tokens.map((t) => tok.decode([t]));
      const allTokens = b.echo ? [...tokens.map((t) => tok.decode([t])), ...pieces] : pieces;
      const allLogprobs = b.echo ? [...(out.value.prompt?.logprobs ?? tokens.map(() => null)), ...seq.logprobs] : seq.logprobs;
      let offset = 0;
      return {
        index,
        text: promptText + tok.decode(seq.tokens),
        logprobs: wantLogprobs ? { tokens: allTokens, token_logprobs: allLogprobs, top_logprobs: null, text_offset: allTokens.map((p) => (offset += p.length) - p.length) } : null,
        finish_reason: seq.stop_reason,
      };
    });
    const completion = out.value.sequences.reduce((n, q) => n + q.tokens.length, 0);
    return {
      id: `cmpl-${req.id}`,
      object: 'text_completion',
      created,
      model: b.model ?? s.base_model,
      choices,
      usage: { prompt_tokens: tokens.length, completion_tokens: completion, total_tokens: tokens.length + completion },
      policy_version: out.policyVersion,
    };
  });

  const modelIds = (s: SamplerRecord) => [s.base_model, ...core.sampling.liveVersions(s).map((v) => `${s.id}/policy-v${v}`)];

  app.get('/sampler/:sampler_id/v1/models', {
    schema: { tags, summary: 'Served models in vLLM\'s format: the base model (parent null) and each live adapter (parent = base model)', params: SamplerParams },
  }, (req) => {
    const s = target(req);
    samplerGate(s);
    const created = Math.floor(s.created_at / 1000);
    return {
      object: 'list',
      data: [
        { id: s.base_model, object: 'model', created, owned_by: 'loops-mock', root: s.base_model, parent: null, max_model_len: s.max_seq_length },
        ...core.sampling.liveVersions(s).map((v) => ({ id: `${s.id}/policy-v${v}`, object: 'model', created, owned_by: 'loops-mock', root: s.base_model, parent: s.base_model, max_model_len: s.max_seq_length })),
      ],
    };
  });

  app.get('/sampler/:sampler_id/policy_version', {
    schema: { tags, summary: "Each replica's live policy version, the highest, and the latest published", params: SamplerParams },
  }, (req) => {
    const s = target(req);
    samplerGate(s);
    const replicas = core.sampling.replicas(s);
    return { policy_version: Math.max(...replicas.map((r) => r.policy_version)), replicas, published_version: core.sampling.publishedVersion(s) };
  });

  app.get('/sampler/:sampler_id/health', {
    schema: { tags, summary: '200 while ACTIVE, 503 while starting (a scaled-to-zero sampler starts waking), 409 once stopped', params: SamplerParams },
  }, (req, reply) => {
    ready(target(req), reply);
    return { status: 'ok' };
  });
}
