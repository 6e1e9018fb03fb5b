import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { WARM_UP_KINDS } from '../engine-warm-up.js';
import { GraphRunner } from '../graph-runner.js';
import { shippedCacheDir } from '../package-root.js';
import { FAMILY_VOCAB } from '../registry.js';
import { DEFAULT_DIMS } from '../transformer.js';

// Issue 29: the package's build optimizes the warm-up's graphs on the machine it runs on, so that a first process
// on an empty --cache-dir (or none) skips onnxruntime's optimization as a second one does.
describe("the warm-up's graphs optimized by the build", () => {
  it('are kept for each built-in family, plain and merged', () => {
    const files = readdirSync(join(shippedCacheDir()!, 'onnxruntime-models'));
    // Every warm-up kind, plain and with the unembedding merged.
    expect(files.filter((f) => f.endsWith('.bin'))).toHaveLength(Object.keys(FAMILY_VOCAB).length * 2 * WARM_UP_KINDS.length);
  });

  it("serve a runner of either family with no cache folder: each warm-up session from the package's entries, none optimized here", async () => {
    for (const [family, vocab] of Object.entries(FAMILY_VOCAB)) {
      const runner = new GraphRunner({ modelName: family, dims: { vocab, ...DEFAULT_DIMS }, device: 'cpu', cacheDir: null });
      await runner.prebuild(WARM_UP_KINDS);
      expect(runner.sessionSources(), family).toMatchObject({ shipped: WARM_UP_KINDS.length, off: 0, miss: 0 });
    }
  });
});
