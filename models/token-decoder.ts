import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { cached, keep, lookUp, type CacheOutcome, type EntryKind } from './cache-entries.js';

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

/** GPT-2's byte-level alphabet, by code point: each printable character's byte (the rest: -1, read as byte 0 as the library reads them). */
function byteOfCodePoint(): Int16Array {
  const out = new Int16Array(324).fill(-1);
  let shifted = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    out[printable ? b : shifted++] = b;
  }
  return out;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * A tokenizer.json read straight from its bytes: JSON.parse of the whole file (11 MB for Qwen, most of it the
 * merges, which decoding never reads) and the vocabulary's 151,669 keys cost ~0.5 s of the server's thread; this
 * scanner skips what decoding does not read and turns each vocabulary key into its bytes as it goes (~0.1 s).
 */
class TokenizerJsonScanner {
  at = 0;
  constructor(private readonly b: Buffer) {}

  private space(): void {
    const b = this.b;
    while (b[this.at] === 0x20 || b[this.at] === 0x0a || b[this.at] === 0x0d || b[this.at] === 0x09) this.at++;
  }

  private expect(char: string): void {
    this.space();
    if (this.b[this.at] !== char.charCodeAt(0)) throw new Error(`expected '${char}' at byte ${this.at}`);
    this.at++;
  }

  /** Past a string whose opening quote is at `at` (found by the buffer's own search: the merges are megabytes of strings). */
  private skipString(): void {
    const b = this.b;
    let i = this.at + 1;
    for (;;) {
      const q = b.indexOf(QUOTE, i);
      if (q < 0) throw new Error('a string runs to the end of the file');
      let slashes = 0;
      while (b[q - 1 - slashes] === BACKSLASH) slashes++;
      if (slashes % 2 === 0) {
        this.at = q + 1;
        return;
      }
      i = q + 1;
    }
  }

  /** Past any value: strings skipped whole, so brackets inside them do not count. */
  skipValue(): void {
    this.space();
    const b = this.b;
    let depth = 0;
    for (;;) {
      const c = b[this.at];
      if (c === undefined) throw new Error('the file ends inside a value');
      if (c === QUOTE) {
        this.skipString();
        if (depth === 0) return;
        continue;
      }
      if (c === 0x7b || c === 0x5b) depth++;
      else if (c === 0x7d || c === 0x5d) {
        // At depth 0 this closes the object or array the value is in: the value (a number, say) ended before it.
        if (depth === 0) return;
        if (--depth === 0) {
          this.at++;
          return;
        }
      } else if (depth === 0 && (c === 0x2c || c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09)) return;
      this.at++;
    }
  }

  /** A value parsed by JSON.parse (the small parts: added_tokens, decoder). */
  value(): unknown {
    this.space();
    const from = this.at;
    this.skipValue();
    return JSON.parse(this.b.toString('utf8', from, this.at));
  }

  /** Calls `each` with every key of the object at `at`, positioned at its value; `each` reads or skips it. */
  object(each: (key: string) => void): void {
    this.expect('{');
    this.space();
    if (this.b[this.at] === 0x7d) {
      this.at++;
      return;
    }
    for (;;) {
      const key = this.value() as string;
      this.expect(':');
      each(key);
      this.space();
      const c = this.b[this.at++];
      if (c === 0x7d) return;
      if (c !== 0x2c) throw new Error(`expected ',' or '}' at byte ${this.at - 1}`);
    }
  }

