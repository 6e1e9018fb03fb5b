import type { Choice, GenerationResult, GenerationStream, StreamDelta } from '../core/inference.js';

/**
 * OpenAI's response objects as vLLM's OpenAI server writes them
 * (`chat.completion`, `chat.completion.chunk`, `text_completion`), from a
 * generation the core ran. Token texts come from the decoder the engine
 * samples with.
 */

export type Decode = (ids: number[]) => string;

function usage(r: GenerationResult) {
  const completion = r.choices.reduce((n, c) => n + c.tokens.length, 0);
  return { prompt_tokens: r.promptTokens.length, completion_tokens: completion, total_tokens: r.promptTokens.length + completion, prompt_tokens_details: null };
}

/**
 * Each generated token's own text: the decoded text grown by that token (so
 * multi-byte characters land whole), cut where the choice's text ends (a
 * matched stop string is not sent, as in the whole answer).
 */
export function pieces(c: Choice, decode: Decode): string[] {
  const out: string[] = [];
  let before = '';
  for (let i = 0; i < c.tokens.length && before.length < c.text.length; i++) {
    const now = decode(c.tokens.slice(0, i + 1)).slice(0, c.text.length);
    out.push(now.startsWith(before) ? now.slice(before.length) : now);
    before = now;
  }
  return out;
}

function tokenEntry(text: string, logprob: number) {
  return { token: text, logprob, bytes: [...Buffer.from(text, 'utf8')] };
}

function chatLogprobs(c: Choice, decode: Decode) {
  const texts = pieces(c, decode);
  return {
    content: texts.map((t, i) => ({
      ...tokenEntry(t, c.logprobs[i]!),
      top_logprobs: (c.top?.[i] ?? []).map(([id, lp]) => tokenEntry(decode([id]), lp)),
    })),
  };
}

export function chatCompletion(r: GenerationResult) {
  return {
    id: r.id,
    object: 'chat.completion',
    created: r.created,
    model: r.model,
    choices: r.choices.map((c) => ({
      index: c.index,
      message: { role: 'assistant', content: c.text, reasoning_content: null, tool_calls: [] },
      logprobs: r.logprobs ? chatLogprobs(c, r.decode) : null,
      finish_reason: c.finish_reason,
      stop_reason: null,
    })),
    usage: usage(r),
    prompt_logprobs: null,
  };
}

export function textCompletion(r: GenerationResult) {
  return {
    id: r.id,
    object: 'text_completion',
    created: r.created,
    model: r.model,
    choices: r.choices.map((c) => ({
      index: c.index,
      text: c.text,
      logprobs: r.logprobs ? textLogprobs(c, r.decode) : null,
      finish_reason: c.finish_reason,
      stop_reason: null,
    })),
    usage: usage(r),
  };
}

function textLogprobs(c: Choice, decode: Decode) {
  const texts = pieces(c, decode);
  let offset = 0;
  return {
    tokens: texts,
    token_logprobs: c.logprobs.slice(0, texts.length),
    top_logprobs: c.top ? c.top.map((row) => Object.fromEntries(row.map(([id, lp]) => [decode([id]), lp]))) : null,
    text_offset: texts.map((t) => {
      const start = offset;
      offset += t.length;
      return start;
    }),
  };
}

/** The streamed chunks, as vLLM writes them, of a generation the core runs token by token. */
export const streamChunks = {
  /** Before any token: each chat choice's role (completions have none). */
  start(s: GenerationStream, kind: 'chat' | 'completion'): object[] {
    if (kind === 'completion') return [];
    return Array.from({ length: s.n }, (_, index) => ({
      ...chatHead(s),
      choices: [{ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
    }));
  },

  /** One choice's text that can be sent now, its tokens' logprobs when asked; the finish on its last. */
  delta(s: GenerationStream, kind: 'chat' | 'completion', d: StreamDelta): object {
    if (kind === 'chat') {
      const logprobs = s.logprobs
        ? {
            content: d.tokens.map((t) => ({ ...tokenEntry(t.text, t.logprob), top_logprobs: (t.top ?? []).map(([id, lp]) => tokenEntry(s.decode([id]), lp)) })),
          }
        : null;
      return { ...chatHead(s), choices: [{ index: d.index, delta: { content: d.text }, logprobs, finish_reason: d.finish_reason }] };
    }
    const logprobs = s.logprobs
      ? {
          tokens: d.tokens.map((t) => t.text),
          token_logprobs: d.tokens.map((t) => t.logprob),
          top_logprobs: d.tokens.map((t) => Object.fromEntries((t.top ?? []).map(([id, lp]) => [s.decode([id]), lp]))),
        }
      : null;
    return { ...textHead(s), choices: [{ index: d.index, text: d.text, logprobs, finish_reason: d.finish_reason, stop_reason: null }] };
  },

  /** After every choice's finish, when stream_options.include_usage asked for it. */
  usage(s: GenerationStream, kind: 'chat' | 'completion', completionTokens: number): object {
    const head = kind === 'chat' ? chatHead(s) : textHead(s);
    return {
      ...head,
      choices: [],
      usage: {
        prompt_tokens: s.promptTokens,
        completion_tokens: completionTokens,
        total_tokens: s.promptTokens + completionTokens,
        prompt_tokens_details: null,
      },
    };
  },
};

const chatHead = (s: GenerationStream) => ({ id: s.id, object: 'chat.completion.chunk', created: s.created, model: s.model });
const textHead = (s: GenerationStream) => ({ id: s.id, object: 'text_completion', created: s.created, model: s.model });

/** One server-sent event, vLLM's way: a `data:` line and a blank line. */
export function event(data: object | '[DONE]'): string {
  return `data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`;
}
