// An inference request's parameters checked as vLLM's OpenAI server checks them: the body, chat messages, sampling fields and their limits.
import { STOP_MAX_CHARS, STOP_MAX_STRINGS, type SamplingParams } from '../../models/index.js';
import { MIN_TEMPERATURE } from './value-ranges.js';

/**
 * An error of the inference front door. `edge` ones are what Baseten's
 * gateway answers before a request reaches the model (`{"error": "<message>"}`);
 * the others are vLLM's OpenAI server's own, in OpenAI's shape.
 */
export class InferenceError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly edge = false,
  ) {
    super(message);
  }
}

export const bad = (param: string, message: string) => new InferenceError(400, message, param);

export type Json = Record<string, unknown>;

/** A request's sampling, checked: what vLLM's OpenAI server takes, in the engine's terms. */
export interface Sampling {
  prompt: number[];
  n: number;
  params: SamplingParams;
  stopStrings: string[];
  logprobs: boolean;
  topLogprobs: number;
  stream: boolean;
  includeUsage: boolean;
}

/** What bounds a request: the model's context, and the server's per-request limits. */
export interface SamplingLimits {
  maxLength: number;
  maxTokensLimit: number;
  maxSampledTokens: number;
}

/** A chat request's messages (text parts joined), tools, template variables and generation prompt, checked. */
export function chatInputs(b: Json): { messages: Json[]; tools: unknown[] | null; kwargs: Json | undefined; addGenerationPrompt: boolean } {
  const messages = b.messages;
  if (!Array.isArray(messages) || messages.length === 0) throw bad('messages', 'messages must be a non-empty list of {role, content} objects.');
  for (const [i, m] of messages.entries()) checkMessage(m, i);
  const tools = b.tools;
  if (tools !== undefined && tools !== null && !Array.isArray(tools))
    throw bad('tools', 'tools must be a list of {type: "function", function: {...}} objects.');
  const kwargs = b.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== 'object' || Array.isArray(kwargs)))
    throw bad('chat_template_kwargs', 'chat_template_kwargs must be an object of template variables (e.g. {"enable_thinking": false}).');
  const addGenerationPrompt = b.add_generation_prompt ?? true;
  if (typeof addGenerationPrompt !== 'boolean') throw bad('add_generation_prompt', 'add_generation_prompt must be true or false.');
  return { messages: messages.map(normalizeMessage), tools: tools as unknown[] | null, kwargs: kwargs as Json | undefined, addGenerationPrompt };
}

