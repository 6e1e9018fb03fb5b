import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { BASE_MODELS, findBaseModel, hfModelFiles, type EnginePool } from '../../models/index.js';
import { VERSION } from '../version.js';
import { notFound } from './errors.js';

/** One file of a Hub repository as the mirror serves it. */
export interface HubFile {
  /** Path inside the repo, e.g. `tokenizer.json`. */
  name: string;
  size: number;
  /** Git's blob id of the content: the Hub's ETag for a file kept in git. */
  blobId: string;
  /** For a large file the Hub keeps in LFS: its SHA-256, which is then the ETag (huggingface_hub checks a local copy against it). */
  lfsSha256?: string;
  content: Buffer;
}

/** A repository at its one revision. */
export interface HubRepo {
  id: string;
  /** The commit every revision name of this repo resolves to. */
  sha: string;
  files: HubFile[];
  /** Last change of any file, for the Hub's `lastModified`. */
  lastModified: Date;
}

/** Revision names a repo answers to besides its commit sha. */
const BRANCHES = ['main'];
/** Files the Hub would keep in LFS: the weights. */
const LFS_SUFFIX = '.safetensors';

/**
 * The Hugging Face repositories loops-mock mirrors: one per supported base
 * model, holding what the engine itself computes with, so a client that
 * loads from the Hub gets the mock's numbers: the tokenizer files (a user's
 * `--tokenizer NAME=PATH` for NAME) and the tiny base model as a
 * LlamaForCausalLM (config.json, generation_config.json, model.safetensors:
 * the engine's seeded weights). Each repo has one revision, `main`, whose
 * commit sha follows from the files, so it changes when they do. A repo is
 * built on its first request (the weights take a few hundred milliseconds and
 * about 80 MB) and kept.
 */
export class HubRepos {
  private readonly repos = new Map<string, HubRepo>();
  /** Tokenizer file contents by path: the models of one tokenizer family share their files. */
  private readonly contents = new Map<string, { content: Buffer; mtime: Date }>();
  private readonly started = new Date();

  constructor(private readonly engines: EnginePool) {}

  /** Every mirrored repo id. */
  ids(): string[] {
    return BASE_MODELS.map((m) => m.name);
  }

  /** The repo named `id`, or 404 with the hub's RepoNotFound meaning. */
  repo(id: string): HubRepo {
    let repo = this.repos.get(id);
    if (!repo) {
      if (!findBaseModel(id)) throw notFound(`Repository '${id}' is not mirrored by loops-mock: it serves the supported base models (${this.ids().join(', ')}).`, { hub_error: 'RepoNotFound' });
      repo = this.build(id);
      this.repos.set(id, repo);
    }
    return repo;
  }

  /** The repo at `revision` (a branch name or its commit sha), or 404 RevisionNotFound. */
  at(id: string, revision: string): HubRepo {
    const repo = this.repo(id);
    if (!BRANCHES.includes(revision) && revision !== repo.sha) {
      throw notFound(`Revision '${revision}' is not a revision of ${id}: it has ${BRANCHES.join(', ')} (commit ${repo.sha}).`, { hub_error: 'RevisionNotFound' });
    }
    return repo;
  }

  /** One file at a revision, or 404 EntryNotFound naming the files there are. */
  file(id: string, revision: string, name: string): { repo: HubRepo; file: HubFile } {
    const repo = this.at(id, revision);
    const file = repo.files.find((f) => f.name === name);
    if (!file) throw notFound(`${id} has no file '${name}' at ${revision}; its files: ${repo.files.map((f) => f.name).join(', ')}.`, { hub_error: 'EntryNotFound', hub_commit: repo.sha });
    return { repo, file };
  }

  private build(id: string): HubRepo {
    const sources = this.engines.tokenizers.files(id);
    const contents: [string, Buffer][] = [];
    let lastModified = this.started;
    for (const [name, path] of [['tokenizer.json', sources.tokenizerJson], ['tokenizer_config.json', sources.configJson]] as const) {
      if (!path) continue;
      let source = this.contents.get(path);
      if (!source) this.contents.set(path, (source = { content: readFileSync(path), mtime: statSync(path).mtime }));
      if (source.mtime > lastModified) lastModified = source.mtime;
      contents.push([name, name === 'tokenizer_config.json' ? tokenizerConfigAsIs(source.content) : source.content]);
    }
    const engine = this.engines.get(id);
    const tokenizer = this.engines.tokenizers.get(id);
    const model = hfModelFiles({
      modelName: id, dims: engine.dims, maxPositions: findBaseModel(id)!.maxContextLength, eosTokenIds: tokenizer.eosTokenIds, padTokenId: tokenizer.padTokenId, version: VERSION,
    });
    for (const f of model) contents.push([f.relative_file_name, Buffer.from(f.data.buffer, f.data.byteOffset, f.data.byteLength)]);
    const files = contents.map(([name, content]): HubFile => ({
      name, size: content.length, blobId: gitBlobId(content), content,
      ...(name.endsWith(LFS_SUFFIX) ? { lfsSha256: createHash('sha256').update(content).digest('hex') } : {}),
    }));
    const tree = createHash('sha1');
    for (const f of files) tree.update(`${f.name}\0${f.blobId}\n`);
    return { id, sha: tree.digest('hex'), files, lastModified };
  }
}

function gitBlobId(content: Buffer): string {
  return createHash('sha1').update(`blob ${content.length}\0`).update(content).digest('hex');
}

/**
 * transformers 5 rebuilds a Llama tokenizer's pre-tokenizer from its class instead of reading tokenizer.json, and
 * then encodes other ids ("You are here": [3476, 591, 1036] for the mock's [3476, 477, 2155] in the DeepSeek V3
 * files). The mirror names the generic fast class for them, so AutoTokenizer encodes with tokenizer.json as the
 * mock does; any other config is served as it is.
 */
function tokenizerConfigAsIs(content: Buffer): Buffer {
  let config: Record<string, unknown>;
  try {
    config = JSON.parse(content.toString('utf8')) as Record<string, unknown>;
  } catch {
    return content;
  }
  if (config.tokenizer_class !== 'LlamaTokenizerFast' && config.tokenizer_class !== 'LlamaTokenizer') return content;
  return Buffer.from(JSON.stringify({ ...config, tokenizer_class: 'PreTrainedTokenizerFast' }, null, 2));
}
