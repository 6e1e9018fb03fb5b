import type { LoraAdapter } from '../../models/index.js';

export interface Publication {
  /** The policy version (optimizer steps) the weights were saved at. */
  version: number;
  adapter: LoraAdapter;
  /** The sampler checkpoint the weights were saved as. */
  path: string;
}

/**
 * Weights published to each sampler by `save_weights_for_sampler`: the
 * newest publication per sampler. The sampler plane serves from it; versions
 * only move forward, so a late older publish never replaces a newer one.
 */
export class SamplerWeights {
  private readonly latest = new Map<string, Publication>();
  private readonly listeners: ((samplerId: string, publication: Publication) => void)[] = [];

  /** Called on every accepted publication (the sampler replicas start syncing it). */
  onPublish(listener: (samplerId: string, publication: Publication) => void): void {
    this.listeners.push(listener);
  }

  publish(samplerId: string, publication: Publication): void {
    const current = this.latest.get(samplerId);
    if (current && publication.version < current.version) return;
    this.latest.set(samplerId, publication);
    for (const l of this.listeners) l(samplerId, publication);
  }

  get(samplerId: string): Publication | undefined {
    return this.latest.get(samplerId);
  }

  /** The highest version published to a sampler, 0 before any. */
  version(samplerId: string): number {
    return this.latest.get(samplerId)?.version ?? 0;
  }
}
