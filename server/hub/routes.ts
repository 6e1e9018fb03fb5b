import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import Type from 'typebox';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import type { HubFile, HubRepo } from '../core/hub-repos.js';
import { sendError } from '../http/errors.js';

const RepoParams = Type.Object({ org: Type.String(), name: Type.String() });
const RevisionParams = Type.Object({ org: Type.String(), name: Type.String(), revision: Type.String() });
const FileParams = Type.Object({ org: Type.String(), name: Type.String(), revision: Type.String(), '*': Type.String() });
const TreeQuery = Type.Object({ recursive: Type.Optional(Type.String()), expand: Type.Optional(Type.String()) }, { additionalProperties: true });

/**
 * The Hugging Face Hub mirror at `{url}/hf` (HF_ENDPOINT), and at
 * huggingface.co itself in proxy mode: model info, file trees and
 * `resolve` downloads (HEAD and GET, with ETag, X-Repo-Commit and Range), and
 * the Hub's X-Error-Code on every miss so that huggingface_hub raises its
 * own RepositoryNotFoundError / RevisionNotFoundError / EntryNotFoundError
 * (and transformers skips the optional files a repo lacks).
 */
export function hubRoutes(appIn: FastifyInstance, core: LoopsCore): void {
  const app = appIn.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ['hub'];
  const repoId = (p: { org: string; name: string }) => `${p.org}/${p.name}`;

  app.get(
    '/hf/api/models/:org/:name',
    {
      schema: { tags, summary: 'Hub model info at main: sha and siblings', params: RepoParams },
    },
    (req, reply) => answer(reply, () => modelInfo(core.hub.repo(repoId(req.params)))),
  );

  app.get(
    '/hf/api/models/:org/:name/revision/:revision',
    {
      schema: { tags, summary: 'Hub model info at a revision (main or its commit sha)', params: RevisionParams },
    },
    (req, reply) => answer(reply, () => modelInfo(core.hub.at(repoId(req.params), req.params.revision))),
  );

  const tree = (req: FastifyRequest<{ Params: { org: string; name: string; revision: string; '*'?: string } }>, reply: FastifyReply) =>
    answer(reply, () => {
      const repo = core.hub.at(repoId(req.params), req.params.revision);
      const folder = (req.params['*'] ?? '').replace(/\/+$/, '');
      // The mirror's repos are flat: the root lists every file, any folder is absent.
      if (folder)
        throw new LoopsError('not_found', `${repo.id} has no folder '${folder}' at ${req.params.revision}.`, {
          hub_error: 'EntryNotFound',
          hub_commit: repo.sha,
        });
      return repo.files.map((f) => ({
        type: 'file',
        oid: f.blobId,
        size: f.size,
        path: f.name,
        ...(f.lfsSha256 ? { lfs: { oid: f.lfsSha256, size: f.size, pointerSize: lfsPointerSize(f) } } : {}),
      }));
    });
  app.get(
    '/hf/api/models/:org/:name/tree/:revision',
    { schema: { tags, summary: 'Hub file tree of a revision', params: RevisionParams, querystring: TreeQuery } },
    tree,
  );
  app.get(
    '/hf/api/models/:org/:name/tree/:revision/*',
    { schema: { tags, summary: 'Hub file tree of a folder (the mirror has none)', params: FileParams, querystring: TreeQuery } },
    tree,
  );

  app.get(
    '/hf/:org/:name/resolve/:revision/*',
    {
      schema: { tags, summary: 'A file of a Hub repo (HEAD for its metadata; Range supported)', params: FileParams },
    },
    (req, reply) => {
      let found: { repo: HubRepo; file: HubFile };
      try {
        found = core.hub.file(repoId(req.params), req.params.revision, req.params['*']);
      } catch (err) {
        return hubError(reply, err);
      }
      const { repo, file } = found;
      reply.header('x-repo-commit', repo.sha);
      // A file the Hub keeps in LFS is named by its SHA-256 (what huggingface_hub checks a local copy against); others by their git blob id.
      reply.header('etag', `"${file.lfsSha256 ?? file.blobId}"`);
      if (file.lfsSha256) reply.header('x-linked-etag', `"${file.lfsSha256}"`).header('x-linked-size', String(file.size));
      reply.header('accept-ranges', 'bytes');
      reply.header('content-type', file.name.endsWith('.json') ? 'application/json' : 'application/octet-stream');
      reply.header('content-disposition', `inline; filename="${file.name}"`);
      const range = req.headers.range;
      const span = range === undefined ? { start: 0, end: file.size - 1 } : parseRange(range, file.size);
      if (!span) {
        reply.header('content-range', `bytes */${file.size}`);
        return sendError(
          reply,
          416,
          'range_not_satisfiable',
          `Range '${range}' does not fit ${file.name} (${file.size} bytes): send bytes=START-[END] within it.`,
          { field: 'Range' },
        );
      }
      if (range !== undefined) reply.code(206).header('content-range', `bytes ${span.start}-${span.end}/${file.size}`);
      // HEAD answers from the listing: an evicted repo's weights are not made again just to be measured.
      if (req.method === 'HEAD') return reply.header('content-length', String(span.end - span.start + 1)).send(Readable.from([]));
      const content = core.hub.content(repo, file);
      return reply.send(range === undefined ? content : content.subarray(span.start, span.end + 1));
    },
  );
}

