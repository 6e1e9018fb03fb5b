import { Template } from '@huggingface/jinja';
import { readFileSync } from 'node:fs';

/**
 * A base model's own chat template (the `chat_template` of its
 * tokenizer_config.json), rendered with a Jinja implementation made for chat
 * templates, with the variables transformers' `apply_chat_template` passes:
 * `messages`, `tools`, `add_generation_prompt`, the special tokens, and any
 * `chat_template_kwargs` (Qwen3's `enable_thinking`, for one).
 */
export class ChatTemplate {
  private readonly template: Template;

  constructor(
    readonly source: string,
    private readonly specials: Record<string, string | null>,
  ) {
    this.template = new Template(source);
  }

  /** The template of a tokenizer_config.json, or null when it has none. */
  static fromConfigFile(configPath: string | null): ChatTemplate | null {
    if (!configPath) return null;
    const config = JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>;
    const raw = config.chat_template;
    // A list of named templates: the one called `default`, as transformers picks it.
    const text =
      typeof raw === 'string'
        ? raw
        : Array.isArray(raw)
          ? (raw as { name: string; template: string }[]).find((t) => t.name === 'default')?.template
          : undefined;
    if (!text) return null;
    const tokenText = (t: unknown) => (typeof t === 'string' ? t : ((t as { content?: string } | null)?.content ?? null));
    return new ChatTemplate(text, {
      bos_token: tokenText(config.bos_token),
      eos_token: tokenText(config.eos_token),
      pad_token: tokenText(config.pad_token),
      unk_token: tokenText(config.unk_token),
    });
  }

  render(messages: unknown[], options: { addGenerationPrompt: boolean; tools?: unknown[] | null; kwargs?: Record<string, unknown> }): string {
    return this.template.render({
      ...this.specials,
      ...(options.kwargs ?? {}),
      messages,
      ...(options.tools ? { tools: options.tools } : {}),
      add_generation_prompt: options.addGenerationPrompt,
    });
  }
}
