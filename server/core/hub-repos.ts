import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { BASE_MODELS, findBaseModel, hfModelFiles, type EnginePool, type HfModelInfo } from '../../models/index.js';
import { LruMap } from '../../models/lru.js';
import { VERSION } from '../version.js';
import { notFound } from './errors.js';

/** One file of a Hub repository as the mirror lists it; its bytes come from HubRepos.content. */
export interface HubFile {
  /** Path inside the repo, e.g. `tokenizer.json`. */
  name: string;
  size: number;
  /** Git's blob id of the content: the Hub's ETag for a file kept in git. */
  blobId: string;
  /** For a large file the Hub keeps in LFS: its SHA-256, which is then the ETag (huggingface_hub checks a local copy against it). */
  lfsSha256?: string;
}

/** A repository at its one revision. */
export interface HubRepo {
  id: string;
  /** The commit every revision name of this repo resolves to. */
  sha: string;
  files: readonly HubFile[];
  /** Last change of any file, for the Hub's `lastModified`. */
  lastModified: Date;
}

/** How many repos' weights the mirror holds by default (~78 MB each with Qwen's vocabulary, ~66 MB with DeepSeek's). */
export const HUB_WEIGHTS_HELD = 2;

export interface HubReposOptions {
  /** How many repos' `model.safetensors` stay built, the least recently served going first (default HUB_WEIGHTS_HELD). */
  weightsHeld?: number;
}

/** Revision names a repo answers to besides its commit sha. */
const BRANCHES = ['main'];
/** Files the Hub would keep in LFS: the weights. */
const LFS_SUFFIX = '.safetensors';

/** What the mirror keeps of a repo it has listed: the listing, and where each file's bytes come from. */
interface Listed {
  repo: HubRepo;
  /** The inputs the weights are made from again after eviction (the same bytes: they are seeded). */
  model: HfModelInfo;
  /** The small files (config.json, generation_config.json): a few hundred bytes each, kept. */
  small: Map<string, Buffer>;
  /** The tokenizer files by name: paths into the shared `tokenizerFiles`. */
  tokenizerPaths: Map<string, string>;
}

/**
 * The Hugging Face repositories loops-mock mirrors: one per supported base
 * model, holding what the engine itself computes with, so a client that
 * loads from the Hub gets the mock's numbers: the tokenizer files (a user's
 * `--tokenizer NAME=PATH` for NAME) and the tiny base model as a
 * LlamaForCausalLM (config.json, generation_config.json, model.safetensors:
 * the engine's seeded weights). Each repo has one revision, `main`, whose
 * commit sha follows from the files, so it changes when they do.
 *
 * Memory stays bounded however many repos are asked about: a repo's listing
 * (names, sizes, hashes) is made on its first request, which builds the
 * weights once to hash them (a few hundred milliseconds), and kept; the
 * weights themselves (~78 MB a repo) are held for the last `weightsHeld`
 * repos served and made again, byte for byte, when an evicted repo's are
 * asked for. Tokenizer files are read once per path and shared by every repo
 * of the family, and the built-in families' special ids are read without
 * loading the whole tokenizer.
 */
export class HubRepos {
  private readonly listed = new Map<string, Listed>();
  private readonly weights: LruMap<string, Buffer>;
  /** Tokenizer files as served, by path: the models of one tokenizer family share them. */
  private readonly tokenizerFiles = new Map<string, { content: Buffer; mtime: Date }>();
  /** The built-in families' end-of-sequence and padding ids, by tokenizer.json path. */
  private readonly familyIds = new Map<string, { eosTokenIds: number[]; padTokenId?: number }>();
  private readonly started = new Date();

  constructor(
    private readonly engines: EnginePool,
    options: HubReposOptions = {},
  ) {
    this.weights = new LruMap(options.weightsHeld ?? HUB_WEIGHTS_HELD);
  }

  /** Every mirrored repo id. */
  ids(): string[] {
    return BASE_MODELS.map((m) => m.name);
  }

  /** How many repos' weights are built and held now. */
  weightsHeld(): number {
    return this.weights.size;
  }

  /** Whether `id`'s weights are held now (asking does not make them the newest). */
  holdsWeights(id: string): boolean {
    return this.weights.peek(id) !== undefined;
  }

  /** The repo named `id`, or 404 with the hub's RepoNotFound meaning. */
  repo(id: string): HubRepo {
    return this.list(id).repo;
  }

  /** The repo at `revision` (a branch name or its commit sha), or 404 RevisionNotFound. */
  at(id: string, revision: string): HubRepo {
    const repo = this.repo(id);
    if (!BRANCHES.includes(revision) && revision !== repo.sha) {
      throw notFound(`Revision '${revision}' is not a revision of ${id}: it has ${BRANCHES.join(', ')} (commit ${repo.sha}).`, {
        hub_error: 'RevisionNotFound',
      });
    }
    return repo;
  }

  /** One file at a revision, or 404 EntryNotFound naming the files there are. */
  file(id: string, revision: string, name: string): { repo: HubRepo; file: HubFile } {
    const repo = this.at(id, revision);
    const file = repo.files.find((f) => f.name === name);
    if (!file)
      throw notFound(`${id} has no file '${name}' at ${revision}; its files: ${repo.files.map((f) => f.name).join(', ')}.`, {
        hub_error: 'EntryNotFound',
        hub_commit: repo.sha,
      });
    return { repo, file };
  }

