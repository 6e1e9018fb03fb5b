import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** This package's folder and its package.json, found from a file of it whether it runs from source, dist/ or the bundle. */
export function packageRoot(from: string): { dir: string; version: string } | null {
  let dir = dirname(fileURLToPath(from));
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
