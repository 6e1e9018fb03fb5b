/**
 * Run by the package's build (scripts/build-if-stale.mjs): builds the app with every front door, collects the
 * schemas its routes hand to the validator compiler, and writes them compiled, as plain functions, to the file
 * the server reads at start-up (server/http/route-validators.ts says why).
 */
import { renameSync, writeFileSync } from 'node:fs';
import { Ajv, _ } from 'ajv';
import formats from 'ajv-formats';
import { buildApp } from './app.js';
import { DEFAULTS } from './config.js';
import { LoopsCore } from './core/core.js';
import { directUrls } from './http/public-urls.js';
import { AHEAD_CODE, ajvOptions, routeValidatorsFile, validatorKey, validatorsAbout, type CheckKind } from './http/route-validators.js';
import { Scenario } from './admin/schemas.js';
import { collectSchemas, schemasSeen } from './http/validation.js';

/** Where the built code finds ajv-formats' formats: what AHEAD_CODE says, which the file's `about` records. */
const FORMATS = _`require("ajv-formats/dist/formats").fullFormats`;
if (FORMATS.toString() !== AHEAD_CODE.formats) throw new Error('build-route-validators: FORMATS and AHEAD_CODE.formats differ');

/** The source of one CommonJS file exporting each schema's validator under its key, by kind, and the `about` line. */
export async function routeValidatorsSource(schemas: readonly { kind: CheckKind; schema: object }[]): Promise<{ source: string; count: number }> {
  const { default: standalone } = (await import('ajv/dist/standalone/index.js')) as unknown as {
    default: (ajv: Ajv, refs: Record<string, string>) => string;
  };
  const parts: string[] = [];
  let count = 0;
  for (const kind of ['body', 'text'] as const) {
    const options = ajvOptions(kind);
    const ajv = new Ajv({ ...options, code: { source: true, optimize: AHEAD_CODE.optimize, formats: FORMATS } });
    (formats as unknown as { default: (a: Ajv) => void }).default(ajv);
    // Each schema added under its key (its name in the file): standalone code exports schemas by id.
    const refs: Record<string, string> = {};
    for (const { schema } of schemas.filter((s) => s.kind === kind)) {
      const key = validatorKey(kind, schema);
      if (refs[key]) continue;
      ajv.addSchema(schema, key);
      refs[key] = key;
    }
    count += Object.keys(refs).length;
    // Each kind's code in a scope of its own: the two ajv instances name their functions alike.
    parts.push(`exports.${kind} = (function () {\nconst exports = {};\n${standalone(ajv, refs)}\nreturn exports;\n})();`);
  }
  return { source: `"use strict";\nexports.about = ${JSON.stringify(validatorsAbout())};\n${parts.join('\n')}\n`, count };
}

/** Builds the app (no port opened), and writes its routes' validators where the server reads them. */
export async function writeRouteValidators(file = routeValidatorsFile()): Promise<{ file: string; count: number }> {
  if (!file) throw new Error('cannot find the loops-mock package folder to write its route validators in');
  collectSchemas();
  const core = new LoopsCore();
  try {
    const app = await buildApp(core, { ...DEFAULTS, admin: true, urls: directUrls(() => 'http://127.0.0.1') });
    await app.ready();
    await app.close();
  } finally {
    core.close();
  }
  // The scenario schema is compiled as its module loads (admin/scenario.ts), before collecting began.
  const { source, count } = await routeValidatorsSource([...schemasSeen, { kind: 'body', schema: Scenario }]);
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, source);
  renameSync(tmp, file);
  return { file, count };
}
