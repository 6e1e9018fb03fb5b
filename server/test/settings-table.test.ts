import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SettingsPatch } from '../admin/schemas.js';
import { ConfigError, DEFAULTS, FLAG_ROWS, SETTINGS_TABLE, type SettingRow } from '../config.js';
import { parseOptions } from '../parse-options.js';
import { LoopsError } from '../core/errors.js';
import { applySettings, DEFAULT_SETTINGS, LIVE_SETTING_ROWS, settingsToWire } from '../core/settings.js';
import { validatorCompiler } from '../http/validation.js';
import { REPO_ROOT } from './helpers.js';

interface ReadmeFlagRow {
  flags: string[];
  env: string;
  default: string;
}

/** The rows of README's "## Flags" table: `| \`--flag N\` | \`LOOPS_MOCK_X\` (note) | default | meaning |`. */
function readmeFlagRows(readme: string): ReadmeFlagRow[] {
  const section = /^## Flags\n([\s\S]*?)(?=^## )/m.exec(readme)?.[1];
  if (!section) throw new Error('README.md has no "## Flags" section');
  return section
    .split('\n')
    .filter((line) => line.startsWith('| `--'))
    .map((line) => {
      // A `\|` inside a cell (`--clock real\|virtual`) is not a column break.
      const [flagCell = '', envCell = '', defaultCell = ''] = line
        .split(/(?<!\\)\|/)
        .slice(1)
        .map((cell) => cell.trim());
      return {
        flags: [...flagCell.matchAll(/`--([a-z][a-z-]*)/g)].map((m) => m[1]!),
        env: /`(LOOPS_MOCK_[A-Z_]+)`/.exec(envCell)?.[1] ?? '',
        default: defaultCell,
      };
    });
}

/** What README and the table disagree on, one line each; empty when they agree. */
function readmeMismatches(table: readonly SettingRow[], readme: ReadmeFlagRow[]): string[] {
  const problems: string[] = [];
  const byFlag = new Map(table.filter((row) => row.flag).map((row) => [row.flag!, row]));
  const documented = new Set<string>();
  for (const line of readme) {
    // The one row without a variable is the commands' own --help/--version, not a setting.
    if (!line.env) {
      if (line.flags.join(' ') !== 'help version') problems.push(`README row --${line.flags.join(', --')} has no environment variable`);
      continue;
    }
    const [flag = ''] = line.flags;
    documented.add(flag);
    const row = byFlag.get(flag);
    if (!row) {
      problems.push(`README documents --${flag}, which the table does not have`);
      continue;
    }
    if (row.env !== line.env) problems.push(`--${flag}: README says ${line.env}, the table ${row.env}`);
    if (row.shownDefault !== line.default) problems.push(`--${flag}: README's default is '${line.default}', the table's '${row.shownDefault}'`);
  }
  for (const flag of byFlag.keys()) if (!documented.has(flag)) problems.push(`--${flag} is in the table but has no README row`);
  return problems;
}

const readme = readmeFlagRows(readFileSync(join(REPO_ROOT, 'README.md'), 'utf8'));

describe("README's flag table", () => {
  it('has a row for every flag of the table, with the same variable and default, and no other', () => {
    expect(readme.length).toBeGreaterThan(20);
    expect(readmeMismatches(SETTINGS_TABLE, readme)).toEqual([]);
  });

  it('would catch a flag added to the table without a README row, or a default changed', () => {
    const extra: SettingRow = { ...FLAG_ROWS[0]!, option: 'newThing', flag: 'new-thing', env: 'LOOPS_MOCK_NEW_THING' };
    expect(readmeMismatches([...SETTINGS_TABLE, extra], readme)).toEqual(['--new-thing is in the table but has no README row']);
    const changed = SETTINGS_TABLE.map((row) => (row.flag === 'port' ? { ...row, shownDefault: '9999' } : row));
    expect(readmeMismatches(changed, readme)).toEqual(["--port: README's default is '8787', the table's '9999'"]);
  });
});

describe('the settings table', () => {
  const live = SETTINGS_TABLE.filter((row) => row.live);
  const startupOnly = SETTINGS_TABLE.filter((row) => !row.live);

  it('names each live setting in snake_case after its option, and each flag after its wire name', () => {
    expect(live.map((row) => row.wire)).toEqual([
      'cold_start_ms',
      'model_cold_start_ms',
      'deactivation_ms',
      'sampler_replicas',
      'weight_sync_delay_ms',
      'floor_wait_ms',
      'max_seq_len_limit',
      'max_tokens_limit',
      'max_sampled_tokens',
      'max_batch_tokens',
      'body_bytes_in_flight',
      'long_poll_ms',
      'operation_ttl_ms',
      'run_idle_timeout_ms',
      'sampler_idle_ms',
    ]);
    for (const row of live) {
      expect(row.wire).toBe(row.option.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`));
      if (row.flag) expect(row.flag).toBe(row.wire!.replace(/_/g, '-'));
    }
    expect(live.filter((row) => !row.flag).map((row) => row.wire)).toEqual(['max_tokens_limit', 'run_idle_timeout_ms', 'sampler_idle_ms']);
    expect(startupOnly.every((row) => row.flag && !row.wire)).toBe(true);
    expect(startupOnly.map((row) => row.flag).sort()).toEqual([
      'admin',
      'admin-token',
      'allowed-host',
      'api-key',
      'batch-runs',
      'body-limit',
      'body-timeout-ms',
      'ca-dir',
      'cache-dir',
      'clock',
      'data-dir',
      'data-dir-fresh',
      'device',
      'exit-with-parent',
      'fault-seed',
      'headers-timeout-ms',
      'host',
      'journal',
      'journal-detail',
      'journal-size',
      'log-format',
      'log-level',
      'port',
      'presign-ttl-s',
      'proxy',
      'proxy-passthrough',
      'public-url',
      'rebuild-records',
      'scenario',
      'tokenizer',
      'unembedding-rank',
      'warm',
      'write-env',
    ]);
    for (const row of FLAG_ROWS) expect(row.env).toBe(`LOOPS_MOCK_${row.flag.toUpperCase().replace(/-/g, '_')}`);
  });

  it('gives the live settings the same defaults as start-up options and as core settings', () => {
    for (const row of live) {
      expect(DEFAULT_SETTINGS[row.option as keyof typeof DEFAULT_SETTINGS], row.option).toEqual(row.default);
      if (row.flag) expect(DEFAULTS[row.option as keyof typeof DEFAULTS], row.option).toEqual(row.default);
    }
    expect(parseOptions([])).toEqual(DEFAULTS);
  });
});

