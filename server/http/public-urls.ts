import type { RunRecord, SamplerRecord } from '../core/records.js';

/**
 * The URLs the control plane hands out: where a client finds a run's
 * trainer, a sampler, a checkpoint download, and the control plane itself.
 * Direct mode points them at the server's own address; proxy mode
 * (server/proxy/baseten-hosts.ts) at Baseten's hosts.
 */
export interface PublicUrls {
  trainer(run: Pick<RunRecord, 'id' | 'deployment_id'>): string;
  sampler(sampler: Pick<SamplerRecord, 'id' | 'model_id' | 'model_deployment_id'>): string;
  /** A checkpoint deployed to inference: its deployment's sync root (`/v1/chat/completions` follows). */
  modelDeployment(m: { model_id: string; deployment_id: string }): string;
  /** An absolute URL for a path of the app, e.g. `/checkpoint-files/...`. */
  download(path: string): string;
  /** Where the control plane answers (`/v1/...` follows). */
  root(): string;
}

/** `{public_url}/trainer/{run_id}` and `{public_url}/sampler/{sampler_id}`; a function because the port may be known only after listen. */
export function directUrls(publicUrl: () => string): PublicUrls {
  return {
    trainer: (run) => `${publicUrl()}/trainer/${run.id}`,
    sampler: (s) => `${publicUrl()}/sampler/${s.id}`,
    modelDeployment: (m) => `${publicUrl()}/model/${m.model_id}/deployment/${m.deployment_id}/sync`,
    download: (path) => `${publicUrl()}${path}`,
    root: publicUrl,
  };
}
