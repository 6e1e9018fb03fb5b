import { parseArgs } from 'node:util';

/**
 * Command-line parsing shared by `loops-mock` and `loops-conformance`:
 * node:util's parseArgs in strict mode, with the few things it does not do
 * the way these commands always have, and their one-line messages.
 */

export interface FlagDefinition {
  /** boolean: a switch, `--flag` alone or `--flag=true|false` (the caller reads the text). */
  type: 'string' | 'boolean';
  /** May be given more than once (the caller combines the values in order). */
  multiple?: boolean;
}

/** One flag as given, in command-line order. A switch's value is 'true' alone, or the text after its '='. */
export interface GivenFlag {
  name: string;
  value: string;
}

export interface ParsedFlags {
  flags: GivenFlag[];
  positionals: string[];
}

export interface ParseFlagsHow {
  /** Turns a one-line message into the caller's error class (its CLI prints those and exits 2). */
  error: (message: string) => Error;
  allowPositionals?: boolean;
  /** Added to "unknown flag --x", e.g. ' for record'. */
  unknownFlagSuffix?: string;
}

/** `--help` or `-h` anywhere before a `--`: the command prints its usage whatever else is given. */
export function asksForHelp(argv: readonly string[]): boolean {
  const end = argv.indexOf('--');
  return (end < 0 ? argv : argv.slice(0, end)).some((arg) => arg === '--help' || arg === '-h');
}

/**
 * Parses `argv` against `definitions`. The flags come back one by one in the
 * order given, not as parseArgs' values object, so that a flag given twice is
 * checked twice and the last one wins, as before parseArgs.
 */
export function parseFlags(argv: readonly string[], definitions: Record<string, FlagDefinition>, how: ParseFlagsHow): ParsedFlags {
  const isSwitch = (name: string) => Object.hasOwn(definitions, name) && definitions[name]!.type === 'boolean';
  // parseArgs refuses `--switch=false`; take the value off before it looks, and put it back by position after.
  const switchValues = new Map<number, string>();
  const terminator = argv.indexOf('--');
  const args = argv.map((arg, i) => {
    const inline = terminator >= 0 && i > terminator ? null : /^--([^=]+)=(.*)$/s.exec(arg);
    if (!inline || !isSwitch(inline[1]!)) return arg;
    switchValues.set(i, inline[2]!);
    return `--${inline[1]}`;
  });
  const allowPositionals = how.allowPositionals ?? false;
  let tokens: ReturnType<typeof parseArgs>['tokens'];
  try {
    ({ tokens } = parseArgs({ args, options: definitions, strict: true, allowPositionals, tokens: true }));
  } catch (err) {
    throw how.error(explainRefusal(args, definitions, how) ?? (err as Error).message);
  }
  const flags: GivenFlag[] = [];
  const positionals: string[] = [];
  for (const token of tokens) {
    if (token.kind === 'option')
      flags.push({ name: token.name, value: isSwitch(token.name) ? (switchValues.get(token.index) ?? 'true') : (token.value ?? '') });
    else if (token.kind === 'positional') positionals.push(token.value);
    // A bare '--' with nothing after it passes parseArgs; a command without positionals never took it.
    else if (!allowPositionals) throw how.error(`unexpected argument '--'`);
  }
  return { flags, positionals };
}

/**
 * parseArgs' own messages name no fix and differ from the ones these
 * commands (and their tests) have always printed, so a refused command line
 * is read again leniently and its first problem said in our words.
 */
function explainRefusal(args: string[], definitions: Record<string, FlagDefinition>, how: ParseFlagsHow): string | undefined {
  const { tokens } = parseArgs({ args, options: definitions, strict: false, allowPositionals: true, tokens: true });
  for (const token of tokens) {
    if (token.kind === 'positional' || token.kind === 'option-terminator') {
      if (!how.allowPositionals) return `unexpected argument '${token.kind === 'positional' ? token.value : '--'}'`;
      continue;
    }
    const definition = Object.hasOwn(definitions, token.name) ? definitions[token.name]! : undefined;
    if (!definition) return `unknown flag ${token.rawName}${how.unknownFlagSuffix ?? ''}`;
    if (definition.type === 'boolean') {
      if (token.value !== undefined) return `${token.rawName} is a switch and takes no value`;
    } else if (token.value === undefined) {
      return `${token.rawName} needs a value`;
    } else if (!token.inlineValue && token.value.startsWith('-')) {
      // Strict parsing takes a value that starts with '-' for a forgotten one.
      return `${token.rawName} needs a value (write ${token.rawName}=VALUE for one that starts with '-')`;
    }
  }
  return undefined;
}