  /**
   * The vocabulary object at `at`: each key's byte-level characters as bytes, in `out`, with its id. Returns the
   * ids, and each key's start and length in `out`, in the file's order.
   */
  vocabulary(out: Uint8Array, byteOf: Int16Array): { ids: number[]; starts: number[]; lengths: number[] } {
    const b = this.b;
    const ids: number[] = [];
    const starts: number[] = [];
    const lengths: number[] = [];
    let w = 0;
    this.expect('{');
    for (;;) {
      this.space();
      if (b[this.at] === 0x7d) break;
      if (b[this.at] !== QUOTE) throw new Error(`expected a vocabulary key at byte ${this.at}`);
      let i = this.at + 1;
      const start = w;
      while (b[i] !== QUOTE) {
        const c = b[i];
        if (c === undefined) throw new Error('a vocabulary key runs to the end of the file');
        let cp: number;
        if (c === BACKSLASH) {
          const e = b[i + 1]!;
          if (e === 0x75) {
            cp = Number.parseInt(String.fromCharCode(b[i + 2]!, b[i + 3]!, b[i + 4]!, b[i + 5]!), 16);
            i += 6;
            // A surrogate pair is one code point, outside the alphabet either way.
            if (cp >= 0xd800 && cp <= 0xdbff && b[i] === BACKSLASH && b[i + 1] === 0x75) i += 6;
          } else {
            cp = e === 0x6e ? 0x0a : e === 0x74 ? 0x09 : e === 0x72 ? 0x0d : e === 0x62 ? 0x08 : e === 0x66 ? 0x0c : e;
            i += 2;
          }
        } else if (c < 0x80) {
          cp = c;
          i++;
        } else if (c < 0xe0) {
          cp = ((c & 0x1f) << 6) | (b[i + 1]! & 0x3f);
          i += 2;
        } else if (c < 0xf0) {
          cp = ((c & 0x0f) << 12) | ((b[i + 1]! & 0x3f) << 6) | (b[i + 2]! & 0x3f);
          i += 3;
        } else {
          cp = 0x10000;
          i += 4;
        }
        out[w++] = cp < byteOf.length ? Math.max(0, byteOf[cp]!) : 0;
      }
      this.at = i + 1;
      this.expect(':');
      this.space();
      let id = 0;
      const digitsFrom = this.at;
      while (b[this.at]! >= 0x30 && b[this.at]! <= 0x39) id = id * 10 + (b[this.at++]! - 0x30);
      if (this.at === digitsFrom) throw new Error(`expected a token id at byte ${this.at}`);
      ids.push(id);
      starts.push(start);
      lengths.push(w - start);
      this.space();
      if (b[this.at] === 0x2c) this.at++;
    }
    this.at++;
    return { ids, starts, lengths };
  }
}

/** What decoding needs: each id's bytes (`bytes` from `offsets[id]` to `offsets[id + 1]`), and the added tokens' text. */
interface DecoderTable {
  offsets: Int32Array;
  bytes: Uint8Array;
  added: [number, string][];
}

/** The decoder's table read from a tokenizer.json's bytes. */
function readDecoderTable(file: Buffer, tokenizerJson: string): DecoderTable {
  const scan = new TokenizerJsonScanner(file);
  let addedTokens: { id: number; content: string }[] = [];
  let decoderType: string | undefined;
  let vocab: { ids: number[]; starts: number[]; lengths: number[] } | null = null;
  // Every key's bytes fit in the file's (a code point is at least one byte there).
  const keyBytes = new Uint8Array(file.length);
  const byteOf = byteOfCodePoint();
  try {
    scan.object((key) => {
      if (key === 'added_tokens') addedTokens = scan.value() as typeof addedTokens;
      else if (key === 'decoder') decoderType = (scan.value() as { type?: string } | null)?.type;
      else if (key === 'model')
        scan.object((inner) => {
          if (inner === 'vocab') vocab = scan.vocabulary(keyBytes, byteOf);
          else scan.skipValue();
        });
      else scan.skipValue();
    });
  } catch (err) {
    throw new Error(`${tokenizerJson}: not a tokenizer.json this decoder reads (${(err as Error).message})`);
  }
  if (decoderType !== 'ByteLevel') throw new Error(`${tokenizerJson}: its decoder is ${decoderType ?? 'missing'}, not ByteLevel`);
  if (!vocab) throw new Error(`${tokenizerJson}: it has no model.vocab`);
  const { ids, starts, lengths } = vocab as { ids: number[]; starts: number[]; lengths: number[] };
  let size = 0;
  for (const id of ids) size = Math.max(size, id + 1);
  const byId = new Int32Array(size).fill(-1);
  ids.forEach((id, k) => {
    byId[id] = k;
  });
  const offsets = new Int32Array(size + 1);
  for (let id = 0; id < size; id++) offsets[id + 1] = offsets[id]! + (byId[id]! >= 0 ? lengths[byId[id]!]! : 0);
  const bytes = new Uint8Array(offsets[size]!);
  for (let id = 0; id < size; id++) {
    const k = byId[id]!;
    if (k >= 0) bytes.set(keyBytes.subarray(starts[k]!, starts[k]! + lengths[k]!), offsets[id]!);
  }
  return { offsets, bytes, added: (addedTokens ?? []).map((a) => [a.id, a.content]) };
}

