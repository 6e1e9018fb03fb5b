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

  /** The highest version published to a sampler, 0 before any (its record keeps it once the weights are forgotten). */
  version(samplerId: string): number {
    return this.latest.get(samplerId)?.version ?? this.versions.get(samplerId) ?? 0;
  }

  /** Versions of samplers whose weights were forgotten: a number each, so published_version stays true. */
  private readonly versions = new Map<string, number>();

  /** A stopped sampler's weights go (nothing serves from them again); its version stays. */
  release(samplerId: string): void {
    const p = this.latest.get(samplerId);
    if (p) this.versions.set(samplerId, p.version);
    this.latest.delete(samplerId);
  }
}