/** The sampling fields of a chat or completion body, checked against the prompt and the limits. */
export function samplingOf(b: Json, prompt: number[], kind: 'chat' | 'completion', limits: SamplingLimits): Sampling {
  const { maxLength, maxTokensLimit, maxSampledTokens } = limits;
  if (prompt.length >= maxLength) throw bad('messages', `The prompt is ${prompt.length} tokens; this model's maximum context length is ${maxLength}.`);
  const room = Math.min(maxTokensLimit, maxLength - prompt.length);
  const field = kind === 'chat' && b.max_completion_tokens !== undefined && b.max_completion_tokens !== null ? 'max_completion_tokens' : 'max_tokens';
  const maxTokens = optionalInt(b, field, 1, Infinity) ?? (kind === 'chat' ? room : 16);
  if (maxTokens > room)
    throw bad(
      field,
      `${field} ${maxTokens} is too large: the prompt is ${prompt.length} tokens of at most ${maxLength}, and one request may ask for at most ${maxTokensLimit}; ask for at most ${room}.`,
    );
  const temperature = optionalNumber(b, 'temperature', 0, 2) ?? 1;
  if (temperature > 0 && temperature < MIN_TEMPERATURE)
    throw bad('temperature', `temperature ${temperature} is too small to sample with: use 0 for greedy sampling, or at least ${MIN_TEMPERATURE}.`);
  const topP = optionalNumber(b, 'top_p', Number.MIN_VALUE, 1) ?? 1;
  const topKRaw = optionalInt(b, 'top_k', -1, Infinity) ?? -1;
  const n = optionalInt(b, 'n', 1, 16) ?? 1;
  // Each choice holds a cache of the prompt and its tokens (issue 31 item 13), as on the sampler.
  const positions = n * (prompt.length + maxTokens);
  if (positions > maxSampledTokens)
    throw bad(
      'n',
      `n ${n} × (the ${prompt.length}-token prompt + ${field} ${maxTokens}) is ${positions} positions; one request may hold at most ${maxSampledTokens} (the server's --max-sampled-tokens): ask for fewer choices or tokens.`,
    );
  const seed = optionalInt(b, 'seed', Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER) ?? null;
  const stop = b.stop;
  let stopStrings: string[] = [];
  if (typeof stop === 'string') stopStrings = [stop];
  else if (Array.isArray(stop) && stop.every((s) => typeof s === 'string')) stopStrings = stop as string[];
  else if (stop !== undefined && stop !== null) throw bad('stop', 'stop must be a string or a list of strings.');
  if (stopStrings.some((s) => s === '')) throw bad('stop', 'stop strings must not be empty.');
  if (stopStrings.length > STOP_MAX_STRINGS) throw bad('stop', `stop has ${stopStrings.length} strings; send at most ${STOP_MAX_STRINGS}.`);
  if (stopStrings.some((s) => s.length > STOP_MAX_CHARS)) throw bad('stop', `each stop string may have at most ${STOP_MAX_CHARS} characters.`);
  const stopTokenIds = b.stop_token_ids;
  if (stopTokenIds !== undefined && stopTokenIds !== null && !(Array.isArray(stopTokenIds) && stopTokenIds.every((t) => Number.isInteger(t))))
    throw bad('stop_token_ids', 'stop_token_ids must be a list of token ids.');
  let logprobs: boolean;
  let topLogprobs: number;
  if (kind === 'chat') {
    const lp = b.logprobs ?? false;
    if (typeof lp !== 'boolean') throw bad('logprobs', 'logprobs must be true or false (top_logprobs gives how many alternatives).');
    logprobs = lp;
    topLogprobs = optionalInt(b, 'top_logprobs', 0, 20) ?? 0;
    if (topLogprobs > 0 && !logprobs) throw bad('top_logprobs', 'top_logprobs needs logprobs: true.');
  } else {
    const lp = optionalInt(b, 'logprobs', 0, 20);
    logprobs = lp !== undefined;
    topLogprobs = lp ?? 0;
  }
  const stream = b.stream ?? false;
  if (typeof stream !== 'boolean') throw bad('stream', 'stream must be true or false.');
  const options = b.stream_options;
  if (options !== undefined && options !== null && (typeof options !== 'object' || Array.isArray(options)))
    throw bad('stream_options', 'stream_options must be an object like {"include_usage": true}.');
  if (options && !stream) throw bad('stream_options', 'stream_options is only allowed with stream: true.');
  const includeUsage = (options as Json | null | undefined)?.include_usage === true;
  return {
    prompt,
    n,
    stopStrings,
    logprobs,
    topLogprobs,
    stream,
    includeUsage,
    // vLLM: top_k 0 or -1 is off.
    params: {
      max_tokens: maxTokens,
      temperature,
      top_p: topP,
      top_k: topKRaw === 0 ? -1 : topKRaw,
      seed,
      stop: [...stopStrings, ...((stopTokenIds as number[] | undefined) ?? [])],
    },
  };
}

export function object(body: unknown): Json {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw bad('body', 'The request body must be a JSON object.');
  return body as Json;
}

const ROLES = new Set(['system', 'developer', 'user', 'assistant', 'tool']);

function checkMessage(m: unknown, i: number): void {
  const field = `messages[${i}]`;
  if (typeof m !== 'object' || m === null || Array.isArray(m)) throw bad(field, `${field} must be an object {role, content}.`);
  const { role, content } = m as Json;
  if (typeof role !== 'string' || !ROLES.has(role))
    throw bad(`${field}.role`, `${field}.role must be one of ${[...ROLES].join(', ')} (got ${JSON.stringify(role)}).`);
  const parts =
    Array.isArray(content) && content.every((c) => typeof c === 'object' && c !== null && (c as Json).type === 'text' && typeof (c as Json).text === 'string');
  const assistantWithTools = role === 'assistant' && (content === null || content === undefined) && Array.isArray((m as Json).tool_calls);
  if (typeof content !== 'string' && !parts && !assistantWithTools)
    throw bad(`${field}.content`, `${field}.content must be a string or a list of {type: "text", text} parts.`);
}

/** Text parts joined into one string, as vLLM hands string content to a text-only template. */
function normalizeMessage(m: unknown): Json {
  const msg = { ...(m as Json) };
  if (Array.isArray(msg.content)) msg.content = (msg.content as Json[]).map((p) => p.text as string).join('\n');
  return msg;
}

function optionalNumber(b: Json, field: string, min: number, max: number): number | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max)
    throw bad(field, `${field} must be a number in [${min === Number.MIN_VALUE ? '0 (exclusive)' : min}, ${max}] (got ${JSON.stringify(v)}).`);
  return v;
}

function optionalInt(b: Json, field: string, min: number, max: number): number | undefined {
  const v = b[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
    throw bad(field, `${field} must be a whole number${max === Infinity ? ` of at least ${min}` : ` in ${min}..${max}`} (got ${JSON.stringify(v)}).`);
  return v;
}