  /** The bytes of one of a repo's files: the weights from the bounded cache, made again after eviction. */
  content(repo: HubRepo, file: HubFile): Buffer {
    const listed = this.list(repo.id);
    const small = listed.small.get(file.name);
    if (small) return small;
    const path = listed.tokenizerPaths.get(file.name);
    if (path) return this.tokenizerFiles.get(path)!.content;
    let weights = this.weights.get(repo.id);
    if (!weights) {
      weights = this.makeWeights(listed.model);
      this.weights.set(repo.id, weights);
    }
    return weights;
  }

  private list(id: string): Listed {
    let listed = this.listed.get(id);
    if (!listed) {
      if (!findBaseModel(id))
        throw notFound(`Repository '${id}' is not mirrored by loops-mock: it serves the supported base models (${this.ids().join(', ')}).`, {
          hub_error: 'RepoNotFound',
        });
      listed = this.build(id);
      this.listed.set(id, listed);
    }
    return listed;
  }

  private build(id: string): Listed {
    const sources = this.engines.tokenizers.files(id);
    const contents: [string, Buffer][] = [];
    const tokenizerPaths = new Map<string, string>();
    let lastModified = this.started;
    for (const [name, path] of [
      ['tokenizer.json', sources.tokenizerJson],
      ['tokenizer_config.json', sources.configJson],
    ] as const) {
      if (!path) continue;
      let source = this.tokenizerFiles.get(path);
      if (!source) {
        const read = readFileSync(path);
        source = { content: name === 'tokenizer_config.json' ? tokenizerConfigAsIs(read) : read, mtime: statSync(path).mtime };
        this.tokenizerFiles.set(path, source);
      }
      if (source.mtime > lastModified) lastModified = source.mtime;
      contents.push([name, source.content]);
      tokenizerPaths.set(name, path);
    }
    const { eosTokenIds, padTokenId } = this.specialIds(id);
    const model: HfModelInfo = {
      modelName: id,
      dims: this.engines.get(id).dims,
      maxPositions: findBaseModel(id)!.maxContextLength,
      eosTokenIds,
      version: VERSION,
      ...(padTokenId !== undefined ? { padTokenId } : {}),
    };
    const small = new Map<string, Buffer>();
    for (const f of hfModelFiles(model)) {
      const content = Buffer.from(f.data.buffer, f.data.byteOffset, f.data.byteLength);
      contents.push([f.relative_file_name, content]);
      // A client that asks for the listing fetches the files next: the weights just made are the cache's newest.
      if (f.relative_file_name.endsWith(LFS_SUFFIX)) this.weights.set(id, content);
      else small.set(f.relative_file_name, content);
    }
    const files = contents.map(
      ([name, content]): HubFile => ({
        name,
        size: content.length,
        blobId: gitBlobId(content),
        ...(name.endsWith(LFS_SUFFIX) ? { lfsSha256: createHash('sha256').update(content).digest('hex') } : {}),
      }),
    );
    const tree = createHash('sha1');
    for (const f of files) tree.update(`${f.name}\0${f.blobId}\n`);
    return { repo: { id, sha: tree.digest('hex'), files, lastModified }, model, small, tokenizerPaths };
  }

  private makeWeights(model: HfModelInfo): Buffer {
    const f = hfModelFiles(model).find((m) => m.relative_file_name.endsWith(LFS_SUFFIX))!;
    return Buffer.from(f.data.buffer, f.data.byteOffset, f.data.byteLength);
  }

  /**
   * The ids generation_config.json names. A built-in family's come without loading its whole tokenizer
   * (~85 MB resident, kept): the end-of-sequence ids the registry holds, the padding token's id looked up
   * among the file's added tokens as tokenizers.ts does (a test holds them equal). Other tokenizers are loaded.
   */
  private specialIds(id: string): { eosTokenIds: number[]; padTokenId?: number } {
    const { family, tokenizerJson, configJson } = this.engines.tokenizers.files(id);
    if (!family) {
      const t = this.engines.tokenizers.get(id);
      return { eosTokenIds: t.eosTokenIds, ...(t.padTokenId !== undefined ? { padTokenId: t.padTokenId } : {}) };
    }
    let ids = this.familyIds.get(tokenizerJson);
    if (!ids) {
      const config = configJson ? (JSON.parse(readFileSync(configJson, 'utf8')) as { pad_token?: string | { content?: string } }) : {};
      const padText = typeof config.pad_token === 'string' ? config.pad_token : config.pad_token?.content;
      const added = (JSON.parse(readFileSync(tokenizerJson, 'utf8')) as { added_tokens?: { id: number; content: string }[] }).added_tokens ?? [];
      const padTokenId = padText === undefined ? undefined : added.find((a) => a.content === padText)?.id;
      ids = { eosTokenIds: this.engines.sampleCodec(id).eosTokenIds, ...(padTokenId !== undefined ? { padTokenId } : {}) };
      this.familyIds.set(tokenizerJson, ids);
    }
    return ids;
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
