import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { spawn } from 'node:child_process';
import { collectorAfterReleases } from '../memory-return.js';
import { REPO_ROOT } from './helpers.js';

const g = globalThis as { gc?: () => void };
const saved = g.gc;
afterEach(() => { g.gc = saved; });

describe('memory back to the system', () => {
  it('collects once, shortly after a burst of runs stopping, where gc is exposed; does nothing where it is not', async () => {
    let collections = 0;
    g.gc = () => { collections++; };
    const collect = collectorAfterReleases(50);
    for (let i = 0; i < 20; i++) collect();
    expect(collections).toBe(0);
    await new Promise((r) => setTimeout(r, 120));
    expect(collections).toBe(1);
    collect();
    await new Promise((r) => setTimeout(r, 120));
    expect(collections).toBe(2);
    delete g.gc;
    expect(() => collectorAfterReleases(1)()).not.toThrow();
  });

  it('the loops-mock command, as npm start runs it, starts Node with the fixed mmap threshold and gc exposed', async () => {
    expect(readFileSync(join(REPO_ROOT, 'server', 'cli.ts'), 'utf8').split('\n')[0]).toBe('#!/usr/bin/env -S MALLOC_MMAP_THRESHOLD_=1048576 node --expose-gc');
    expect(JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')).scripts.start).toBe('dist/server/cli.js serve');
    // The built command run through its shebang, as npm's link and npm start run it.
    const child = spawn(join(REPO_ROOT, 'dist', 'server', 'cli.js'), ['--port', '0', '--log-level', 'silent'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout!.on('data', (d: Buffer) => { if (d.toString().includes('listening on')) resolve(); });
        child.once('exit', (code) => reject(new Error(`exited with ${code}`)));
      });
      const environ = readFileSync(`/proc/${child.pid}/environ`, 'utf8').split('\0');
      const cmdline = readFileSync(`/proc/${child.pid}/cmdline`, 'utf8').split('\0');
      expect(environ).toContain('MALLOC_MMAP_THRESHOLD_=1048576');
      expect(cmdline).toContain('--expose-gc');
    } finally {
      child.kill('SIGTERM');
    }
  });
});