/** Decoder tables kept between processes (cache-entries.ts): the offsets, then the bytes; the added tokens in the header. */
const DECODER_TABLES: EntryKind<DecoderTable> = {
  folder: 'token-decoders',
  magic: 'loops-mock token decoder 1\n',
  encode: (t) => ({
    parts: [new Uint8Array(t.offsets.buffer, t.offsets.byteOffset, t.offsets.byteLength), t.bytes],
    about: { ids: t.offsets.length - 1, added: t.added },
  }),
  decode(bytes, about) {
    const { ids, added } = about as { ids: number; added: [number, string][] };
    if (!Number.isInteger(ids) || ids < 0 || (ids + 1) * 4 > bytes.byteLength || !Array.isArray(added)) return 'a header that does not fit its bytes';
    if (!added.every((a) => Array.isArray(a) && a.length === 2 && Number.isInteger(a[0]) && typeof a[1] === 'string'))
      return 'added tokens that are not [id, text] pairs';
    // The offsets copied out (the file's bytes may lie unaligned), the bytes viewed where they lie.
    const offsets = new Int32Array(ids + 1);
    new Uint8Array(offsets.buffer).set(bytes.subarray(0, offsets.byteLength));
    const table = bytes.subarray(offsets.byteLength);
    for (let i = 0; i < ids; i++) if (offsets[i + 1]! < offsets[i]!) return 'offsets that run backwards';
    if (offsets[0] !== 0 || offsets[ids] !== table.byteLength) return 'offsets that do not end where its bytes do';
    return { offsets, bytes: table, added };
  },
};

/** How a decoder's table came: from the package's build ('shipped'), from --cache-dir, or scanned. */
export type DecoderTableOutcome = CacheOutcome | 'shipped';

/**
 * The lean decoder of a tokenizer.json. Its table comes from `shippedDir` (the package's own, for a built-in
 * family's file) or `cacheDir` where a sound entry for the file's bytes is kept there (~10 ms, the file read and
 * hashed, against ~0.1-0.15 s of this thread to scan it); else the file is scanned and the table kept in `cacheDir`.
 */
export function loadTokenDecoder(
  tokenizerJson: string,
  cacheDir: string | null = null,
  shippedDir: string | null = null,
): TokenDecoder & { cache: { outcome: DecoderTableOutcome; refused?: string } } {
  const file = readFileSync(tokenizerJson);
  const digest = digestOf(file);
  // A shipped entry that is missing, stale or damaged is passed over: the cache, or a scan, gives the table.
  const shipped = shippedDir ? lookUp(DECODER_TABLES, shippedDir, digest) : null;
  if (shipped && 'value' in shipped) return { ...tableDecoder(shipped.value), cache: { outcome: 'shipped' } };
  const { value, ...cache } = cached(DECODER_TABLES, cacheDir, cacheKey(digest), () => readDecoderTable(file, tokenizerJson));
  return { ...tableDecoder(value), cache };
}

/**
 * A --cache-dir entry's key: the file's bytes and the code that reads them, so that a changed file or a changed
 * reader is another entry. A shipped entry's key is the file's bytes alone: the build that makes it is the one that
 * built the reader (the bundle's code reads as other text than dist/'s, so its source could not be the key).
 */
const cacheKey = (digest: string) =>
  createHash('sha256')
    .update(digest)
    .update(readDecoderTable.toString())
    .update(TokenizerJsonScanner.toString())
    .update(byteOfCodePoint.toString())
    .digest('hex');

/** A shipped entry's key: the SHA-256 of the file's bytes. */
const digestOf = (file: Buffer) => createHash('sha256').update(file).digest('hex');

/** Run by the package's build: `tokenizerJson`'s table scanned and kept in `dir` under its shipped key. */
export function shipDecoderTable(tokenizerJson: string, dir: string): void {
  const file = readFileSync(tokenizerJson);
  keep(DECODER_TABLES, dir, digestOf(file), readDecoderTable(file, tokenizerJson));
}

/** Decodes as the library does, from the table. */
function tableDecoder({ offsets, bytes, added: addedTokens }: DecoderTable): TokenDecoder {
  const size = offsets.length - 1;
  const added = new Map(addedTokens);
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
