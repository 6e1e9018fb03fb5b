import { FAMILY_IMAGE_PLACEHOLDER, findBaseModel, MAX_IMAGE_TOKENS, visionModelNames, type EnginePool } from '../../models/index.js';
import { invalid } from './errors.js';

/** A chunk as the wire brings it: `encoded_text` (tokens) or `image` (data, format, expected_tokens). */
export interface ModelInputChunkWire {
  type: string;
  tokens?: number[];
  data?: string;
  format?: string;
  expected_tokens?: number | null;
  [field: string]: unknown;
}

/** The wire's ModelInput. */
export interface ModelInputWire {
  chunks: ModelInputChunkWire[];
}

/** How a model takes image chunks: the id each of an image's positions is fed as, or why it takes none. */
export type ImageRule = { model: string; placeholder: number } | { model: string; refusal: string };

/**
 * A model's image rule. A vision model's image occupies `expected_tokens`
 * positions, each its placeholder token: the shipped family's id, or the
 * model's own placeholder found by name in a tokenizer file the user gave.
 */
export function imageRule(engines: Pick<EnginePool, 'tokenizers'>, model: string): ImageRule {
  const info = findBaseModel(model);
  if (!info?.supportsVisionLanguage || !info.imagePlaceholder) {
    return {
      model,
      refusal: `${model} takes text only; image chunks go to the vision-language models (supports_vision_language in GET /v1/loops/capabilities): ${visionModelNames().join(', ')}.`,
    };
  }
  const files = engines.tokenizers.files(model);
  if (files.family) return { model, placeholder: FAMILY_IMAGE_PLACEHOLDER[files.family].id };
  const ids = engines.tokenizers.get(model).encode(info.imagePlaceholder);
  if (ids.length === 1) return { model, placeholder: ids[0]! };
  return {
    model,
    refusal: `${model}'s tokenizer (${files.source}) has no ${info.imagePlaceholder} token to feed an image's positions as; give a tokenizer.json that has it, or send text.`,
  };
}

const IMAGE_FIELDS = new Set(['type', 'data', 'format', 'expected_tokens']);
const MAGIC: Record<'png' | 'jpeg', number[]> = { png: [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], jpeg: [0xff, 0xd8, 0xff] };

/** Standard base64 with its padding, checked in one pass (a pattern with repetition backtracks over megabytes). */
function isBase64(s: string): boolean {
  if (!s.length || s.length % 4 !== 0 || /[^A-Za-z0-9+/=]/.test(s)) return false;
  const pad = s.indexOf('=');
  return pad < 0 || (pad >= s.length - 2 && (pad === s.length - 1 || s[s.length - 1] === '='));
}

/** Which of the two formats the bytes are, by their magic number; null for neither. */
function sniff(head: Buffer): 'png' | 'jpeg' | null {
  for (const [format, magic] of Object.entries(MAGIC) as ['png' | 'jpeg', number[]][]) {
    if (magic.every((b, i) => head[i] === b)) return format;
  }
  return null;
}

/** An image chunk's positions, after checking its payload: known fields, format, base64 data of that format, expected_tokens. */
function imagePositions(chunk: ModelInputChunkWire, at: string, rule: ImageRule): number {
  if ('refusal' in rule) throw invalid(`${at} is an 'image' chunk: ${rule.refusal}`, { field: `${at}.type` });
  const extra = Object.keys(chunk).find((k) => !IMAGE_FIELDS.has(k));
  if (extra)
    throw invalid(`${at}.${extra} is not a field of an image chunk: it takes data (base64), format ('png' or 'jpeg') and expected_tokens.`, {
      field: `${at}.${extra}`,
    });
  const { format, data, expected_tokens: positions } = chunk;
  if (format !== 'png' && format !== 'jpeg')
    throw invalid(`${at}.format must be 'png' or 'jpeg' (got ${JSON.stringify(format ?? null)}).`, { field: `${at}.format` });
  if (typeof data !== 'string' || !isBase64(data))
    throw invalid(`${at}.data must be the image's bytes in standard base64 (A-Z, a-z, 0-9, +, /, padded with = to a multiple of 4 characters).`, {
      field: `${at}.data`,
    });
  const found = sniff(Buffer.from(data.slice(0, 12), 'base64'));
  if (!found)
    throw invalid(
      `${at}.data is neither a PNG nor a JPEG image (its bytes start ${Buffer.from(data.slice(0, 8), 'base64').toString('hex')}); send one of those.`,
      { field: `${at}.data` },
    );
  if (found !== format)
    throw invalid(`${at}.data holds a ${found.toUpperCase()} image but format is '${format}': set format to '${found}'.`, { field: `${at}.format` });
  if (positions === undefined || positions === null) {
    throw invalid(
      `${at}.expected_tokens is required: loops-mock runs no vision processor to count an image's tokens, so the image takes exactly expected_tokens positions; set it to the count your processor gives for this image.`,
      { field: `${at}.expected_tokens` },
    );
  }
  if (!Number.isInteger(positions) || positions < 1 || positions > MAX_IMAGE_TOKENS) {
    throw invalid(`${at}.expected_tokens must be an integer from 1 to ${MAX_IMAGE_TOKENS} (got ${positions}).`, { field: `${at}.expected_tokens` });
  }
  return positions;
}

