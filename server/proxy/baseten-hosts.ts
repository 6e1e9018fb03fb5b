import type { LoopsCore } from '../core/core.js';
import type { PublicUrls } from '../http/public-urls.js';

/** Baseten's control plane; the CLI's and the guides' clients call it by name. */
export const BASETEN_API_HOST = 'api.baseten.co';
const BASETEN_APP_HOST = 'app.baseten.co';
/** The Hugging Face Hub: the mirror answers there, under /hf of the app. */
export const HUB_HOST = 'huggingface.co';
const MODEL_HOST = /^model-([a-z0-9]+)\.api\.baseten\.co$/;
/** `/deployment/{id}/sync/...`, and the environment forms Baseten documents for a model's promoted deployment. */
const DEPLOYMENT_PATH = /^\/deployment\/([A-Za-z0-9]+)\/sync(\/[^?]*)?(\?.*)?$/;
const ENVIRONMENT_PATH = /^\/(?:environments\/[A-Za-z0-9_-]+|production|development)\/sync(\/[^?]*)?(\?.*)?$/;

/** One DNS label under api.baseten.co: what a `*.api.baseten.co` certificate covers, and every shape Baseten hands out (`model-<id>`, `chain-<id>`). */
const API_SUBDOMAIN = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.api\.baseten\.co$/;

/**
 * The hosts proxy mode terminates TLS for and answers itself; every other host
 * is refused or passed through. Exactly the names the one leaf certificate
 * covers (LEAF_NAMES): a deeper name under api.baseten.co is refused, as no
 * client would accept the certificate for it.
 */
export function isInterceptedHost(host: string): boolean {
  const h = host.toLowerCase();
  return h === BASETEN_API_HOST || h === BASETEN_APP_HOST || h === HUB_HOST || API_SUBDOMAIN.test(h);
}

/** The subject alternative names of the proxy's leaf certificate: the intercepted hosts, the first its common name. */
export const LEAF_NAMES = [BASETEN_API_HOST, `*.${BASETEN_API_HOST}`, BASETEN_APP_HOST, HUB_HOST] as const;

export const INTERCEPTED_HOSTS_TEXT = `${BASETEN_API_HOST}, *.${BASETEN_API_HOST} (one label), ${BASETEN_APP_HOST} and ${HUB_HOST}`;

/**
 * URLs in Baseten's shapes, so that clients which accept only Baseten's hosts
 * take them: a sampler is the model deployment it is
 * (`https://model-{model_id}.api.baseten.co/deployment/{deployment_id}/sync`,
 * the documented form for a deployment's own routes); a trainer, which has no
 * model of its own, is `model-{loops deployment id}` with the run as its
 * deployment; downloads and the control plane are on api.baseten.co.
 */
export function basetenUrls(): PublicUrls {
  return {
    trainer: (run) => `https://model-${run.deployment_id}.${BASETEN_API_HOST}/deployment/${run.id}/sync`,
    sampler: (s) => `https://model-${s.model_id}.${BASETEN_API_HOST}/deployment/${s.model_deployment_id}/sync`,
    modelDeployment: (m) => `https://model-${m.model_id}.${BASETEN_API_HOST}/deployment/${m.deployment_id}/sync`,
    download: (path) => `https://${BASETEN_API_HOST}${path}`,
    root: () => `https://${BASETEN_API_HOST}`,
  };
}

/** The host a request was sent to, without a port; from the absolute-form target when a client sent one. */
export function requestHost(url: string, hostHeader: string | undefined): string | undefined {
  if (/^https?:\/\//i.test(url)) {
    try {
      return new URL(url).hostname.toLowerCase();
    } catch {
      return undefined;
    }
  }
  if (!hostHeader) return undefined;
  return hostHeader
    .replace(/:\d+$/, '')
    .replace(/^\[|\]$/g, '')
    .toLowerCase();
}

/**
 * Where the app serves a request that was sent to one of Baseten's or the
 * Hub's hosts: the control plane keeps its path, the Hub moves under /hf, a
 * model deployment becomes a deployed checkpoint's inference door
 * (`/model/{model_id}/deployment/{deployment_id}/sync`), its sampler
 * (`/sampler/{id}`) or its run's trainer (`/trainer/{id}`). Undefined: not such a host, or no such deployment (the
 * path then stays as sent, and the 404 names it).
 */
export function appPathOf(core: LoopsCore, host: string, url: string): string | undefined {
  const path = /^https?:\/\//i.test(url) ? url.replace(/^https?:\/\/[^/]*/i, '') || '/' : url;
  if (host === BASETEN_API_HOST || host === BASETEN_APP_HOST) return path;
  if (host === HUB_HOST) return `/hf${path}`;
  const model = MODEL_HOST.exec(host);
  if (!model) return undefined;
  const modelId = model[1]!;
  const byDeployment = DEPLOYMENT_PATH.exec(path);
  if (byDeployment) {
    const [, deploymentId, rest = '', query = ''] = byDeployment;
    // A checkpoint deployed to inference: its own front door, under the same ids.
    if (core.modelDeployments.find(modelId, deploymentId)) return `/model/${modelId}/deployment/${deploymentId}/sync${rest}${query}`;
    const sampler = core.fleet.findModelDeployment(modelId, deploymentId);
    if (sampler) return `/sampler/${sampler.id}${rest}${query}`;
    const run = core.fleet.findRun(deploymentId!);
    if (run && run.deployment_id === modelId) return `/trainer/${run.id}${rest}${query}`;
    return undefined;
  }
  const byEnvironment = ENVIRONMENT_PATH.exec(path);
  if (byEnvironment) {
    const [, rest = '', query = ''] = byEnvironment;
    const deployed = core.modelDeployments.find(modelId);
    if (deployed) return `/model/${modelId}/deployment/${deployed.deployment_id}/sync${rest}${query}`;
    const sampler = core.fleet.findModelDeployment(modelId);
    if (sampler) return `/sampler/${sampler.id}${rest}${query}`;
  }
  return undefined;
}
