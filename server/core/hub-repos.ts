import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { BASE_MODELS, findBaseModel, type Tokenizers } from '../../models/index.js';
import { notFound } from './errors.js';

/** One file of a Hub repository as the mirror serves it. */
export interface HubFile {
  /** Path inside the repo, e.g. `tokenizer.json`. */
  name: string;
  size: number;
  /** Git's blob id of the content (what the Hub's ETag is for a file kept in git). */
  blobId: string;
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

/**
 * The Hugging Face repositories loops-mock mirrors: one per supported base
 * model, holding the tokenizer files the engine itself reads (a user's
 * `--tokenizer NAME=PATH` for NAME), so that a client's tokenizer encodes
 * exactly as the mock does. Each repo has one revision, `main`, whose commit
 * sha follows from the files, so it changes when they do.
 */
export class HubRepos {
  private readonly repos = new Map<string, HubRepo>();
  /** File contents by path: the models of one tokenizer family share their files. */
  private readonly contents = new Map<string, { content: Buffer; blobId: string; mtime: Date }>();

  constructor(private readonly tokenizers: Tokenizers) {}

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
    const sources = this.tokenizers.files(id);
    const paths: [string, string | null][] = [['tokenizer.json', sources.tokenizerJson], ['tokenizer_config.json', sources.configJson]];
    const files: HubFile[] = [];
    let lastModified = new Date(0);
    for (const [name, path] of paths) {
      if (!path) continue;
      let source = this.contents.get(path);
      if (!source) {
        const content = readFileSync(path);
        source = { content, blobId: gitBlobId(content), mtime: statSync(path).mtime };
        this.contents.set(path, source);
      }
      if (source.mtime > lastModified) lastModified = source.mtime;
      files.push({ name, size: source.content.length, blobId: source.blobId, content: source.content });
    }
    const tree = createHash('sha1');
    for (const f of files) tree.update(`${f.name}\0${f.blobId}\n`);
    return { id, sha: tree.digest('hex'), files, lastModified };
  }
}

function gitBlobId(content: Buffer): string {
  return createHash('sha1').update(`blob ${content.length}\0`).update(content).digest('hex');
}
