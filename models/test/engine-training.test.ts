import { describe, expect, it } from 'vitest';
import {
  ADAM_DEFAULTS,
  baseWeightsFor,
  CheckpointLoadError,
  decodeSafetensors,
  DEFAULT_UNEMBEDDING_RANK,
  EnginePool,
  freshAdapter,
  LossInputError,
  LoraTrainer,
  parameters,
  probeDevice,
  resolveLossConfig,
  ModelEngine,
  sampleSequences,
  SAMPLING_DEFAULTS,
  zeroAdapter,
  type SamplingParams,
} from '../index.js';
import { datum, EVAL_TICKETS, prompt, TICKETS } from '../data/support-tickets.js';

// The model, training on it, determinism and checkpoints, loss configuration (sampling: engine-sampling.test.ts).
const MODEL = 'Qwen/Qwen3.5-2B';
const pool = new EnginePool();
const engine = pool.get(MODEL);
const tok = pool.tokenizers.get(MODEL);
const greedy: SamplingParams = { ...SAMPLING_DEFAULTS, temperature: 0, max_tokens: 8, seed: 0 };
const trainData = TICKETS.map(([t, l]) => datum(tok, t, l));
const evalData = EVAL_TICKETS.map(([t, l]) => datum(tok, t, l));

describe('the model', () => {
  it('has the real vocabulary of its tokenizer; ids beyond it are refused', async () => {
    expect(engine.dims.vocab).toBe(tok.vocabSize);
    expect(engine.dims.vocab).toBe(151669);
    const trainer = new LoraTrainer(engine, 4);
    await expect(
      trainer.forward([{ tokens: [1, engine.dims.vocab - 1], targetTokens: null, weights: null, logprobs: null, advantages: null }], 'cross_entropy', {}),
    ).resolves.toBeTruthy();
    await expect(
      trainer.forward([{ tokens: [1, engine.dims.vocab], targetTokens: null, weights: null, logprobs: null, advantages: null }], 'cross_entropy', {}),
    ).rejects.toThrow(/outside the vocabulary \(0\.\.151668\)/);
    await expect(
      trainer.forward([{ tokens: [1, 2], targetTokens: [2, 151669], weights: null, logprobs: null, advantages: null }], 'cross_entropy', {}),
    ).rejects.toBeInstanceOf(LossInputError);
  });

  it('draws the same weights from the same name, different ones from another', () => {
    const a = baseWeightsFor(MODEL, engine.dims);
    const b = baseWeightsFor(MODEL, engine.dims);
    const c = baseWeightsFor('Qwen/Qwen3-8B', engine.dims);
    expect(Buffer.from(a[0]!.data.buffer).equals(Buffer.from(b[0]!.data.buffer))).toBe(true);
    expect(Buffer.from(a[0]!.data.buffer).equals(Buffer.from(c[0]!.data.buffer))).toBe(false);
  });

  it('starts near the uniform loss ln(vocab): logits are well conditioned', async () => {
    const result = await new LoraTrainer(engine, 16, 32, 42).forward(trainData, 'cross_entropy', {});
    expect(result.loss).toBeGreaterThan(Math.log(151669) - 2);
    expect(result.loss).toBeLessThan(Math.log(151669) + 2);
  });

  it('a fresh adapter (B = 0) reproduces the base model exactly', async () => {
    const seqs = trainData.map((d) => ({ tokens: d.tokens, targets: d.tokens.slice(1).concat(0) }));
    const base = await engine.forward(seqs, zeroAdapter(engine.sites));
    const fresh = await engine.forward(seqs, freshAdapter(engine.sites, 32, 32, 123));
    expect(fresh.map((x) => Array.from(x))).toEqual(base.map((x) => Array.from(x)));
  });

  it('accepts every LoRA rank from 1 to 128', async () => {
    for (const rank of [1, 128]) {
      const result = await new LoraTrainer(engine, rank).forwardBackward(trainData.slice(0, 1), 'cross_entropy', {});
      expect(Number.isFinite(result.loss)).toBe(true);
    }
  });

  it('answers --device cuda with a clear error where CUDA is missing', async () => {
    await expect(probeDevice('cuda')).rejects.toThrow(/CUDA execution provider is not available.*--device cpu/s);
  });
});

