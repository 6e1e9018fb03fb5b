import { mkdtempSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { RunningServer } from '../index.js';
import { client, fakeCheckpointFiles, newRun, startTestServer } from './helpers.js';

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

const mode = (path: string) => statSync(path).mode & 0o777;

// Issue 31 item 17: the database holds the presign secret and checkpoints are the user's weights: owner-only.
describe('--data-dir is owner-only', () => {
  it('the folder, the database and its WAL, checkpoint folders and files', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'modes-')), 'data');
    server = await startTestServer({ dataDir: dir });
    const api = client(server);
    const run = await newRun(api);
    const c = server.core.checkpoints.save(server.core.fleet.findRun(run.id)!, 'trainer', 'final', fakeCheckpointFiles(2), { r: 16 });
    expect(mode(dir)).toBe(0o700);
    for (const name of readdirSync(dir).filter((n) => n.startsWith('loops-mock.sqlite'))) expect(mode(join(dir, name)), name).toBe(0o600);
    expect(readdirSync(dir)).toContain('loops-mock.sqlite-wal');
    expect(mode(join(dir, 'checkpoints'))).toBe(0o700);
    const folder = join(dir, 'checkpoints', c.id);
    expect(mode(folder)).toBe(0o700);
    for (const name of readdirSync(folder)) expect(mode(join(folder, name)), name).toBe(0o600);
  });
});
