import { readFileSync } from 'node:fs';

/**
 * Decoding alone, for a byte-level BPE vocabulary (the built-in families'):
 * what sampling needs to match stop strings, held as one byte array and its
 * offsets (~2 MB for Qwen's 151,669 tokens) instead of the whole tokenizer
 * library's tables (~85 MB resident, 350 ms to load). It decodes as the
 * library does: the byte-level characters of vocabulary tokens become their
 * bytes and runs of them are read as UTF-8 (invalid sequences as U+FFFD);
 * added tokens come out as their text. A test holds it to the library's
 * decode on both families.
 */
export interface TokenDecoder {
  decode(ids: number[]): string;
}

/** GPT-2's byte-level alphabet: every byte as a printable character (and back). */
function byteOfCharacter(): Map<string, number> {
  const out = new Map<string, number>();
  let shifted = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    out.set(String.fromCodePoint(printable ? b : shifted++), b);
  }
  return out;
}

export function loadTokenDecoder(tokenizerJson: string): TokenDecoder {
  const json = JSON.parse(readFileSync(tokenizerJson, 'utf8')) as {
    model: { vocab: Record<string, number> };
    added_tokens?: { id: number; content: string }[];
    decoder?: { type?: string };
  };
  if (json.decoder?.type !== 'ByteLevel') throw new Error(`${tokenizerJson}: its decoder is ${json.decoder?.type ?? 'missing'}, not ByteLevel`);
  const added = new Map((json.added_tokens ?? []).map((a) => [a.id, a.content]));
  const byteOf = byteOfCharacter();
  let size = 0;
  for (const id of Object.values(json.model.vocab)) size = Math.max(size, id + 1);
  const lengths = new Int32Array(size);
  const tokens: string[] = new Array(size);
  for (const [token, id] of Object.entries(json.model.vocab)) {
    tokens[id] = token;
    lengths[id] = [...token].length;
  }
  const offsets = new Int32Array(size + 1);
  for (let id = 0; id < size; id++) offsets[id + 1] = offsets[id]! + lengths[id]!;
  const bytes = new Uint8Array(offsets[size]!);
  for (let id = 0; id < size; id++) {
    let at = offsets[id]!;
    // A character outside the alphabet reads as byte 0, as the library's decoder reads it.
    for (const c of tokens[id] ?? '') bytes[at++] = byteOf.get(c) ?? 0;
  }
  const utf8 = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
  return {
    decode(ids) {
      let text = '';
      let run: number[] = [];
      const flush = () => {
        if (!run.length) return;
        let n = 0;
        for (const id of run) n += offsets[id + 1]! - offsets[id]!;
        const out = new Uint8Array(n);
        let at = 0;
        for (const id of run) {
          out.set(bytes.subarray(offsets[id]!, offsets[id + 1]!), at);
          at += offsets[id + 1]! - offsets[id]!;
        }
        text += utf8.decode(out);
        run = [];
      };
      for (const id of ids) {
        const special = added.get(id);
        if (special !== undefined) {
          flush();
          text += special;
        } else if (id >= 0 && id < size) {
          run.push(id);
        }
      }
      flush();
      return text;
    },
  };
}