describe('flags from the table', () => {
  it('check every whole-number flag against its range, by flag and by variable, with the message as before', () => {
    expect(() => parseOptions(['--port', '70000'])).toThrow("--port must be a whole number from 0 to 65535, got '70000'");
    expect(() => parseOptions(['--long-poll-ms', '30000'])).toThrow("--long-poll-ms must be a whole number from 1 to 29999, got '30000'");
    expect(() => parseOptions([], { LOOPS_MOCK_SAMPLER_REPLICAS: '65' })).toThrow("--sampler-replicas must be a whole number from 1 to 64, got '65'");
    // The flag stops at 10 minutes while the admin API allows a day (as before the table).
    expect(() => parseOptions(['--floor-wait-ms', '600001'])).toThrow("--floor-wait-ms must be a whole number from 0 to 600000, got '600001'");
    expect(() => parseOptions(['--weight-sync-delay-ms', '1,86400001'])).toThrow(
      "--weight-sync-delay-ms must be a whole number from 0 to 86400000, got '86400001'",
    );
    const optionOf = (argv: string[], env: Record<string, string>, key: string) => (parseOptions(argv, env) as unknown as Record<string, unknown>)[key];
    for (const row of LIVE_SETTING_ROWS.filter((r) => r.flag)) {
      const flag = row.wire.replace(/_/g, '-');
      const [min, max] = row.flagRange ?? row.range;
      expect(optionOf([`--${flag}`, String(max)], {}, row.key), flag).toEqual(row.shape === 'list' ? [max] : max);
      expect(optionOf([], { [`LOOPS_MOCK_${row.wire.toUpperCase()}`]: String(min) }, row.key), flag).toEqual(row.shape === 'list' ? [min] : min);
      expect(() => parseOptions([`--${flag}=${max + 1}`]), flag).toThrow(`--${flag} must be a whole number from ${min} to ${max}, got '${max + 1}'`);
    }
  });

  it('keep the messages and the switch, repeatable and env rules of the hand-written parser', () => {
    const refusal = (argv: string[]) => {
      try {
        parseOptions(argv);
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        return (err as Error).message;
      }
      throw new Error(`accepted ${argv.join(' ')}`);
    };
    expect(refusal(['--prot', '8787'])).toBe('unknown flag --prot');
    expect(refusal(['--data-dir'])).toBe('--data-dir needs a value');
    expect(refusal(['launch'])).toBe("unexpected argument 'launch'");
    expect(refusal(['--admin=maybe'])).toBe("--admin is a switch: give it alone, or as --admin=true / --admin=false, got 'maybe'");
    expect(refusal(['--port', 'x', '--port', '1'])).toBe("--port must be a whole number from 0 to 65535, got 'x'");
    // Strict parsing takes a value starting with '-' for a forgotten one; '=' gives it.
    expect(refusal(['--port', '-1'])).toMatch(/^--port needs a value/);
    expect(refusal(['--port=-1'])).toBe("--port must be a whole number from 0 to 65535, got '-1'");

    expect(parseOptions(['--admin']).admin).toBe(true);
    expect(parseOptions(['--admin=true']).admin).toBe(true);
    expect(parseOptions(['--admin=false'], { LOOPS_MOCK_ADMIN: '1' }).admin).toBe(false);
    expect(parseOptions(['--admin=false', '--admin']).admin).toBe(true);
    expect(parseOptions([], { LOOPS_MOCK_ADMIN: '1' }).admin).toBe(true);
    expect(parseOptions(['--port', '2'], { LOOPS_MOCK_PORT: '1', LOOPS_MOCK_HOST: '0.0.0.0' })).toMatchObject({ port: 2, host: '0.0.0.0' });
    // Keys from flags replace those of the environment; tokenizers from flags add to them.
    expect(parseOptions(['--api-key', 'a', '--api-key=b,c'], { LOOPS_MOCK_API_KEY: 'env' }).apiKeys.map((k) => k.key)).toEqual(['a', 'b', 'c']);
    expect(parseOptions(['--tokenizer', 'm1=p1', '--tokenizer=m2=p2'], { LOOPS_MOCK_TOKENIZER: 'm0=p0' }).tokenizers).toEqual({ m0: 'p0', m1: 'p1', m2: 'p2' });
    expect(parseOptions(['--weight-sync-delay-ms', '5, 10'])).toMatchObject({ weightSyncDelayMs: [5, 10] });
    // Each parse starts from fresh lists.
    expect(DEFAULTS).toMatchObject({ apiKeys: [], tokenizers: {} });
  });
});

