#!/usr/bin/env node
import { ConfigError, parseOptions, usage } from './config.js';
import { startServer } from './index.js';
import { VERSION } from './version.js';

/** `loops-mock [serve] [flags]`: starts the server and prints the variables a Loops client needs. */
async function main(argv: string[]): Promise<void> {
  const args = argv[0] === 'serve' ? argv.slice(1) : argv;
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(`${usage()}\n`);
    return;
  }
  if (args.includes('--version')) {
    process.stdout.write(`${VERSION}\n`);
    return;
  }
  if (args[0] !== undefined && !args[0].startsWith('-')) throw new ConfigError(`unknown command '${args[0]}' (the only command is 'serve')`);
  const options = parseOptions(args, process.env);
  const server = await startServer(options);
  const lines = Object.entries(server.env).map(([k, v]) => `${k}=${v}`);
  const notes = [`# loops-mock ${VERSION} listening on ${server.url}${options.dataDir ? `, state in ${options.dataDir}` : ', state in memory'}`];
  if (options.admin) notes.push(`# admin API at ${server.url}/_mock/${options.adminToken ? ' (Authorization: Bearer <admin token>)' : ''}; clock ${options.clockMode}${options.scenario ? `; scenario ${options.scenario} applied` : ''}`);
  process.stdout.write(`${lines.join('\n')}\n${notes.join('\n')}\n`);

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) {
      process.stderr.write(`loops-mock: ${signal} again, exiting without waiting\n`);
      process.exit(1);
    }
    stopping = true;
    server.close().then(
      () => process.exit(0),
      (err: unknown) => { process.stderr.write(`loops-mock: error while shutting down: ${String(err)}\n`); process.exit(1); },
    );
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}

main(process.argv.slice(2)).catch((err: unknown) => {
  if (err instanceof ConfigError) {
    process.stderr.write(`loops-mock: ${err.message} (see loops-mock --help)\n`);
    process.exit(2);
  }
  const code = (err as { code?: string }).code;
  if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
    process.stderr.write(`loops-mock: cannot listen: ${(err as Error).message} (choose another --port or --host)\n`);
    process.exit(2);
  }
  process.stderr.write(`loops-mock: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