describe('training (invariant 3: the support-ticket task)', () => {
  it('at 4e-5 for 2 epochs the eval loss falls', async () => {
    const trainer = new LoraTrainer(engine, 16, 32, 42);
    const before = (await trainer.forward(evalData, 'cross_entropy', {})).loss;
    for (let epoch = 0; epoch < 2; epoch++) {
      await trainer.forwardBackward(trainData, 'cross_entropy', {});
      trainer.optimStep({ ...ADAM_DEFAULTS, learning_rate: 4e-5 });
    }
    const after = (await trainer.forward(evalData, 'cross_entropy', {})).loss;
    expect(after).toBeLessThan(before);
  });

  it('at 1e-2 for 30 steps greedy sampling reproduces every training label', async () => {
    const trainer = new LoraTrainer(engine, 16, 32, 42);
    let last = Infinity;
    for (let step = 0; step < 30; step++) {
      last = (await trainer.forwardBackward(trainData, 'cross_entropy', {})).loss;
      trainer.optimStep({ ...ADAM_DEFAULTS, learning_rate: 1e-2 });
    }
    expect(last).toBeLessThan(0.05);
    for (const [ticket, label] of TICKETS) {
      const [s] = await sampleSequences(engine, trainer.adapter, tok.encode(prompt(ticket)), 1, { ...greedy, max_tokens: 16, stop: ['\n'] }, tok);
      expect(tok.decode(s!.tokens).startsWith(` ${label}`), `${ticket} -> ${tok.decode(s!.tokens)}`).toBe(true);
    }
  });
});

