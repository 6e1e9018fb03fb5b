import { findBaseModel, sampleSequences, StreamedText, zeroAdapter, type EnginePool, type LoraAdapter, type SampledSequence } from '../../models/index.js';
import { ChatTemplate } from '../../models/chat-template.js';
import type { Clock } from './clock.js';
import type { DeploymentLogs } from './deployment-logs.js';
import type { ModelDeployments } from './model-deployments.js';
import type { ModelDeploymentRecord, Principal } from './records.js';
import type { Settings } from './settings.js';
import { bad, chatInputs, InferenceError, type Json, object, type Sampling, samplingOf } from './inference-params.js';

export { InferenceError } from './inference-params.js';

/** A request checked: its sampling, and the adapter of the model it names. */
interface Generation extends Sampling {
  adapter: LoraAdapter;
  model: string;
}

export interface Choice {
  index: number;
  text: string;
  /** The generated tokens that make up `text` (a final end-of-sequence token left out, as vLLM does). */
  tokens: number[];
  logprobs: number[];
  top: [number, number][][] | null;
  finish_reason: 'stop' | 'length';
}

export interface GenerationResult {
  id: string;
  created: number;
  model: string;
  promptTokens: number[];
  choices: Choice[];
  stream: boolean;
  includeUsage: boolean;
  logprobs: boolean;
  /** The base model's decoder, for each token's own text. */
  decode: (ids: number[]) => string;
}

/** One choice's text that can be sent now, with the tokens drawn since its last delta (their logprobs when asked). */
export interface StreamDelta {
  index: number;
  text: string;
  tokens: { text: string; logprob: number; top: [number, number][] | null }[];
  /** Set on the choice's last delta. */
  finish_reason: 'stop' | 'length' | null;
}

/** A checked request to stream: `run` draws it, handing each delta out as soon as its tokens exist. */
export interface GenerationStream {
  id: string;
  created: number;
  model: string;
  n: number;
  promptTokens: number;
  includeUsage: boolean;
  logprobs: boolean;
  decode: (ids: number[]) => string;
  /** Resolves with the completion token count once every choice has finished; after `signal` aborts, no more work is done and it rejects. */
  run(emit: (delta: StreamDelta) => void, signal: AbortSignal): Promise<{ completionTokens: number }>;
}

/** What a chat or completion request becomes: its whole answer, or a stream to run. */
export type InferenceAnswer = { stream: false; result: GenerationResult } | { stream: true; events: GenerationStream };

/**
 * OpenAI-compatible inference on a deployed checkpoint, as vLLM's OpenAI
 * server does it: chat messages through the base model's own chat template,
 * sampling through the same engine path as the Loops sampler (so a greedy
 * answer equals the sampler's greedy `sample` of the same prompt ids), with
 * the checkpoint's adapter.
 */
export class Inference {
  private readonly templates = new Map<string, ChatTemplate | null>();
  /** Requests in flight per deployment, and each request's start with how many were in flight then (the metrics). */
  private readonly inFlight = new Map<string, number>();
  private readonly starts = new Map<string, { ts: number; concurrent: number }[]>();

  constructor(
    private readonly deployments: ModelDeployments,
    private readonly engines: EnginePool,
    private readonly clock: Clock,
    private readonly logs: DeploymentLogs,
    private readonly settings: Pick<Settings, 'maxTokensLimit' | 'maxSeqLenLimit' | 'maxSampledTokens'>,
  ) {}

  /** The deployment behind a URL, for this caller, serving: else what Baseten's edge answers. */
  target(p: Principal, modelId: string, deploymentId: string | undefined): ModelDeploymentRecord {
    const r = this.deployments.find(modelId, deploymentId);
    if (!r || r.org_id !== p.org_id)
      throw new InferenceError(404, `Model ${modelId}${deploymentId ? ` deployment ${deploymentId}` : ''} not found.`, null, true);
    const status = this.deployments.status(r);
    // Baseten: a deactivated deployment answers 404 until it is reactivated; one still starting, 503 (retry).
    if (status === 'INACTIVE')
      throw new InferenceError(
        404,
        `Deployment ${r.deployment_id} of model ${r.model_id} is deactivated: it serves no requests. Deploy the checkpoint again (POST /v1/loops/checkpoints/deploy).`,
        null,
        true,
      );
    if (status !== 'ACTIVE')
      throw new InferenceError(503, `Deployment ${r.deployment_id} of model ${r.model_id} is ${status}: not ready to serve yet, retry shortly.`, null, true);
    return r;
  }

