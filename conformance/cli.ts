#!/usr/bin/env node
import { asksForHelp, parseFlags, type FlagDefinition } from '../server/parse-flags.js';
import { defaultCaDir } from '../server/proxy/ca.js';
import { CHECKS } from './checks.js';
import { textReport, writeReports } from './report.js';
import { defaultFixturesDir, readFixtures, replayFixture } from './replay.js';
import { listCases, mustFailed, runSuite } from './runner.js';
import { TASKS } from './tasks.js';

const RUN_USAGE = `  loops-conformance run --client "<command>" [--scenario NAME ...] [--task NAME ...] [--report-dir DIR] [--timeout S] [--proxy [--ca-dir DIR]]
      Runs each case (a task under a scenario) against a fresh loops-mock and checks the client.
      The client command gets LOOPS_BASE_URL, BASETEN_API_KEY, BASETEN_MANAGEMENT_API_URL_OVERRIDE,
      HF_ENDPOINT, LOOPS_CONFORMANCE_TASK, LOOPS_CONFORMANCE_INPUT and LOOPS_CONFORMANCE_OUTPUT
      (docs/conformance.md). With --proxy the server runs in proxy mode and the client gets
      BASETEN_API_KEY, HTTPS_PROXY, SSL_CERT_FILE, REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS instead
      of the URLs: an unmodified client keeps Baseten's. Exit status 1 when any MUST check fails.`;
const REPLAY_USAGE = `  loops-conformance replay --server URL --key KEY [--fixtures DIR] [--flow NAME ...]
      Replays the sdk-fixtures flows against any Loops endpoint (loops-mock, or the real service)
      and reports every difference in status, field names and types. Exit status 1 on any difference.`;
const LIST_USAGE = `  loops-conformance list
      The cases, tasks and checks.`;
const USAGE = ['Usage:', RUN_USAGE, REPLAY_USAGE, LIST_USAGE].join('\n');

class UsageError extends Error {}

const RUN_FLAGS: Record<string, FlagDefinition> = {
  client: { type: 'string' },
  scenario: { type: 'string', multiple: true },
  task: { type: 'string', multiple: true },
  'report-dir': { type: 'string' },
  timeout: { type: 'string' },
  proxy: { type: 'boolean' },
  'ca-dir': { type: 'string' },
};
const REPLAY_FLAGS: Record<string, FlagDefinition> = {
  server: { type: 'string' },
  key: { type: 'string' },
  fixtures: { type: 'string' },
  flow: { type: 'string', multiple: true },
};

/** The flags of one subcommand, in the order given; refusals are usage errors (exit status 2). */
const flagsOf = (argv: string[], definitions: Record<string, FlagDefinition>) =>
  parseFlags(argv, definitions, { error: (message) => new UsageError(message) }).flags;

function parseRunArgs(argv: string[]) {
  const opts = {
    client: '',
    scenarios: [] as string[],
    tasks: [] as string[],
    reportDir: undefined as string | undefined,
    timeoutS: 120,
    proxy: false,
    caDir: undefined as string | undefined,
  };
  for (const { name, value } of flagsOf(argv, RUN_FLAGS)) {
    switch (name) {
      case 'client':
        opts.client = value;
        break;
      case 'scenario':
        opts.scenarios.push(...value.split(','));
        break;
      case 'task':
        opts.tasks.push(...value.split(','));
        break;
      case 'report-dir':
        opts.reportDir = value;
        break;
      case 'proxy':
        if (value !== 'true' && value !== 'false')
          throw new UsageError(`--proxy is a switch: give it alone, or as --proxy=true / --proxy=false, got '${value}'`);
        opts.proxy = value === 'true';
        break;
      case 'ca-dir':
        opts.caDir = value;
        break;
      case 'timeout': {
        const n = Number(value);
        if (!(n > 0 && n <= 3600)) throw new UsageError(`--timeout must be seconds from 1 to 3600, got '${value}'`);
        opts.timeoutS = n;
        break;
      }
    }
  }
  if (!opts.client) throw new UsageError('--client "<command>" is required: the command that runs your driver');
  if (opts.caDir !== undefined && !opts.proxy) throw new UsageError('--ca-dir goes with --proxy');
  return opts;
}