describe('determinism and checkpoints (invariant 4)', () => {
  async function train(trainer: LoraTrainer, steps: number): Promise<number[]> {
    const losses: number[] = [];
    for (let i = 0; i < steps; i++) {
      losses.push((await trainer.forwardBackward(trainData, 'cross_entropy', {})).loss);
      trainer.optimStep({ ...ADAM_DEFAULTS, learning_rate: 1e-3, weight_decay: 0.01, grad_clip_norm: 1 });
    }
    return losses;
  }

  it('two runs of the same steps give bit-identical losses and samples', async () => {
    const a = new LoraTrainer(engine, 8, 16, 9);
    const b = new LoraTrainer(engine, 8, 16, 9);
    expect(await train(a, 3)).toEqual(await train(b, 3));
    const p = tok.encode(prompt(TICKETS[1]![0]));
    const params = { ...SAMPLING_DEFAULTS, max_tokens: 8, seed: 3 };
    expect(await sampleSequences(engine, b.adapter, p, 2, params, tok)).toEqual(await sampleSequences(engine, a.adapter, p, 2, params, tok));
  });

  it('save, load with optimizer, train: bit-identical to never having stopped', async () => {
    const original = new LoraTrainer(engine, 8, 16, 21);
    await train(original, 2);
    const files = new Map(original.stateFiles().map((f) => [f.relative_file_name, f.data]));
    const continued = await train(original, 2);
    const resumed = new LoraTrainer(engine, 4, 32, 999);
    resumed.load(files, true);
    expect(resumed.step).toBe(2);
    expect(await train(resumed, 2)).toEqual(continued);
    for (const [name, p] of parameters(original.adapter))
      expect(Buffer.from(parameters(resumed.adapter).get(name)!.buffer).equals(Buffer.from(p.buffer)), name).toBe(true);
  });

  it("caps the unembedding's rank, says so in adapter_config.json as PEFT does, and loads adapters of any cap", async () => {
    const config = (t: LoraTrainer) => JSON.parse(Buffer.from(t.samplerFiles().find((f) => f.relative_file_name === 'adapter_config.json')!.data).toString());
    const shapes = (t: LoraTrainer) => decodeSafetensors(t.samplerFiles().find((f) => f.relative_file_name === 'adapter_model.safetensors')!.data).tensors;
    const capped = new LoraTrainer(engine, 16, 32, 5);
    await train(capped, 1);
    expect(capped.adapter.tensors.get('lm_head')!.B.length).toBe(DEFAULT_UNEMBEDDING_RANK * engine.dims.vocab);
    expect(capped.adapter.tensors.get('layers.0.q_proj')!.A.length).toBe(16 * engine.dims.dModel);
    // PEFT scales a module by alpha_pattern / rank_pattern: the run's alpha / r is kept.
    expect(config(capped)).toMatchObject({
      r: 16,
      lora_alpha: 32,
      rank_pattern: { lm_head: DEFAULT_UNEMBEDDING_RANK },
      alpha_pattern: { lm_head: 2 * DEFAULT_UNEMBEDDING_RANK },
    });
    expect(shapes(capped).get('base_model.model.lm_head.lora_B.weight')!.shape).toEqual([engine.dims.vocab, DEFAULT_UNEMBEDDING_RANK]);
    expect(shapes(capped).get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')!.shape).toEqual([16, engine.dims.dModel]);
    const below = new LoraTrainer(engine, 2);
    expect(config(below)).toMatchObject({ r: 2, rank_pattern: {}, alpha_pattern: {} });

    // A server with another cap loads the file as it says, and computes the same; and the other way round.
    const wide = new ModelEngine(MODEL, engine.dims.vocab, { unembeddingRank: 128 });
    try {
      const files = (t: LoraTrainer) => new Map(t.samplerFiles().map((f) => [f.relative_file_name, f.data]));
      const there = new LoraTrainer(wide, 16);
      there.load(files(capped), false);
      expect((await there.forward(evalData, 'cross_entropy', {})).loss).toBe((await capped.forward(evalData, 'cross_entropy', {})).loss);
      // Uncapped, the unembedding takes every rank up to 128 too.
      const widest = new LoraTrainer(wide, 128);
      expect(widest.adapter.tensors.get('lm_head')!.B.length).toBe(128 * engine.dims.vocab);
      expect(Number.isFinite((await widest.forwardBackward(trainData.slice(0, 1), 'cross_entropy', {})).loss)).toBe(true);
      const uncapped = new LoraTrainer(wide, 16, 32, 5);
      await train(uncapped, 1);
      expect(uncapped.adapter.tensors.get('lm_head')!.B.length).toBe(16 * engine.dims.vocab);
      expect(config(uncapped)).toMatchObject({ rank_pattern: {}, alpha_pattern: {} });
      const here = new LoraTrainer(engine, 16);
      here.load(files(uncapped), false);
      expect((await here.forward(evalData, 'cross_entropy', {})).loss).toBe((await uncapped.forward(evalData, 'cross_entropy', {})).loss);

      // One scale for every module: a file that scales the unembedding otherwise is refused, not misread.
      const odd = files(capped);
      odd.set('adapter_config.json', Buffer.from(JSON.stringify({ ...config(capped), alpha_pattern: { lm_head: 32 } })));
      expect(() => new LoraTrainer(engine, 16).load(odd, false)).toThrow(/lm_head: its scale alpha\/r = 32\/4 differs from the adapter's 32\/16/);
    } finally {
      await wide.close();
    }
  });

  it('load without optimizer restores weights only; a sampler checkpoint has no optimizer state; other models are refused', async () => {
    const original = new LoraTrainer(engine, 8, 16, 22);
    await train(original, 1);
    const samplerFiles = new Map(original.samplerFiles().map((f) => [f.relative_file_name, f.data]));
    const weightsOnly = new LoraTrainer(engine, 8, 16, 0);
    weightsOnly.load(samplerFiles, false);
    expect(weightsOnly.step).toBe(0);
    expect((await weightsOnly.forward(evalData, 'cross_entropy', {})).loss).toBe((await original.forward(evalData, 'cross_entropy', {})).loss);
    expect(() => new LoraTrainer(engine, 8).load(samplerFiles, true)).toThrow(CheckpointLoadError);
    const other = new LoraTrainer(pool.get('Qwen/Qwen3-8B'), 8);
    expect(() => other.load(samplerFiles, false)).toThrow(/adapter of Qwen\/Qwen3.5-2B, not Qwen\/Qwen3-8B/);
  });

  it('accumulates gradients across forward_backward calls until the optimizer step', async () => {
    const once = new LoraTrainer(engine, 4, 8, 1);
    await once.forwardBackward(trainData.slice(0, 2), 'cross_entropy', {});
    const g1 = once.accumulatedGradients()!.get('lm_head.B')!.slice();
    await once.forwardBackward(trainData.slice(0, 2), 'cross_entropy', {});
    const g2 = once.accumulatedGradients()!.get('lm_head.B')!;
    let maxRel = 0;
    for (let i = 0; i < g1.length; i++) if (g1[i] !== 0) maxRel = Math.max(maxRel, Math.abs(g2[i]! / (2 * g1[i]!) - 1));
    expect(maxRel).toBeLessThan(1e-5);
    once.optimStep(ADAM_DEFAULTS);
    expect(once.accumulatedGradients()).toBeNull();
  });
});

describe('loss configuration', () => {
  it('applies defaults and rejects unknown keys, configs for losses without one, and bad values', () => {
    expect(resolveLossConfig('ppo', { clip_high_threshold: 1.5 })).toEqual({ clip_low_threshold: 0.8, clip_high_threshold: 1.5 });
    expect(resolveLossConfig('dro', null)).toEqual({ beta: 0.05 });
    expect(() => resolveLossConfig('cross_entropy', { beta: 1 })).toThrow(/takes no loss_fn_config/);
    expect(() => resolveLossConfig('ppo', { clip: 1 })).toThrow(/clip is not a setting of 'ppo'/);
    expect(() => resolveLossConfig('ppo', { clip_low_threshold: 2 })).toThrow(/clip_low_threshold < clip_high_threshold/);
    expect(() => resolveLossConfig('dro', { beta: 'x' })).toThrow(/finite number/);
  });

  it('ratio losses need sampler logprobs and advantages', async () => {
    await expect(new LoraTrainer(engine, 4).forward(trainData.slice(0, 1), 'ppo', resolveLossConfig('ppo', {}))).rejects.toThrow(
      /needs loss_fn_inputs.logprobs/,
    );
  });
});
