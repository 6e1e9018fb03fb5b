import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

type PackageRoot = { dir: string; version: string } | null;

/** Found once per folder: the version, the built validators and the shipped tables all ask at start-up. */
const found = new Map<string, PackageRoot>();

/** This package's folder and its package.json, found from a file of it whether it runs from source, dist/ or the bundle. */
export function packageRoot(from: string): PackageRoot {
  const start = dirname(fileURLToPath(from));
  let root = found.get(start);
  if (root === undefined) {
    root = findRoot(start);
    found.set(start, root);
  }
  return root;
}

function findRoot(start: string): PackageRoot {
  let dir = start;
  for (;;) {
    const candidate = join(dir, 'package.json');
    if (existsSync(candidate)) {
      const pkg = JSON.parse(readFileSync(candidate, 'utf8')) as { name?: string; version: string };
      if (pkg.name === 'loops-mock') return { dir, version: pkg.version };
    }
    const parent = dirname(dir);
    if (parent === dir) return null;
    dir = parent;
  }
}

/**
 * Where the package's build keeps cache entries of its own (dist/shipped-cache: the built-in families' decoder
 * tables, the warm-up's optimized graphs), read by a process whose --cache-dir has none yet. Null where the
 * package's folder is not found.
 */
export function shippedCacheDir(): string | null {
  const root = packageRoot(import.meta.url);
  return root ? join(root.dir, 'dist', 'shipped-cache') : null;
}
