import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CHECKS } from './checks.js';
import type { CaseReport } from './runner.js';

const caseName = (r: CaseReport) => `${r.scenario}/${r.task}`;

/** The terminal table: a row per case, a column per check, then every failure with its evidence. */
export function textReport(reports: CaseReport[]): string {
  const ids = CHECKS.map((c) => c.id);
  const width = Math.max(4, ...reports.map((r) => caseName(r).length));
  const cell = (v: string, w: number) => v.padEnd(w);
  const widths = ids.map((id) => Math.max(id.length, 4));
  const lines = [`${cell('case', width)}  ${ids.map((id, i) => cell(id, widths[i]!)).join(' ')}`];
  for (const r of reports) {
    lines.push(`${cell(caseName(r), width)}  ${r.results.map((x, i) => cell(x.result.verdict, widths[i]!)).join(' ')}`);
  }
  const failures = reports.flatMap((r) => r.results.filter((x) => x.result.verdict === 'FAIL').map((x) => ({ r, ...x })));
  if (failures.length) {
    lines.push('', 'Failures:');
    for (const f of failures) {
      lines.push(`- ${caseName(f.r)} ${f.check.id} (${f.check.level}): ${f.check.rule}`, `    ${f.result.reason ?? ''}`);
      for (const e of f.result.evidence ?? []) lines.push(`      ${e}`);
    }
  }
  const skips = reports.flatMap((r) => r.results.filter((x) => x.result.verdict === 'SKIP').map((x) => `${caseName(r)} ${x.check.id}: ${x.result.reason}`));
  const count = (v: string) => reports.reduce((n, r) => n + r.results.filter((x) => x.result.verdict === v).length, 0);
  lines.push(
    '',
    `${reports.length} case(s): ${count('PASS')} passed, ${count('FAIL')} failed, ${count('SKIP')} skipped (${skips.length ? 'SKIP reasons in the JSON report' : 'none'}).`,
  );
  lines.push('', 'Checks:', ...CHECKS.map((c) => `  ${c.id.padEnd(8)} ${c.level.padEnd(6)} ${c.rule}`));
  return lines.join('\n');
}

const xml = (s: string) => s.replace(/[<>&"']/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;', "'": '&apos;' })[c]!);

/** JUnit XML: a test suite per case, a test case per check; SHOULD failures are failures too, marked by their type. */
export function junitReport(reports: CaseReport[]): string {
  const suites = reports.map((r) => {
    const failures = r.results.filter((x) => x.result.verdict === 'FAIL').length;
    const skipped = r.results.filter((x) => x.result.verdict === 'SKIP').length;
    const cases = r.results.map(({ check, result }) => {
      const open = `    <testcase classname="${xml(caseName(r))}" name="${xml(`${check.id} ${check.rule}`)}">`;
      if (result.verdict === 'FAIL')
        return `${open}\n      <failure type="${check.level}" message="${xml(result.reason ?? '')}">${xml((result.evidence ?? []).join('\n'))}</failure>\n    </testcase>`;
      if (result.verdict === 'SKIP') return `${open}<skipped message="${xml(result.reason ?? '')}"/></testcase>`;
      return `${open}</testcase>`;
    });
    return `  <testsuite name="${xml(caseName(r))}" tests="${r.results.length}" failures="${failures}" skipped="${skipped}" time="${(r.durationMs / 1000).toFixed(3)}">\n${cases.join('\n')}\n  </testsuite>`;
  });
  return `<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="loops-conformance">\n${suites.join('\n')}\n</testsuites>\n`;
}

export function jsonReport(reports: CaseReport[]): unknown {
  return {
    checks: CHECKS.map(({ id, level, rule }) => ({ id, level, rule })),
    cases: reports.map((r) => ({
      scenario: r.scenario,
      task: r.task,
      expect: r.expect,
      duration_ms: r.durationMs,
      exit_code: r.exitCode,
      timed_out: r.timedOut,
      results: r.results.map(({ check, result }) => ({
        check: check.id,
        level: check.level,
        verdict: result.verdict,
        reason: result.reason ?? null,
        evidence: result.evidence ?? [],
      })),
    })),
  };
}

/** Writes report.xml (JUnit) and report.json into `dir`. */
export function writeReports(dir: string, reports: CaseReport[]): { junit: string; json: string } {
  mkdirSync(dir, { recursive: true });
  const junit = join(dir, 'report.xml');
  const json = join(dir, 'report.json');
  writeFileSync(junit, junitReport(reports));
  writeFileSync(json, `${JSON.stringify(jsonReport(reports), null, 2)}\n`);
  return { junit, json };
}
