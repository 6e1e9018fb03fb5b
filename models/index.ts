import { ModelEngine, type EngineOptions, type GraphBuildEvent } from './engine.js';
import { FAMILY_EOS, FAMILY_VOCAB } from './registry.js';
import { Tokenizers } from './tokenizers.js';

export * from './engine.js';
export * from './losses.js';
export * from './lora.js';
export * from './optimizer.js';
export * from './peft.js';
export * from './hf-model.js';
export * from './registry.js';
export * from './safetensors.js';
export * from './sampling.js';
export * from './tokenizers.js';
export * from './trainer.js';
export { checkTrainingData } from './training-data.js';
export { baseWeights as baseWeightsFor, loraSites, DEFAULT_DIMS, DEFAULT_UNEMBEDDING_RANK, type ModelDims, type LoraSite } from './transformer.js';

/** One engine per base model, created on first use and shared by every run on it. */
export class EnginePool {
  private readonly engines = new Map<string, ModelEngine>();
  private readonly graphListeners: ((event: GraphBuildEvent) => void)[] = [];
  private readonly longListeners: (() => void)[] = [];

  constructor(
    readonly tokenizers: Tokenizers = new Tokenizers(),
    private readonly options: EngineOptions = {},
  ) {}

  /** The vocabulary size of a model: its tokenizer's. Built-in families need no file parsing. */
  vocabSize(model: string): number {
    const { family } = this.tokenizers.files(model);
    return family ? FAMILY_VOCAB[family] : this.tokenizers.get(model).vocabSize;
  }

  /**
   * What sampling needs of a model's tokenizer: its end-of-sequence ids, without parsing the file for the
   * built-in families (350 ms and ~85 MB resident for Qwen's whole tokenizer), and decoding (stop strings) with
   * the lean decoder, loaded at its first use.
   */
  sampleCodec(model: string): { eosTokenIds: number[]; decode(ids: number[]): string } {
    const { family } = this.tokenizers.files(model);
    return {
      eosTokenIds: family ? [...FAMILY_EOS[family]] : this.tokenizers.get(model).eosTokenIds,
      decode: (ids) => this.tokenizers.decoder(model).decode(ids),
    };
  }

  /** Told when any engine builds a graph kind at its first use (the server log shows it); returns how to stop being told. */
  onGraphBuild(listener: (event: GraphBuildEvent) => void): () => void {
    this.graphListeners.push(listener);
    return () => {
      const at = this.graphListeners.indexOf(listener);
      if (at >= 0) this.graphListeners.splice(at, 1);
    };
  }

  /** Told after any engine's work on a long sequence (ModelEngine.onLongSequence); returns how to stop being told. */
  onLongSequence(listener: () => void): () => void {
    this.longListeners.push(listener);
    return () => {
      const at = this.longListeners.indexOf(listener);
      if (at >= 0) this.longListeners.splice(at, 1);
    };
  }

  /** Stops every engine's worker thread. */
  async close(): Promise<void> {
    await Promise.all([...this.engines.values()].map((e) => e.close()));
    this.engines.clear();
  }

  get(model: string): ModelEngine {
    let engine = this.engines.get(model);
    if (!engine) {
      engine = new ModelEngine(model, this.vocabSize(model), this.options);
      engine.onGraphBuild = (event) => {
        for (const l of this.graphListeners) l(event);
      };
      engine.onLongSequence = () => {
        for (const l of this.longListeners) l();
      };
      this.engines.set(model, engine);
    }
    return engine;
  }
}
