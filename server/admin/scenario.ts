import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Static } from 'typebox';
import type * as Yaml from 'yaml';
import type { LoopsCore } from '../core/core.js';
import { invalid, LoopsError, notFound } from '../core/errors.js';
import { Faults, type FaultRuleInput } from '../core/faults.js';
import { Progress, type ProgressRuleInput } from '../core/progress.js';
import { applySettings, DEFAULT_SETTINGS } from '../core/settings.js';
import { describeValidationErrors, validatorCompiler } from '../http/validation.js';
import { Scenario } from './schemas.js';

const require = createRequire(import.meta.url);
// yaml takes ~25 ms to load: a start without --scenario does not wait for it.
let yamlModule: typeof Yaml | undefined;
const yaml = (): typeof Yaml => (yamlModule ??= require('yaml') as typeof Yaml);

export type ScenarioSpec = Static<typeof Scenario>;

/** conformance/scenarios of this package, from the source tree or from dist/. */
export function shippedScenarioDir(): string | undefined {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    const candidate = join(dir, 'conformance', 'scenarios');
    if (existsSync(candidate)) return candidate;
    dir = dirname(dir);
  }
  return undefined;
}

/** Names of the scenarios shipped in conformance/scenarios/. */
export function shippedScenarioNames(): string[] {
  const dir = shippedScenarioDir();
  if (!dir) return [];
  return readdirSync(dir)
    .filter((f) => /\.(ya?ml|json)$/.test(f))
    .map((f) => f.replace(/\.(ya?ml|json)$/, ''))
    .sort();
}

/** A scenario file's text: the name of a shipped scenario, or (from the command line only) a path to a file. */
export function readScenarioSource(nameOrPath: string, allowFiles = true): { text: string; source: string } {
  if (allowFiles && existsSync(nameOrPath) && statSync(nameOrPath).isFile()) return { text: readFileSync(nameOrPath, 'utf8'), source: resolve(nameOrPath) };
  if (!/^[A-Za-z0-9._-]+$/.test(nameOrPath))
    throw notFound(
      `No scenario file '${nameOrPath}'${allowFiles ? '' : " (over HTTP only shipped scenario names are accepted; post a file's content as {text})"}.`,
      { field: 'scenario' },
    );
  const dir = shippedScenarioDir();
  for (const ext of ['yaml', 'yml', 'json']) {
    const file = dir && join(dir, `${nameOrPath}.${ext}`);
    if (file && existsSync(file)) return { text: readFileSync(file, 'utf8'), source: file };
  }
  throw notFound(`No scenario file '${nameOrPath}' and no shipped scenario of that name. Shipped: ${shippedScenarioNames().join(', ') || 'none found'}.`, {
    field: 'scenario',
    shipped: shippedScenarioNames(),
  });
}

const validate = validatorCompiler({ schema: Scenario, httpPart: 'body', method: 'POST', url: '/_mock/scenario' }) as unknown as {
  (value: unknown): boolean;
  errors?: Parameters<typeof describeValidationErrors>[0] | null;
};

/**
 * Parses a scenario written in YAML or JSON (JSON is YAML too) and checks it
 * against the schema. Every error names the field and the line it is on.
 */
export function parseScenario(text: string, source = 'scenario'): ScenarioSpec {
  const { LineCounter, parseDocument } = yaml();
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, prettyErrors: false, uniqueKeys: true });
  const syntax = doc.errors[0];
  if (syntax) {
    const at = lines.linePos(syntax.pos[0]);
    throw invalid(`${source}:${at.line}: ${syntax.message.split('\n')[0]}`, { field: 'scenario', line: at.line, column: at.col });
  }
  let value: unknown;
  try {
    // An alias bomb (aliases of aliases) is refused by the parser's alias budget, not expanded.
    value = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    throw invalid(`${source}: ${(err as Error).message} (YAML aliases are limited: write the values out).`, { field: 'scenario' });
  }
  if (!validate(value)) {
    const errors = validate.errors!;
    const problem = describeValidationErrors(errors, 'scenario');
    const first = errors.find((e) => e.keyword !== 'anyOf' && e.keyword !== 'oneOf') ?? errors[0]!;
    const path = first.instancePath
      .split('/')
      .filter(Boolean)
      .map((s) => (/^\d+$/.test(s) ? Number(s) : s));
    if (first.keyword === 'additionalProperties') path.push(String(first.params.additionalProperty));
    const line = lineOf(doc, lines, path);
    throw invalid(`${source}:${line}: ${problem.message}`, { field: problem.field, line });
  }
  const spec = value as ScenarioSpec;
  checkRules(spec, (path) => lineOf(doc, lines, path), source);
  return spec;
}

