import type { Choice, GenerationResult } from '../core/inference.js';

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

/** The chunks of a streamed chat completion: the role first, then a chunk per token, then the finish, then usage if asked. */
export function chatChunks(r: GenerationResult): object[] {
  const head = { id: r.id, object: 'chat.completion.chunk', created: r.created, model: r.model };
  const out: object[] = [];
  for (const c of r.choices) {
    out.push({ ...head, choices: [{ index: c.index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] });
    const texts = pieces(c, r.decode);
    texts.forEach((t, i) => {
      const last = i === texts.length - 1;
      const lp = r.logprobs ? { content: [{ ...tokenEntry(t, c.logprobs[i]!), top_logprobs: (c.top?.[i] ?? []).map(([id, v]) => tokenEntry(r.decode([id]), v)) }] } : null;
      out.push({ ...head, choices: [{ index: c.index, delta: { content: t }, logprobs: lp, finish_reason: last ? c.finish_reason : null }] });
    });
    // No token (max_tokens reached at once, or only the end token): the finish comes alone.
    if (!texts.length) out.push({ ...head, choices: [{ index: c.index, delta: { content: '' }, logprobs: null, finish_reason: c.finish_reason }] });
  }
  if (r.includeUsage) out.push({ ...head, choices: [], usage: usage(r) });
  return out;
}

export function textCompletion(r: GenerationResult) {
  return {
    id: r.id,
    object: 'text_completion',
    created: r.created,
    model: r.model,
    choices: r.choices.map((c) => ({ index: c.index, text: c.text, logprobs: r.logprobs ? textLogprobs(c, r.decode) : null, finish_reason: c.finish_reason, stop_reason: null })),
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
    text_offset: texts.map((t) => (offset += t.length) - t.length),
  };
}

export function textChunks(r: GenerationResult): object[] {
  const head = { id: r.id, object: 'text_completion', created: r.created, model: r.model };
  const out: object[] = [];
  for (const c of r.choices) {
    const texts = pieces(c, r.decode);
    texts.forEach((t, i) => out.push({ ...head, choices: [{ index: c.index, text: t, logprobs: null, finish_reason: i === texts.length - 1 ? c.finish_reason : null, stop_reason: null }] }));
    if (!texts.length) out.push({ ...head, choices: [{ index: c.index, text: '', logprobs: null, finish_reason: c.finish_reason, stop_reason: null }] });
  }
  if (r.includeUsage) out.push({ ...head, choices: [], usage: usage(r) });
  return out;
}

export function sse(chunks: object[]): string {
  return chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join('') + 'data: [DONE]\n\n';
}
