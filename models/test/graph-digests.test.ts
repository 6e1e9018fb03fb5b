import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { WARM_UP_KINDS } from '../engine-warm-up.js';
import { builtInGraphSpecs, graphDigest, graphDigests, graphSpecKey } from '../graph-digests.js';
import { GraphRunner } from '../graph-runner.js';
import { FAMILY_VOCAB } from '../registry.js';
import { DEFAULT_DIMS, type ModelDims } from '../transformer.js';
import { buildGraph } from '../transformer-graphs.js';

// Issue 29: a session whose optimized graph is kept is made without building the graph, from digests the build
// writes into the bundle beside the code that builds the graphs.
const root = mkdtempSync(join(tmpdir(), 'loops-mock-graph-digests-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("the graphs' digests known ahead", () => {
  it('cover every warm-up kind of both built-in families, and are the digests of the graphs this source builds', () => {
    const table = graphDigests(builtInGraphSpecs());
    for (const vocab of Object.values(FAMILY_VOCAB)) {
      const dims: ModelDims = { vocab, ...DEFAULT_DIMS };
      for (const kind of WARM_UP_KINDS) {
        const key = graphSpecKey({ kind, dims, merged: false, mixed: false });
        expect(table[key]).toBe(graphDigest(buildGraph(kind, dims).onnx));
      }
      // Merged and mixed are other graphs, under other names.
      const merged = table[graphSpecKey({ kind: 'greedy', dims, merged: true, mixed: false })];
      expect(merged).toBe(graphDigest(buildGraph('greedy', dims, { mergedUnembedding: true }).onnx));
      expect(merged).not.toBe(table[graphSpecKey({ kind: 'greedy', dims, merged: false, mixed: false })]);
    }
    // The dimensions' order does not change a spec's name.
    const dims = { ...DEFAULT_DIMS, vocab: 7 };
    const reordered = { vocab: 7, ffn: dims.ffn, heads: dims.heads, layers: dims.layers, dModel: dims.dModel };
    expect(graphSpecKey({ kind: 'forward', dims: reordered, merged: false, mixed: false })).toBe(
      graphSpecKey({ kind: 'forward', dims, merged: false, mixed: false }),
    );
  });

  it("are in the built bundle (npm test builds first): the same digests as this source's graphs", () => {
    const bundle = join(import.meta.dirname, '..', '..', 'dist', 'bundle');
    const text = readdirSync(bundle)
      .filter((f) => f.endsWith('.js'))
      .map((f) => readFileSync(join(bundle, f), 'utf8'))
      .join('\n');
    const table = graphDigests(builtInGraphSpecs());
    expect(Object.keys(table).length).toBeGreaterThanOrEqual(2 * 2 * WARM_UP_KINDS.length);
    for (const digest of Object.values(table)) expect(text).toContain(digest);
  });

  it('let a runner make a kept session without building its graph; without them it builds the graph to hash it', async () => {
    const dims: ModelDims = { ...DEFAULT_DIMS, vocab: 500 };
    const config = { modelName: 'Qwen/Qwen3.5-2B', dims, device: 'cpu' as const, cacheDir: join(root, 'cache'), threads: 1 };
    const table = graphDigests(['forward', 'backward'].map((kind) => ({ kind: kind as 'forward', dims, merged: false, mixed: false })));
    await new GraphRunner(config, table).prebuild(['forward', 'backward']);
    const ahead = new GraphRunner(config, table);
    await ahead.prebuild(['forward', 'backward']);
    expect(ahead.sessionSources()).toMatchObject({ hit: 2, graphsBuilt: 0 });
    const hashed = new GraphRunner(config, null);
    await hashed.prebuild(['forward', 'backward']);
    expect(hashed.sessionSources()).toMatchObject({ hit: 2, graphsBuilt: 2 });
    // A kind the table does not name is built and hashed as before.
    await ahead.prebuild(['greedy']);
    expect(ahead.sessionSources()).toMatchObject({ miss: 1, graphsBuilt: 1 });
  });
});