describe('the admin settings schema and applySettings', () => {
  const validate = validatorCompiler({ schema: SettingsPatch, httpPart: 'body', method: 'PATCH', url: '/_mock/settings' }) as unknown as (
    value: unknown,
  ) => boolean;
  const wires = LIVE_SETTING_ROWS.map((row) => row.wire);
  const refusal = (wire: Record<string, unknown>) => {
    try {
      applySettings(structuredClone(DEFAULT_SETTINGS), wire, 'settings');
    } catch (err) {
      expect(err).toBeInstanceOf(LoopsError);
      return (err as Error).message;
    }
    throw new Error(`accepted ${JSON.stringify(wire)}`);
  };

  it('accept exactly the live settings by wire name', () => {
    expect(Object.keys((SettingsPatch as unknown as { properties: object }).properties)).toEqual(wires);
    expect(Object.keys(settingsToWire(DEFAULT_SETTINGS))).toEqual(wires);
    const all = settingsToWire(DEFAULT_SETTINGS);
    expect(validate(all)).toBe(true);
    const target = structuredClone(DEFAULT_SETTINGS);
    applySettings(target, all);
    expect(target).toEqual(DEFAULT_SETTINGS);
    expect(validate({ colour: 1 })).toBe(false);
    expect(refusal({ colour: 1 })).toBe(`settings.colour is not a setting. Settings: ${wires.join(', ')}.`);
  });

  it('refuse values out of each range, with the messages as before', () => {
    expect(refusal({ long_poll_ms: 30_000 })).toBe('settings.long_poll_ms must be a whole number from 1 to 29999, got 30000.');
    expect(refusal({ floor_wait_ms: 86_400_001 })).toBe('settings.floor_wait_ms must be a whole number from 0 to 86400000, got 86400001.');
    expect(refusal({ weight_sync_delay_ms: [] })).toBe('settings.weight_sync_delay_ms needs at least one delay.');
    expect(refusal({ weight_sync_delay_ms: [1, -1] })).toBe('settings.weight_sync_delay_ms[1] must be a whole number from 0 to 86400000, got -1.');
    expect(refusal({ cold_start_ms: null })).toBe('settings.cold_start_ms must be a whole number from 0 to 86400000, got null.');
    expect(refusal({ deactivation_ms: '3' })).toBe('settings.deactivation_ms must be a whole number from 0 to 86400000, got "3".');
    for (const row of LIVE_SETTING_ROWS) {
      const [min, max] = row.range;
      for (const bad of [min - 1, max + 1, min + 0.5]) {
        expect(validate({ [row.wire]: bad }), `${row.wire} ${bad}`).toBe(false);
        expect(refusal({ [row.wire]: bad })).toBe(
          `settings.${row.wire}${row.shape === 'list' ? '[0]' : ''} must be a whole number from ${min} to ${max}, got ${bad}.`,
        );
      }
      for (const good of [min, max]) {
        expect(validate({ [row.wire]: good }), `${row.wire} ${good}`).toBe(true);
        const target = structuredClone(DEFAULT_SETTINGS);
        applySettings(target, { [row.wire]: good });
        expect(target[row.key]).toEqual(row.shape === 'list' ? [good] : good);
      }
      // null turns off only the settings that may be off.
      expect(validate({ [row.wire]: null }), `${row.wire} null`).toBe(row.shape === 'nullable');
    }
  });
});

