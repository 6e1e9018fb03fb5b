import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const bundle = join(import.meta.dirname, '..', '..', 'dist', 'bundle');

/** The bundle's files an entry loads before its first line runs: its static imports, and theirs (a dynamic import() is left out). */
function loadedAtStart(entry: string): string[] {
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const text = readFileSync(join(bundle, file), 'utf8');
    for (const m of text.matchAll(/\bfrom\s*["']\.\/([^"']+)["']|\bimport\s*["']\.\/([^"']+)["']/g)) visit(m[1] ?? m[2]!);
  };
  visit(entry);
  return [...seen];
}

const holdsGraphBuilder = (file: string) => readFileSync(join(bundle, file), 'utf8').includes('node_modules/onnx-proto/');

describe('the graph builder (transformer-graphs.ts) in the built bundle (npm test builds first)', () => {
  it("is not loaded by the server's thread at start: the worker that builds the sessions loads it", () => {
    const server = loadedAtStart('cli.js');
    expect(server.length).toBeGreaterThan(1);
    expect(server.filter(holdsGraphBuilder)).toEqual([]);
    expect(loadedAtStart('engine-worker.js').some(holdsGraphBuilder)).toBe(true);
  });
});
