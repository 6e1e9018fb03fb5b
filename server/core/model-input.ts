import { invalid } from './errors.js';

/** The wire's ModelInput: chunks of which loops-mock takes text (`encoded_text`) only. */
export interface ModelInputWire {
  chunks: { type: string; tokens?: number[] }[];
}

/**
 * The tokens of a ModelInput, checked for what both planes need: text chunks
 * only, at least one token, and no more than `maxLength` tokens; with
 * `vocabulary`, every id inside it (training data has its ids checked with
 * the rest of the datum, by checkTrainingData). `field` names the input in errors.
 */
export function modelInputTokens(input: ModelInputWire, field: string, limits: { maxLength: number; lengthName: string; use: 'trains on' | 'samples from'; vocabulary?: { size: number; model: string } }): number[] {
  const tokens: number[] = [];
  input.chunks.forEach((chunk, c) => {
    if (chunk.type !== 'encoded_text' || !chunk.tokens) {
      throw invalid(`${field}.chunks[${c}] is a '${chunk.type}' chunk: loops-mock ${limits.use} text; send {"type": "encoded_text", "tokens": [...]}.`, { field: `${field}.chunks[${c}].type` });
    }
    // One at a time: spreading a client-sized array into push() overflows the stack beyond ~100k ids.
    for (const t of chunk.tokens) tokens.push(t);
  });
  if (!tokens.length) throw invalid(`${field} has no tokens.`, { field });
  if (tokens.length > limits.maxLength) throw invalid(`${field} has ${tokens.length} tokens; the ${limits.lengthName} is ${limits.maxLength}.`, { field });
  const vocab = limits.vocabulary;
  const bad = vocab ? tokens.findIndex((t) => !Number.isInteger(t) || t < 0 || t >= vocab.size) : -1;
  if (bad >= 0) throw invalid(`${field} token ${tokens[bad]} at position ${bad} is outside ${vocab!.model}'s vocabulary (0..${vocab!.size - 1}).`, { field });
  return tokens;
}
