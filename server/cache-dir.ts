/**
 * Where a server keeps what it can reuse between processes (--cache-dir, LOOPS_MOCK_CACHE_DIR): onnxruntime's
 * optimized graphs, the stop-string decoder's tables and, on Node 22.1 and later, Node's compile cache of the
 * server's modules.
 * Everything in it can be deleted at any time; `none` keeps nothing. Read by bin/loops-mock.js before the
 * server's modules load (the compile cache only covers modules loaded after it is switched on), so this file
 * imports nothing of the server.
 */
import { rm } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import module from 'node:module';

/** `$XDG_CACHE_HOME/loops-mock`, else `~/.cache/loops-mock`. */
export function defaultCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'loops-mock');
}

/** The folder of a server's `cacheDir` option: absent, the default one; null, none. */
export function cacheDirOption(option: string | null | undefined): string | null {
  return option === undefined ? defaultCacheDir() : option;
}

/** The flag's or variable's value as the server reads it: a folder, or null for none (the flag beats the variable). */
export function cacheDirOf(argv: string[], env: NodeJS.ProcessEnv = process.env): string | null {
  let given: string | undefined = env.LOOPS_MOCK_CACHE_DIR;
  argv.forEach((arg, i) => {
    if (arg === '--cache-dir') given = argv[i + 1];
    else if (arg.startsWith('--cache-dir=')) given = arg.slice('--cache-dir='.length);
  });
  if (given === 'none') return null;
  return given || defaultCacheDir(env);
}

/**
 * Switches on Node's compile cache in `<cache>/node-compile` where this Node has one (22.1+): a later process
 * reads the compiled code of the server's modules instead of compiling them again. Node checks each entry
 * against its source and Node version and compiles afresh where one does not match. Returns the folder, or
 * null where there is none (Node 20, --cache-dir none, a folder that cannot be made).
 */
export function enableNodeCompileCache(argv: string[], env: NodeJS.ProcessEnv = process.env): string | null {
  const dir = cacheDirOf(argv, env);
  const enable = (module as { enableCompileCache?: (dir: string) => { status: number; directory?: string } }).enableCompileCache;
  if (!dir || !enable) return null;
  try {
    const result = enable(join(dir, 'node-compile'));
    return result.directory ?? null;
  } catch {
    return null;
  }
}

/**
 * Writes what the compile cache holds so far (Node writes it at exit otherwise, and a server stopped by SIGKILL,
 * as CI jobs often end, never exits): called once the server listens, its modules all loaded.
 */
export function flushNodeCompileCache(): void {
  try {
    (module as { flushCompileCache?: () => void }).flushCompileCache?.();
  } catch {
    // Only the next start's time is at stake.
  }
}

/**
 * Folders of kinds this version no longer keeps, removed once the server is ready: `base-weights/` (39 MB a model;
 * the weights are now made at each start, sooner than a kept copy was read back and checked).
 */
const RETIRED_FOLDERS = ['base-weights'];

/** Removes the retired folders from `dir` in the background; one that cannot be removed is left as it is. */
export function removeRetiredEntries(dir: string | null): void {
  if (!dir) return;
  for (const folder of RETIRED_FOLDERS) rm(join(dir, folder), { recursive: true, force: true }).catch(() => undefined);
}
