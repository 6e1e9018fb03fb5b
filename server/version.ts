import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The package's own package.json, found from this file whether it runs from source or from dist/. */
function readPackageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const candidate = join(dir, 'package.json');
    if (existsSync(candidate)) {
      const pkg = JSON.parse(readFileSync(candidate, 'utf8')) as { name?: string; version: string };
      if (pkg.name === 'loops-mock') return pkg.version;
    }
    const parent = dirname(dir);
    if (parent === dir) return '0.0.0';
    dir = parent;
  }
}

/** Sent as `X-Loops-Mock-Version` on every response. */
export const VERSION = readPackageVersion();

/**
 * The version of Baseten's published management API schema (its info.version) that this mock's
 * routes and bodies follow; `loops-mock --version` names it. Checked against that document where
 * it is at hand (server/test/release.test.ts).
 */
export const LOOPS_API_VERSION = '1.0.0';
