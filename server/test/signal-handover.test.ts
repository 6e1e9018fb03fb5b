import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';

// The built module (npm test builds first): a child process of its own, since the signal is a process's.
const handover = new URL('../../dist/server/signal-handover.js', import.meta.url).href;

/**
 * A child that holds SIGTERM, says so, stays busy for 400 ms (the signal arrives meanwhile, unread), hands
 * over to a stop that says which signal it got, and exits 3 if none comes within 1.5 s.
 */
const child = `
import { holdSignals } from ${JSON.stringify(handover)};
const signals = holdSignals(['SIGTERM']);
process.stdout.write('busy\\n');
const end = Date.now() + 400;
while (Date.now() < end) {}
signals.handTo((signal) => { process.stdout.write('stopped by ' + signal + '\\n'); process.exit(0); });
const early = signals.early();
if (early) { process.stdout.write('stopped early by ' + early + '\\n'); process.exit(0); }
setTimeout(() => { process.stdout.write('never stopped\\n'); process.exit(3); }, 1500);
`;

describe("the command line's signals while the server starts (server/signal-handover.ts)", () => {
  it('stops a server signalled while its thread was busy at the hand-over: the signal reaches the new handler', async () => {
    const proc = spawn(process.execPath, ['--input-type=module', '-e', child], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    let sent = false;
    proc.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('busy') && !sent) {
        sent = true;
        setTimeout(() => proc.kill('SIGTERM'), 100);
      }
    });
    const code = await new Promise<number | string | null>((resolve) => proc.on('exit', (c, signal) => resolve(c ?? signal)));
    expect(out).toBe('busy\nstopped by SIGTERM\n');
    expect(code).toBe(0);
  });

  it('keeps a signal that came and was read before the hand-over for the caller', async () => {
    const proc = spawn(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `import { holdSignals } from ${JSON.stringify(handover)};
const signals = holdSignals(['SIGTERM']);
process.kill(process.pid, 'SIGTERM');
setTimeout(() => { signals.handTo(() => process.exit(4)); process.stdout.write(String(signals.early())); process.exit(0); }, 200);`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    proc.stdout.on('data', (d: Buffer) => {
      out += d.toString();
    });
    const code = await new Promise<number | string | null>((resolve) => proc.on('exit', (c, signal) => resolve(c ?? signal)));
    expect(out).toBe('SIGTERM');
    expect(code).toBe(0);
  });
});
