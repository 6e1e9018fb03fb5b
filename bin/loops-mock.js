#!/bin/sh
":" //; exec env MALLOC_MMAP_THRESHOLD_=1048576 node --expose-gc "$0" "$@"
// The loops-mock command. Read by sh, the line above starts this file again under node with two runtime
// settings, in place of the shell (the same process id: signals and kill -9 reach the server); read by node,
// it is a string and a comment. The settings give memory back to the system after a burst (docs/engine.md,
// "Long sequences and memory"): buffers from 1 MB up get pages of their own (glibc otherwise keeps freed
// multi-MB buffers in its heap for good), and gc lets the server collect right after runs stop and long
// requests end (models/collect-soon.ts). Plain POSIX sh and env, so busybox (Alpine) runs it too.
//
// Started as `node bin/loops-mock.js` (the docs' examples, npm's shims where there is no sh), the line above
// never ran, and glibc reads its variable only when a process starts: the server then runs in a child with
// the settings, this process passing signals on and exiting as the child does (below).
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const MMAP_THRESHOLD = '1048576';
/** Set in the child: it runs the server whatever its settings turned out to be (never a chain of children). */
const LAUNCHED = 'LOOPS_MOCK_LAUNCHED';

/**
 * Whether these arguments start a server (`serve`, the default command) that warms an engine: not another command,
 * help or the version, nor `--warm none` (a first engine may come minutes later; its own worker starts then).
 */
function startsServer(args, env) {
  if (args.some((a) => a === '--help' || a === '-h' || a === '--version')) return false;
  const warm = args.findLastIndex((a) => a === '--warm' || a.startsWith('--warm='));
  const warmed = warm < 0 ? env.LOOPS_MOCK_WARM : args[warm].startsWith('--warm=') ? args[warm].slice(7) : args[warm + 1];
  if (warmed === 'none') return false;
  return args[0] === undefined || args[0] === 'serve' || args[0].startsWith('-');
}

const settled = typeof globalThis.gc === 'function' && process.env.MALLOC_MMAP_THRESHOLD_ !== undefined;
if (settled || process.env[LAUNCHED] === '1') {
  if (process.env[LAUNCHED] === '1' && process.send) {
    // A launcher killed outright (SIGKILL) closes this channel: the server stops rather than outlive it.
    process.channel?.unref();
    process.on('disconnect', () => process.kill(process.pid, 'SIGTERM'));
  }
  // Before the server's modules load: on Node 22.1+ a later start reads their compiled code (server/cache-dir.ts).
  const { enableNodeCompileCache } = await import('../dist/server/cache-dir.js');
  enableNodeCompileCache(process.argv.slice(2));
  // A server's engine worker starts now, its own start overlapping the server's load (models/engine-prestart.ts).
  if (startsServer(process.argv.slice(2), process.env)) (await import('../dist/bundle/engine-prestart.js')).prestartEngineWorker();
  // The server as one file (scripts/build-if-stale.mjs): its modules one by one load about a quarter of a second slower.
  await import('../dist/bundle/cli.js');
} else {
  const child = spawn(process.execPath, ['--expose-gc', ...process.execArgv, fileURLToPath(import.meta.url), ...process.argv.slice(2)], {
    // Its own process group: a terminal's Ctrl-C reaches this process only, which passes it on once
    // (twice would be the server's "again, exiting without waiting").
    detached: true,
    stdio: ['inherit', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, MALLOC_MMAP_THRESHOLD_: process.env.MALLOC_MMAP_THRESHOLD_ ?? MMAP_THRESHOLD, [LAUNCHED]: '1' },
  });
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal));
  // --exit-with-parent watches the server's parent, which is this process: this one watches its own for it.
  const exitWithParent =
    process.argv.slice(2).some((a) => /^--exit-with-parent(=(1|true|yes|on))?$/i.test(a)) ||
    /^(1|true|yes|on)$/i.test(process.env.LOOPS_MOCK_EXIT_WITH_PARENT ?? '');
  if (exitWithParent) {
    const parent = process.ppid;
    const watch = setInterval(() => {
      if (process.ppid !== parent) child.kill('SIGTERM');
    }, 200);
    watch.unref();
  }
  child.on('exit', (code, signal) => {
    if (signal) {
      // Ended by a signal: end the same way, so that whoever started this sees what happened.
      process.removeAllListeners(signal);
      process.kill(process.pid, signal);
    } else {
      process.exit(code ?? 1);
    }
  });
}
