import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Type } from 'typebox';
import { Ajv } from 'ajv';
import { afterAll, describe, expect, it } from 'vitest';
import { routeValidatorsSource } from '../build-route-validators.js';
import { buildApp, DEFAULTS, directUrls, LoopsCore } from '../index.js';
import { ajvOptions, loadRouteValidators, routeValidatorsFile, validatorKey } from '../http/route-validators.js';
import { compileSchemasSoon, pendingSchemaCount, validatorCompiler, validatorSources } from '../http/validation.js';

// Under this package's node_modules: the files' code reads ajv's runtime from there, as the built one does (and a
// folder an interrupted run leaves is never packed).
const cacheRoot = join(dirname(dirname(routeValidatorsFile()!)), 'node_modules', '.cache');
mkdirSync(cacheRoot, { recursive: true });
const dir = mkdtempSync(join(cacheRoot, 'loops-mock-route-validators-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const Rank = Type.Object(
  { rank: Type.Integer({ minimum: 1, maximum: 8 }), name: Type.Optional(Type.String({ maxLength: 4 })) },
  { additionalProperties: false },
);

describe('route validators compiled when the package is built', () => {
  it('serve every schema of the app with all its front doors: ajv compiles none at start-up', async () => {
    const core = new LoopsCore();
    const app = await buildApp(core, { ...DEFAULTS, admin: true, urls: directUrls(() => 'http://127.0.0.1') });
    try {
      await app.ready();
      compileSchemasSoon(0);
      const started = Date.now();
      while (pendingSchemaCount() > 0 && Date.now() - started < 5000) await new Promise((r) => setTimeout(r, 10));
      expect(pendingSchemaCount()).toBe(0);
      expect(loadRouteValidators().refused, `the built file ${routeValidatorsFile()}: run npm run build`).toBeNull();
      // A schema edited since the last build shows here as one compiled: `npm run build` writes the file again.
      expect(validatorSources.compiled, 'schemas missing from dist/route-validators.cjs: run npm run build').toBe(0);
      expect(validatorSources.built).toBeGreaterThan(40);
    } finally {
      await app.close();
      core.close();
    }
  });

  it('check what ajv checks, errors alike, for bodies as sent and text coerced', async () => {
    const file = join(dir, 'same.cjs');
    writeFileSync(
      file,
      (
        await routeValidatorsSource([
          { kind: 'body', schema: Rank },
          { kind: 'text', schema: Rank },
        ])
      ).source,
    );
    const built = loadRouteValidators(file);
    expect(built.refused, String(built.refused)).toBeNull();
    const cases: unknown[] = [
      { rank: 4 },
      { rank: 9 },
      { rank: '4' },
      { rank: 0, name: 'x' },
      { rank: 2, name: 'toolong' },
      { rank: 2, extra: 1 },
      {},
      [],
      null,
    ];
    for (const kind of ['body', 'text'] as const) {
      const ahead = built.get(kind, validatorKey(kind, Rank))!;
      expect(ahead, kind).toBeTypeOf('function');
      const now = new Ajv(ajvOptions(kind)).compile(Rank);
      for (const value of cases) {
        const [a, b] = [structuredClone(value), structuredClone(value)];
        expect(ahead(a), `${kind} ${JSON.stringify(value)}`).toBe(now(b));
        // The coerced value too: a query's "4" becomes 4 either way.
        expect(a).toEqual(b);
        const strip = (errors: typeof now.errors) =>
          errors?.map(({ keyword, instancePath, params, data }) => ({ keyword, instancePath, params, data })) ?? null;
        expect(strip(ahead.errors), `${kind} ${JSON.stringify(value)}`).toEqual(strip(now.errors));
      }
    }
  });

  it('are never used for a schema that differs from the one built, or from a file of other versions', async () => {
    const file = join(dir, 'stale.cjs');
    writeFileSync(file, (await routeValidatorsSource([{ kind: 'body', schema: Rank }])).source);
    const edited = Type.Object({ rank: Type.Integer({ minimum: 1, maximum: 16 }) }, { additionalProperties: false });
    const built = loadRouteValidators(file);
    expect(built.get('body', validatorKey('body', Rank))).toBeTypeOf('function');
    expect(built.get('body', validatorKey('body', edited))).toBeUndefined();
    // The same schema checked as text is another check (coercion): not the body's function.
    expect(built.get('text', validatorKey('text', Rank))).toBeUndefined();

    // An edited schema the server meets is compiled, and checks the edit.
    const before = validatorSources.compiled;
    const validate = validatorCompiler({ schema: edited, httpPart: 'body', method: 'POST', url: '/x' }) as unknown as (v: unknown) => boolean;
    expect(validate({ rank: 12 })).toBe(true);
    expect(validatorSources.compiled).toBe(before + 1);

    const other = join(dir, 'other.cjs');
    writeFileSync(other, (await routeValidatorsSource([{ kind: 'body', schema: Rank }])).source.replace(/^exports\.about = .*$/m, 'exports.about = "ajv 7";'));
    expect(loadRouteValidators(other).refused).toMatch(/other versions or options/);
    expect(loadRouteValidators(other).get('body', validatorKey('body', Rank))).toBeUndefined();
    const garbled = join(dir, 'garbled.cjs');
    writeFileSync(garbled, 'exports.about = ;');
    expect(loadRouteValidators(garbled).refused).toMatch(/unreadable/);
    expect(loadRouteValidators(join(dir, 'missing.cjs')).refused).toBe('not built');
  });
});

describe('compileSchemasSoon', () => {
  it('compiles every pending schema with nothing else waking the event loop', () => {
    // In a process of its own: here, the test runner's own traffic wakes the loop. Its turns used to be unref'd
    // immediates, which run only when something else wakes the loop: most schemas were left to a client's requests.
    const validation = new URL('../../dist/server/http/validation.js', import.meta.url).href;
    const script = `
      const v = await import(${JSON.stringify(validation)});
      for (let i = 0; i < 40; i++) v.validatorCompiler({ schema: { type: 'object', properties: { ['f' + i]: { type: 'integer' } } }, httpPart: 'body' });
      const before = v.pendingSchemaCount();
      v.compileSchemasSoon(0);
      setTimeout(() => console.log(JSON.stringify({ before, after: v.pendingSchemaCount() })), 500);
    `;
    const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' }));
    expect(out).toEqual({ before: 40, after: 0 });
  });
});