/**
 * The positions a ModelInput says it has, from its chunks' sizes alone (ids and images unread), and how many of
 * them are images'; checked in full by modelInputTokens (an image whose expected_tokens is out of range counts
 * nothing here, so that its own check names it).
 */
export function declaredPositions(input: ModelInputWire): { positions: number; images: number } {
  let positions = 0;
  let images = 0;
  for (const c of input.chunks) {
    if (c.type === 'image') {
      const n = c.expected_tokens;
      if (Number.isInteger(n) && n! >= 1 && n! <= MAX_IMAGE_TOKENS) images += n!;
    } else if (Array.isArray(c.tokens)) positions += c.tokens.length;
  }
  return { positions: positions + images, images };
}

/** "N tokens" with, where images take some, how many. */
export function tokenCount(n: { positions: number; images: number }): string {
  return `${n.positions} tokens${n.images ? ` (${n.images} of them image positions)` : ''}`;
}

/**
 * The token ids of a ModelInput, checked for what both planes need: text and
 * image chunks (an image is `expected_tokens` of its model's placeholder id;
 * `images` is asked only when one comes), at least one position, and no more
 * than `maxLength`; with `vocabulary`, every id inside it (training data has
 * its ids checked with the rest of the datum, by checkTrainingData). `field`
 * names the input in errors.
 */
export function modelInputTokens(
  input: ModelInputWire,
  field: string,
  limits: { maxLength: number; lengthName: string; images: () => ImageRule; vocabulary?: { size: number; model: string } },
): number[] {
  // The length first, from the chunks' sizes alone: a body of millions of ids is refused before any is copied
  // or looked at (issue 31 item 15).
  const declared = declaredPositions(input);
  if (declared.positions > limits.maxLength) throw invalid(`${field} has ${tokenCount(declared)}; the ${limits.lengthName} is ${limits.maxLength}.`, { field });
  const tokens: number[] = [];
  let imagePositionCount = 0;
  let rule: ImageRule | undefined;
  input.chunks.forEach((chunk, c) => {
    const at = `${field}.chunks[${c}]`;
    if (chunk.type === 'image') {
      rule ??= limits.images();
      const n = imagePositions(chunk, at, rule);
      const placeholder = (rule as { placeholder: number }).placeholder;
      for (let i = 0; i < n; i++) tokens.push(placeholder);
      imagePositionCount += n;
      return;
    }
    if (chunk.type !== 'encoded_text' || !chunk.tokens) {
      throw invalid(
        `${at} is a '${chunk.type}' chunk: loops-mock takes {"type": "encoded_text", "tokens": [...]} and, on vision-language models, {"type": "image", "data", "format", "expected_tokens"}.`,
        { field: `${at}.type` },
      );
    }
    // One at a time: spreading a client-sized array into push() overflows the stack beyond ~100k ids.
    for (const t of chunk.tokens) tokens.push(t);
  });
  if (!tokens.length) throw invalid(`${field} has no tokens.`, { field });
  const images = imagePositionCount ? ` (${imagePositionCount} of them image positions)` : '';
  if (tokens.length > limits.maxLength)
    throw invalid(`${field} has ${tokens.length} tokens${images}; the ${limits.lengthName} is ${limits.maxLength}.`, { field });
  const vocab = limits.vocabulary;
  const bad = vocab ? tokens.findIndex((t) => !Number.isInteger(t) || t < 0 || t >= vocab.size) : -1;
  if (bad >= 0) throw invalid(`${field} token ${tokens[bad]} at position ${bad} is outside ${vocab!.model}'s vocabulary (0..${vocab!.size - 1}).`, { field });
  return tokens;
}