/** Each subcommand's own usage, printed for `loops-conformance <command> --help`. */
const SUBCOMMAND_USAGE: Record<string, string> = { run: RUN_USAGE, replay: REPLAY_USAGE, list: LIST_USAGE };

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (!command || command === '--help' || command === '-h') {
    process.stdout.write(`${USAGE}\n`);
    return command ? 0 : 2;
  }
  const subcommandUsage = Object.hasOwn(SUBCOMMAND_USAGE, command) ? SUBCOMMAND_USAGE[command] : undefined;
  if (subcommandUsage && asksForHelp(rest)) {
    process.stdout.write(`Usage:\n${subcommandUsage}\n`);
    return 0;
  }
  if (command === 'list') {
    flagsOf(rest, {}); // list takes no flags: refuse them rather than ignore them
    const lines = [
      'Cases (scenario/task: expected outcome):',
      ...listCases().map((c) => `  ${c.scenario}/${c.task}: ${c.expect}`),
      '',
      'Tasks:',
      ...Object.entries(TASKS).map(([t, d]) => `  ${t}: ${d}`),
      '',
      'Checks:',
      ...CHECKS.map((c) => `  ${c.id.padEnd(8)} ${c.level.padEnd(6)} ${c.rule}`),
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
    return 0;
  }
  if (command === 'replay') return replay(rest);
  if (command !== 'run') throw new UsageError(`unknown command '${command}'`);
  const opts = parseRunArgs(rest);
  let cases: ReturnType<typeof listCases>;
  try {
    cases = listCases(opts.scenarios, opts.tasks);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  if (!cases.length) throw new UsageError('no case matches the given --scenario and --task');
  const proxy = opts.proxy ? { caDir: opts.caDir ?? defaultCaDir() } : undefined;
  const reports = await runSuite(cases, { client: opts.client, timeoutS: opts.timeoutS, proxy }, (r) => {
    const failed = r.results.filter((x) => x.result.verdict === 'FAIL').map((x) => x.check.id);
    process.stderr.write(`${r.scenario}/${r.task}: ${failed.length ? `FAIL ${failed.join(' ')}` : 'ok'} (${(r.durationMs / 1000).toFixed(1)} s)\n`);
  });
  process.stdout.write(`${textReport(reports)}\n`);
  if (opts.reportDir) {
    const written = writeReports(opts.reportDir, reports);
    process.stdout.write(`\nReports: ${written.junit}, ${written.json}\n`);
  }
  return mustFailed(reports) ? 1 : 0;
}

async function replay(argv: string[]): Promise<number> {
  const opts = { server: '', key: '', fixtures: undefined as string | undefined, flows: [] as string[] };
  for (const { name, value } of flagsOf(argv, REPLAY_FLAGS)) {
    if (name === 'server') opts.server = value;
    else if (name === 'key') opts.key = value;
    else if (name === 'fixtures') opts.fixtures = value;
    else opts.flows.push(...value.split(','));
  }
  if (!/^https?:\/\//.test(opts.server)) throw new UsageError('--server URL is required: the control plane URL of the endpoint to replay against');
  if (!opts.key) throw new UsageError('--key KEY is required: an API key of that endpoint');
  let fixtures: ReturnType<typeof readFixtures>;
  try {
    fixtures = readFixtures(opts.fixtures ?? defaultFixturesDir());
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const unknown = opts.flows.filter((f) => !fixtures.some((x) => x.name === f));
  if (unknown.length) throw new UsageError(`unknown flow ${unknown.join(', ')}; known: ${fixtures.map((f) => f.name).join(', ')}`);
  let differences = 0;
  for (const fixture of fixtures.filter((f) => !opts.flows.length || opts.flows.includes(f.name))) {
    const result = await replayFixture(fixture, { server: opts.server, key: opts.key });
    differences += result.differences.length;
    process.stdout.write(`${result.differences.length ? 'DIFF' : 'OK  '} ${fixture.name} (${result.exchanges} exchanges)\n`);
    for (const d of result.differences) process.stdout.write(`     ${d}\n`);
  }
  process.stdout.write(`${differences} difference(s)\n`);
  return differences ? 1 : 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof UsageError) {
      process.stderr.write(`loops-conformance: ${err.message}\n${USAGE}\n`);
      process.exit(2);
    }
    process.stderr.write(`loops-conformance: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