/** The line of the deepest node of `path` that exists (a missing field points at its parent). */
function lineOf(doc: Yaml.Document, lines: Yaml.LineCounter, path: (string | number)[]): number {
  const { isMap, isScalar } = yaml();
  for (let n = path.length; n >= 0; n--) {
    const parent = n > 0 ? doc.getIn(path.slice(0, n - 1), true) : undefined;
    // For a map key, point at the key itself: that is where the mistake is written.
    if (n > 0 && isMap(parent)) {
      const pair = parent.items.find((p) => isScalar(p.key) && p.key.value === path[n - 1]);
      const range = (pair?.key as { range?: [number, number, number] } | undefined)?.range;
      if (range) return lines.linePos(range[0]).line;
    }
    const node = n > 0 ? doc.getIn(path.slice(0, n), true) : doc.contents;
    const range = (node as { range?: [number, number, number] } | null | undefined)?.range;
    if (range) return lines.linePos(range[0]).line;
  }
  return 1;
}

/** Runs the rules' own checks (combinations the schema cannot express) on scratch copies, naming the line. */
function checkRules(spec: ScenarioSpec, lineOf: (path: (string | number)[]) => number, source: string): void {
  const at = (path: (string | number)[], fn: () => void) => {
    try {
      fn();
    } catch (err) {
      if (!(err instanceof LoopsError)) throw err;
      const inner = String(err.details.field ?? '');
      const prefix = path
        .map((p) => (typeof p === 'number' ? `[${p}]` : `.${p}`))
        .join('')
        .slice(1);
      const line = lineOf([...path, ...inner.split('.').filter(Boolean)]);
      throw invalid(`${source}:${line}: ${prefix}: ${err.message}`, { field: `${prefix}${inner ? `.${inner}` : ''}`, line });
    }
  };
  at(['settings'], () => applySettings(structuredClone(DEFAULT_SETTINGS), spec.settings ?? {}, 'settings'));
  const faults = new Faults();
  spec.faults?.forEach((rule, i) => {
    at(['faults', i], () => faults.add(rule as FaultRuleInput));
  });
  const progress = new Progress({ now: () => 0, setTimer: () => ({ cancel() {} }) });
  spec.progress?.forEach((rule, i) => {
    at(['progress', i], () => progress.add(rule as ProgressRuleInput));
  });
}

/**
 * Makes a checked scenario the server's behaviour: settings back to those of
 * start-up with the scenario's on top, and its fault and progress rules in
 * place of the current ones. Records (runs, checkpoints) are left alone.
 */
export function applyScenario(core: LoopsCore, spec: ScenarioSpec): { name: string | null; faults: number; progress: number } {
  const settings = structuredClone(core.startupSettings);
  applySettings(settings, spec.settings ?? {}, 'settings');
  Object.assign(core.settings, settings);
  core.faults.clear();
  core.progress.clear();
  if (spec.seed !== undefined) core.faults.seed = spec.seed;
  for (const rule of spec.faults ?? []) core.faults.add(rule as FaultRuleInput);
  for (const rule of spec.progress ?? []) core.progress.add(rule as ProgressRuleInput);
  core.history.scenario = { name: spec.name ?? null, applied_at: core.clock.now() };
  return { name: spec.name ?? null, faults: spec.faults?.length ?? 0, progress: spec.progress?.length ?? 0 };
}
