import { mkdtempSync, readFileSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { spawn } from 'node:child_process';
import { collectorAfterReleases } from '../../models/collect-soon.js';
import { REPO_ROOT } from './helpers.js';

const g = globalThis as { gc?: () => void };
const saved = g.gc;
afterEach(() => {
  g.gc = saved;
});

describe('memory back to the system', () => {
  it('collects once, shortly after a burst of runs stopping, and under a sustained load at most once a gap; where gc is exposed; does nothing where it is not', async () => {
    let collections = 0;
    g.gc = () => {
      collections++;
    };
    const collect = collectorAfterReleases(50, 100);
    for (let i = 0; i < 20; i++) collect();
    expect(collections).toBe(0);
    await new Promise((r) => setTimeout(r, 120));
    expect(collections).toBe(1);
    collect();
    await new Promise((r) => setTimeout(r, 120));
    expect(collections).toBe(2);
    // Releases that keep coming (every 25 ms for 400 ms): a collection per 150 ms gap at most, not one every
    // 50 ms; and the last one after the last release.
    const times: number[] = [];
    g.gc = () => {
      times.push(performance.now());
    };
    const slow = collectorAfterReleases(50, 150);
    let lastRelease = 0;
    for (let i = 0; i < 16; i++) {
      slow();
      lastRelease = performance.now();
      await new Promise((r) => setTimeout(r, 25));
    }
    await new Promise((r) => setTimeout(r, 250));
    expect(times.length).toBeGreaterThanOrEqual(2);
    expect(times.length).toBeLessThanOrEqual(4);
    for (let i = 1; i < times.length; i++) expect(times[i]! - times[i - 1]!).toBeGreaterThanOrEqual(140);
    expect(times.at(-1)!).toBeGreaterThan(lastRelease);
    delete g.gc;
    expect(() => collectorAfterReleases(1)()).not.toThrow();
  });

  it('the loops-mock command, as npm links it and npm start runs it, is Node with the fixed mmap threshold and gc exposed', async () => {
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8'));
    expect(pkg.bin['loops-mock']).toBe('bin/loops-mock.js');
    expect(pkg.scripts.start).toBe('bin/loops-mock.js serve');
    // The command run through its shebang, as npm's link and npm start run it; and through a symlink, as npm links it.
    const link = join(mkdtempSync(join(tmpdir(), 'loops-mock-bin-')), 'loops-mock');
    symlinkSync(join(REPO_ROOT, 'bin', 'loops-mock.js'), link);
    const child = spawn(link, ['--port', '0', '--log-level', 'silent'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout!.on('data', (d: Buffer) => {
          if (d.toString().includes('listening on')) resolve();
        });
        child.once('exit', (code) => reject(new Error(`exited with ${code}`)));
      });
      const environ = readFileSync(`/proc/${child.pid}/environ`, 'utf8').split('\0');
      const cmdline = readFileSync(`/proc/${child.pid}/cmdline`, 'utf8').split('\0');
      expect(environ).toContain('MALLOC_MMAP_THRESHOLD_=1048576');
      expect(cmdline).toContain('--expose-gc');
      // The shell gave its place to node: one process, the one that was started.
      expect(cmdline[0]).toMatch(/node$/);
    } finally {
      child.kill('SIGTERM');
    }
  });
});