  /** vLLM's `GET /v1/models`: each deployed checkpoint name (parent: the base model), then the base model. */
  models(r: ModelDeploymentRecord) {
    const created = Math.floor(r.created_at / 1000);
    const entry = (id: string, parent: string | null) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root: parent === null ? r.base_model : id,
      parent,
      max_model_len: this.maxLength(r),
    });
    return { object: 'list', data: [...this.deployments.checkpointsOf(r).map((c) => entry(c.name, r.base_model)), entry(r.base_model, null)] };
  }

  /** `POST /v1/chat/completions`: the messages rendered by the base model's chat template, then sampled. */
  async chat(r: ModelDeploymentRecord, body: unknown, id: string): Promise<InferenceAnswer> {
    const b = object(body);
    const { messages, tools, kwargs, addGenerationPrompt } = chatInputs(b);
    const template = this.template(r.base_model);
    let text: string;
    try {
      text = template.render(messages, { addGenerationPrompt, tools, kwargs });
    } catch (err) {
      throw bad('messages', `The chat template of ${r.base_model} could not render these messages: ${(err as Error).message}`);
    }
    const prompt = this.engines.tokenizers.get(r.base_model).encode(text);
    return this.answer(r, this.generation(r, b, prompt, 'chat'), id);
  }

  /** `POST /v1/completions`: a text or token-id prompt, sampled as is. */
  async complete(r: ModelDeploymentRecord, body: unknown, id: string): Promise<InferenceAnswer> {
    const b = object(body);
    const p = b.prompt;
    let prompt: number[];
    if (typeof p === 'string') prompt = this.engines.tokenizers.get(r.base_model).encode(p);
    else if (Array.isArray(p) && p.length > 0 && p.every((t) => Number.isInteger(t))) {
      const vocab = this.engines.vocabSize(r.base_model);
      const badToken = (p as number[]).findIndex((t) => t < 0 || t >= vocab);
      if (badToken >= 0) throw bad('prompt', `prompt[${badToken}] = ${p[badToken]} is not a token id of ${r.base_model} (0..${vocab - 1}).`);
      prompt = p as number[];
    } else throw bad('prompt', 'prompt must be a string or a non-empty list of token ids.');
    if (prompt.length === 0) throw bad('prompt', 'prompt is empty: send at least one token.');
    return this.answer(r, this.generation(r, b, prompt, 'completion'), id);
  }

  /** Requests started per step (inference_volume) and the most in flight at a start (model_concurrent_requests), from start to end; timestamps in epoch seconds. */
  metrics(r: ModelDeploymentRecord, startMs: number, endMs: number, stepMs: number) {
    const starts = this.starts.get(r.deployment_id) ?? [];
    const volume: { timestamp: number; value: number }[] = [];
    const concurrent: { timestamp: number; value: number }[] = [];
    for (let t = startMs; t < endMs; t += stepMs) {
      const inStep = starts.filter((x) => x.ts >= t && x.ts < t + stepMs);
      volume.push({ timestamp: t / 1000, value: inStep.length });
      concurrent.push({ timestamp: t / 1000, value: inStep.reduce((m, x) => Math.max(m, x.concurrent), 0) });
    }
    return { inference_volume: volume, model_concurrent_requests: concurrent };
  }

  /** The chat template of a base model's tokenizer files (the ones the Hub mirror serves). */
  template(baseModel: string): ChatTemplate {
    if (!this.templates.has(baseModel)) this.templates.set(baseModel, ChatTemplate.fromConfigFile(this.engines.tokenizers.files(baseModel).configJson));
    const t = this.templates.get(baseModel);
    if (!t) throw bad('messages', `${baseModel}'s tokenizer_config.json has no chat_template: use POST /v1/completions with a prompt.`);
    return t;
  }

  private maxLength(r: ModelDeploymentRecord): number {
    return Math.min(findBaseModel(r.base_model)?.maxContextLength ?? this.settings.maxSeqLenLimit, this.settings.maxSeqLenLimit);
  }

  private generation(r: ModelDeploymentRecord, b: Json, prompt: number[], kind: 'chat' | 'completion'): Generation {
    const model = b.model;
    if (typeof model !== 'string' || model === '')
      throw bad(
        'model',
        `model is required: a deployed checkpoint name (${this.deployments
          .checkpointsOf(r)
          .map((c) => c.name)
          .join(', ')}) or ${r.base_model}.`,
      );
    const names = this.deployments.checkpointsOf(r).map((c) => c.name);
    let adapter: LoraAdapter;
    if (model === r.base_model) adapter = zeroAdapter(this.engines.get(r.base_model).sites);
    else if (names.includes(model)) adapter = this.deployments.adapter(r, model);
    else
      throw new InferenceError(
        404,
        `The model \`${model}\` does not exist. This deployment serves ${[...names, r.base_model].join(', ')} (GET .../v1/models).`,
        'model',
      );

    return {
      adapter,
      model,
      ...samplingOf(b, prompt, kind, {
        maxLength: this.maxLength(r),
        maxTokensLimit: this.settings.maxTokensLimit,
        maxSampledTokens: this.settings.maxSampledTokens,
      }),
    };
  }

  private async answer(r: ModelDeploymentRecord, g: Generation, id: string): Promise<InferenceAnswer> {
    return g.stream ? { stream: true, events: this.stream(r, g, id) } : { stream: false, result: await this.run(r, g, id) };
  }

  /** Counts a request in flight (the metrics); returns how to count it out. */
  private begin(r: ModelDeploymentRecord): () => void {
    const busy = (this.inFlight.get(r.deployment_id) ?? 0) + 1;
    this.inFlight.set(r.deployment_id, busy);
    const starts = this.starts.get(r.deployment_id) ?? [];
    starts.push({ ts: this.clock.now(), concurrent: busy });
    // The newest 10000 starts per deployment are what range_model_metrics can count.
    if (starts.length > 10_000) starts.splice(0, starts.length - 10_000);
    this.starts.set(r.deployment_id, starts);
    return () => this.inFlight.set(r.deployment_id, (this.inFlight.get(r.deployment_id) ?? 1) - 1);
  }

  private async run(r: ModelDeploymentRecord, g: Generation, id: string): Promise<GenerationResult> {
    const engine = this.engines.get(r.base_model);
    const codec = this.engines.sampleCodec(r.base_model);
    const end = this.begin(r);
    let sequences: SampledSequence[];
    try {
      sequences = await sampleSequences(engine, g.adapter, g.prompt, g.n, g.params, codec);
    } finally {
      end();
    }
    const eos = new Set(codec.eosTokenIds);
    const choices: Choice[] = [];
    for (const [index, seq] of sequences.entries()) choices.push(await this.choice(r, g, seq, index, eos));
    const completion = choices.reduce((n, c) => n + c.tokens.length, 0);
    this.logs.add(r.deployment_id, 'INFO', `${g.model}: ${g.prompt.length} prompt tokens, ${completion} completion tokens`, 'inference', id);
    return {
      id,
      created: Math.floor(this.clock.now() / 1000),
      model: g.model,
      promptTokens: g.prompt,
      choices,
      stream: g.stream,
      includeUsage: g.includeUsage,
      logprobs: g.logprobs,
      decode: (ids) => codec.decode(ids),
    };
  }

  /**
   * A generation streamed token by token: each drawn token goes through its choice's StreamedText, and
   * whatever text that releases goes out at once, with the tokens drawn since (their logprobs, and their
   * top_logprobs scored on the sequence so far). The texts sent add up to the whole answer's.
   */
  private stream(r: ModelDeploymentRecord, g: Generation, id: string): GenerationStream {
    const engine = this.engines.get(r.base_model);
    const codec = this.engines.sampleCodec(r.base_model);
    const eos = new Set(codec.eosTokenIds);
    const decode = (ids: number[]) => codec.decode(ids);
    const run = async (emit: (delta: StreamDelta) => void, signal: AbortSignal) => {
      const texts = Array.from({ length: g.n }, () => new StreamedText(decode, g.stopStrings, eos));
      // Per choice: its tokens (a final end token left out, as in the whole answer), and those not yet sent.
      const kept: number[][] = Array.from({ length: g.n }, () => []);
      const pending: StreamDelta['tokens'][] = Array.from({ length: g.n }, () => []);
      const decodedLength = new Array<number>(g.n).fill(0);
      let completion = 0;
      const end = this.begin(r);
      try {
        await sampleSequences(engine, g.adapter, g.prompt, g.n, g.params, codec, {
          signal,
          onToken: async ({ index, token, logprob, finish_reason }) => {
            if (!eos.has(token)) {
              kept[index]!.push(token);
              completion++;
              if (g.logprobs) {
                // The token's own text: what it adds to the decoded sequence.
                const now = decode(kept[index]!);
                pending[index]!.push({ text: now.slice(decodedLength[index]), logprob, top: null });
                decodedLength[index] = now.length;
              }
            }
            const text = texts[index]!.push(token, finish_reason !== null);
            if (text === '' && finish_reason === null) return;
            const tokens = pending[index]!;
            pending[index] = [];
            if (g.topLogprobs > 0 && tokens.length) await this.topOf(r, g, kept[index]!, tokens);
            emit({ index, text, tokens, finish_reason });
          },
        });
      } catch (err) {
        if (signal.aborted)
          this.logs.add(
            r.deployment_id,
            'INFO',
            `${g.model}: ${g.prompt.length} prompt tokens, stream closed by the client after ${completion} completion tokens`,
            'inference',
            id,
          );
        throw err;
      } finally {
        end();
      }
      this.logs.add(r.deployment_id, 'INFO', `${g.model}: ${g.prompt.length} prompt tokens, ${completion} completion tokens`, 'inference', id);
      return { completionTokens: completion };
    };
    return {
      id,
      created: Math.floor(this.clock.now() / 1000),
      model: g.model,
      n: g.n,
      promptTokens: g.prompt.length,
      includeUsage: g.includeUsage,
      logprobs: g.logprobs,
      decode,
      run,
    };
  }

  /** Fills in the top_logprobs of a choice's newest `tokens` (the last of `kept`), scored on the prompt and `kept`. */
  private async topOf(r: ModelDeploymentRecord, g: Generation, kept: number[], tokens: StreamDelta['tokens']): Promise<void> {
    const all = [...g.prompt, ...kept];
    const { top: rows } = await this.engines.get(r.base_model).topk([{ tokens: all, targets: [...all.slice(1), 0] }], g.adapter, g.topLogprobs);
    const from = g.prompt.length - 1 + kept.length - tokens.length;
    tokens.forEach((t, k) => {
      const row = rows[0]![from + k]!;
      t.top = row.ids.map((tid, j) => [tid, row.logprobs[j]!] as [number, number]);
    });
  }

  /** One sequence as vLLM returns it: the end-of-sequence token and a matched stop string left out of the text. */
  private async choice(r: ModelDeploymentRecord, g: Generation, seq: SampledSequence, index: number, eos: Set<number>): Promise<Choice> {
    const codec = this.engines.sampleCodec(r.base_model);
    let tokens = seq.tokens;
    let logprobs = seq.logprobs;
    if (seq.stop_reason === 'stop' && tokens.length && eos.has(tokens.at(-1)!)) {
      tokens = tokens.slice(0, -1);
      logprobs = logprobs.slice(0, -1);
    }
    let text = codec.decode(tokens);
    for (const s of g.stopStrings) {
      const at = text.indexOf(s);
      if (at >= 0) text = text.slice(0, at);
    }
    let top: [number, number][][] | null = null;
    if (g.topLogprobs > 0 && tokens.length) {
      const all = [...g.prompt, ...tokens];
      const { top: rows } = await this.engines.get(r.base_model).topk([{ tokens: all, targets: [...all.slice(1), 0] }], g.adapter, g.topLogprobs);
      top = rows[0]!
        .slice(g.prompt.length - 1, g.prompt.length - 1 + tokens.length)
        .map((t) => t.ids.map((tid, j) => [tid, t.logprobs[j]!] as [number, number]));
    }
    return { index, text, tokens, logprobs, top, finish_reason: seq.stop_reason };
  }
}
