import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { LOOPS_API_VERSION, VERSION } from '../index.js';
import { REFERENCE_PATH, REPO_ROOT, referenceAvailable } from './helpers.js';

/** Release hygiene and docs that stand alone (issue 28). */
const read = (path: string) => readFileSync(join(REPO_ROOT, path), 'utf8');
const pkg = JSON.parse(read('package.json')) as Record<string, any>;

describe('release hygiene', () => {
  it('package.json says where the code, the issues and the releases are', () => {
    expect(pkg.repository).toEqual({ type: 'git', url: 'git+https://github.com/loops-mock/loops-mock.git' });
    expect(pkg.bugs.url).toBe('https://github.com/loops-mock/loops-mock/issues');
    expect(pkg.homepage).toBe('https://github.com/loops-mock/loops-mock#readme');
    expect(pkg.files).toContain('CHANGELOG.md');
  });

  it('the changelog has this version, or an Unreleased section above it, and the version policy is documented', () => {
    const changelog = read('CHANGELOG.md');
    expect(changelog).toMatch(new RegExp(`^## (Unreleased.*|${VERSION.replace(/\./g, '\\.')})$`, 'm'));
    expect(changelog).toContain('docs/releases.md');
    expect(read('docs/releases.md')).toMatch(/## Version policy/);
  });

  it('tracks the Loops API version of the published schema', () => {
    expect(LOOPS_API_VERSION).toMatch(/^\d+\.\d+\.\d+$/);
    expect(read('docs/releases.md')).toContain(`\`info.version\`, ${LOOPS_API_VERSION} today`);
    // Where Baseten's document is at hand (beside a checkout, or LOOPS_OPENAPI_REFERENCE), it decides.
    if (referenceAvailable) expect((JSON.parse(readFileSync(REFERENCE_PATH, 'utf8')) as { info: { version: string } }).info.version).toBe(LOOPS_API_VERSION);
  });

  it("installs skip the CUDA download: the docs use ONNXRUNTIME_NODE_INSTALL, the checkout's .npmrc only its own npm ci", () => {
    // The checkout's own `npm ci` (the quick start) must work offline without a variable set first.
    const settings = read('.npmrc')
      .split('\n')
      .filter((l) => l.trim() && !l.trim().startsWith('#'));
    expect(settings).toEqual(['onnxruntime-node-install=skip']);
    for (const doc of ['README.md', 'docs/ci.md', 'python/README.md']) {
      expect(read(doc), doc).not.toMatch(/--onnxruntime-node-install/);
      expect(read(doc), doc).toContain('ONNXRUNTIME_NODE_INSTALL=skip');
    }
    // The variable is what onnxruntime-node's install script reads.
    expect(read('node_modules/onnxruntime-node/script/install-utils.js')).toContain('process.env.ONNXRUNTIME_NODE_INSTALL');
  });
});

describe('npm run test:quick', () => {
  it('runs a list of files that all exist, each a test file the full run has too', async () => {
    const { QUICK_FILES } = await import('../../vitest.quick.config.js');
    expect(pkg.scripts['test:quick']).toBe('vitest run --config vitest.quick.config.ts');
    for (const file of QUICK_FILES) expect(() => readFileSync(join(REPO_ROOT, file)), file).not.toThrow();
    expect(new Set(QUICK_FILES).size).toBe(QUICK_FILES.length);
  });
});

describe('docs that stand alone', () => {
  it('nothing tracked in the repository points to a file outside it', () => {
    const tracked = execFileSync('git', ['ls-files'], { cwd: REPO_ROOT, encoding: 'utf8' })
      .split('\n')
      .filter((f) => /\.(md|ts|mjs|js|py|yml|yaml|sh|json|toml)$/.test(f) && !f.startsWith('sdk-fixtures/') && f !== 'server/test/release.test.ts');
    const outside = /PROTOCOL\.md|\.\.\/shared\b|\/work\//;
    const found = tracked
      .flatMap((f) =>
        read(f)
          .split('\n')
          .map((line, i) => ({ f, i, line }))
          .filter(({ line }) => outside.test(line)),
      )
      // The test helpers may look beside the checkout for Baseten's published schema; the facts they need are committed.
      .filter(({ f }) => f !== 'server/test/helpers.ts' && f !== 'server/test/reference-schema.test.ts');
    expect(found.map(({ f, i, line }) => `${f}:${i + 1}: ${line.trim().slice(0, 120)}`)).toEqual([]);
  });

  it('python/README.md and README.md install and run the plugin alike', () => {
    const readme = read('README.md');
    const python = read('python/README.md');
    for (const command of ['ONNXRUNTIME_NODE_INSTALL=skip npm install --save-dev loops-mock', 'pip install ./node_modules/loops-mock/python']) {
      expect(readme, command).toContain(command);
      expect(python, command).toContain(command);
    }
    expect(python).toContain('loops-mock serve --port 0 --exit-with-parent --admin --admin-token <random>');
    expect(readme).toMatch(/`--exit-with-parent` \(the server stops by itself if pytest dies/);
  });
});