/** The Hub's model-info object: what huggingface_hub's ModelInfo and transformers read (id, sha, siblings, tags). */
function modelInfo(repo: HubRepo) {
  const [author] = repo.id.split('/');
  return {
    _id: repo.sha.slice(0, 24),
    id: repo.id,
    modelId: repo.id,
    author,
    sha: repo.sha,
    lastModified: repo.lastModified.toISOString(),
    createdAt: repo.lastModified.toISOString(),
    private: false,
    disabled: false,
    gated: false,
    downloads: 0,
    likes: 0,
    library_name: 'transformers',
    tags: ['loops-mock', 'llama', 'text-generation'],
    pipeline_tag: 'text-generation',
    config: { architectures: ['LlamaForCausalLM'], model_type: 'llama' },
    siblings: repo.files.map((f) => ({
      rfilename: f.name,
      size: f.size,
      blobId: f.blobId,
      ...(f.lfsSha256 ? { lfs: { sha256: f.lfsSha256, size: f.size, pointerSize: lfsPointerSize(f) } } : {}),
    })),
    usedStorage: repo.files.reduce((n, f) => n + f.size, 0),
  };
}

/** The length of the git-lfs pointer file that stands for a file in a Hub repo's git history. */
function lfsPointerSize(f: HubFile): number {
  return Buffer.byteLength(`version https://git-lfs.github.com/spec/v1\noid sha256:${f.lfsSha256}\nsize ${f.size}\n`);
}

async function answer<T>(reply: FastifyReply, work: () => T): Promise<T | FastifyReply> {
  try {
    return work();
  } catch (err) {
    return hubError(reply, err);
  }
}

/** A miss in the Hub's terms as well as ours: X-Error-Code picks huggingface_hub's exception, X-Repo-Commit lets it remember a missing file. */
function hubError(reply: FastifyReply, err: unknown): FastifyReply {
  if (!(err instanceof LoopsError) || typeof err.details.hub_error !== 'string') throw err;
  const { hub_error: code, hub_commit: commit, ...details } = err.details;
  reply.header('x-error-code', code);
  reply.header('x-error-message', err.message.replace(/[^\x20-\x7e]/g, '?'));
  if (typeof commit === 'string') reply.header('x-repo-commit', commit);
  return sendError(reply, 404, 'not_found', err.message, { ...details, hub_error: code });
}

/** One `bytes=` range (START-END, START-, or -SUFFIX) within `size`; null when it cannot be served. */
function parseRange(header: string, size: number): { start: number; end: number } | null {
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === '' && m[2] === '')) return null;
  let start: number;
  let end: number;
  if (m[1] === '') {
    const suffix = Number(m[2]);
    if (suffix === 0) return null;
    start = Math.max(0, size - suffix);
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  }
  return start <= end && start < size ? { start, end } : null;
}
