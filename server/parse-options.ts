// The settings table put to use: options read from LOOPS_MOCK_* variables and flags, and --help's text.
import { ConfigError } from './flag-values.js';
import { DEFAULTS, FLAG_ROWS, type FlagRow, type ServerOptions, type SettingRow } from './config.js';
import { parseFlags, type FlagDefinition } from './parse-flags.js';

const FLAG_BY_NAME = new Map(FLAG_ROWS.map((row) => [row.flag, row]));
const FLAG_DEFINITIONS: Record<string, FlagDefinition> = Object.fromEntries(
  FLAG_ROWS.map((row) => [row.flag, { type: row.switch ? 'boolean' : 'string', multiple: row.repeatable }]),
);

/** Options from `LOOPS_MOCK_*` variables, then flags (flags win). Throws ConfigError with a one-line message. */
export function parseOptions(argv: string[], env: NodeJS.ProcessEnv = {}): ServerOptions {
  // A fresh copy: repeatable flags build on the default list and map.
  const options = structuredClone(DEFAULTS);
  const given = parseFlags(argv, FLAG_DEFINITIONS, { error: (message) => new ConfigError(message) }).flags;
  const byFlag = new Set(given.map((f) => f.name));
  for (const row of FLAG_ROWS) {
    // A flag that replaces its variable makes the variable moot: a bad LOOPS_MOCK_PORT does not block --port.
    if (byFlag.has(row.flag) && (!row.repeatable || row.flagsReplaceEnv)) continue;
    const value = env[row.env];
    if (value !== undefined && value !== '') row.set(options, value);
  }
  const replacedEnv = new Set<FlagRow>();
  for (const { name, value } of given) {
    const row = FLAG_BY_NAME.get(name)!;
    if (row.flagsReplaceEnv && !replacedEnv.has(row)) {
      (options as unknown as Record<string, unknown>)[row.option] = structuredClone(row.default);
      replacedEnv.add(row);
    }
    row.set(options, value);
  }
  return options;
}

/** A row's help with its default, as --help prints it. */
export function helpOf(row: SettingRow): string {
  return row.shownDefault === 'none' ? row.help : `${row.help} (default ${row.shownDefault})`;
}

export function usage(): string {
  const lines = FLAG_ROWS.map((row) => `  --${row.flag.padEnd(18)} ${helpOf(row)}\n  ${''.padEnd(20)} env ${row.env}`);
  return [
    'Usage: loops-mock [serve] [flags]',
    '       loops-mock record --help   (the recording proxy)',
    "       loops-mock ca --help       (proxy mode's local CA)",
    '       loops-mock export-model --help   (the tiny base model as a Hugging Face folder)',
    '',
    'Flags:',
    ...lines,
    '  --help              this text',
    '  --version           print the version',
  ].join('\n');
}