/** Runs a CLI from source through tsx, as `npm start` and the other CLI tests do. */
function runCli(script: string, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--import', 'tsx', join(REPO_ROOT, script), ...args], { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => {
      stdout += d;
    });
    child.stderr.on('data', (d) => {
      stderr += d;
    });
    child.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('--help', () => {
  it('prints the usage of every subcommand of both commands and exits 0', async () => {
    const cases: [string, string[], string][] = [
      ['server/cli.ts', ['--help'], 'Usage: loops-mock [serve]'],
      ['server/cli.ts', ['serve', '--help'], 'LOOPS_MOCK_COLD_START_MS'],
      ['server/cli.ts', ['serve', '--port', '1', '-h'], 'Usage: loops-mock [serve]'],
      ['server/cli.ts', ['record', '--help'], 'Usage: loops-mock record'],
      ['conformance/cli.ts', ['--help'], 'loops-conformance replay'],
      ['conformance/cli.ts', ['run', '--help'], 'loops-conformance run --client'],
      ['conformance/cli.ts', ['list', '--help'], 'loops-conformance list'],
      ['conformance/cli.ts', ['replay', '--help'], 'loops-conformance replay --server'],
    ];
    const results = await Promise.all(cases.map(([script, args]) => runCli(script, args)));
    results.forEach((result, i) => {
      const [script, args, fragment] = cases[i]!;
      const what = `${script} ${args.join(' ')}`;
      expect([result.code, result.stderr], what).toEqual([0, '']);
      expect(result.stdout, what).toContain(fragment);
    });
    // Every flag of the table is in the serve help, with its variable.
    for (const row of FLAG_ROWS) expect(results[1]!.stdout).toContain(`--${row.flag}`);
  }, 120_000);

  it('leaves the other refusals of the subcommands as they were', async () => {
    const cases: [string, string[], string][] = [
      ['server/cli.ts', ['record', '--bogus', 'x'], 'unknown flag --bogus for record'],
      ['server/cli.ts', ['record', '--out='], '--out needs a value'],
      ['conformance/cli.ts', ['run', '--client'], '--client needs a value'],
      ['conformance/cli.ts', ['run', '--clinet', 'x'], 'unknown flag --clinet'],
      ['conformance/cli.ts', ['replay', '--server', 'http://x', '--key'], '--key needs a value'],
    ];
    const results = await Promise.all(cases.map(([script, args]) => runCli(script, args)));
    results.forEach((result, i) => {
      const [script, args, fragment] = cases[i]!;
      expect(result.code, `${script} ${args.join(' ')}`).toBe(2);
      expect(result.stderr.split('\n')[0], `${script} ${args.join(' ')}`).toContain(fragment);
    });
  }, 120_000);
});
