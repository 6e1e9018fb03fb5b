import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { REPO_ROOT } from './helpers.js';

// Issue 31 item 19: `node bin/loops-mock.js serve` (the docs' own way) ran without the launcher's memory
// settings; --proxy or an open admin API on an address others reach started without a word. Real processes (dist/).

const BIN = join(REPO_ROOT, 'bin', 'loops-mock.js');
const started: ChildProcess[] = [];
afterEach(() => {
  for (const p of started.splice(0)) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
});

interface Launched {
  process: ChildProcess;
  url: string;
  /** The server's log lines (JSON) up to the CLI's memory-settings line, which follows every start-up line. */
  log: () => Promise<{ level: number; msg: string }[]>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Starts `node bin/loops-mock.js serve ...` as a user would, with no settings of its own; resolves once the variables are printed. */
function launch(args: string[], env: Record<string, string> = {}): Promise<Launched> {
  const clean = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => k !== 'MALLOC_MMAP_THRESHOLD_' && !k.startsWith('LOOPS_MOCK_') && k !== 'NODE_OPTIONS'),
  );
  const child = spawn(process.execPath, [BIN, 'serve', '--port', '0', '--warm', 'none', '--log-format', 'json', ...args], {
    env: { ...clean, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  started.push(child);
  let out = '';
  let err = '';
  child.stderr!.on('data', (c) => {
    err += c;
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  const lines = () =>
    err
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: number; msg: string });
  // stderr is its own pipe: its lines may arrive after stdout's variables.
  const log = async () => {
    while (!lines().some((l) => /^runtime memory settings/.test(l.msg)) && child.exitCode === null) await new Promise((r) => setTimeout(r, 50));
    return lines();
  };
  return new Promise((resolve, reject) => {
    child.stdout!.on('data', (c) => {
      out += c;
      const m = /^(?:LOOPS_BASE_URL|HTTPS_PROXY)=(\S+)$/m.exec(out);
      if (m && out.includes('# dashboard:')) resolve({ process: child, url: m[1]!, log, exited });
    });
    void exited.then(({ code }) => reject(new Error(`exited ${code} before listening: ${err}`)));
  });
}

/** Whether anything answers at `url` now. */
async function answers(url: string): Promise<boolean> {
  try {
    await fetch(`${url}/healthz`);
    return true;
  } catch {
    return false;
  }
}

describe('node bin/loops-mock.js', () => {
  it('runs the server with the memory settings in effect, and a SIGTERM to the command stops it gracefully (exit 0)', async () => {
    const server = await launch([]);
    const log = (await server.log()).map((l) => l.msg);
    expect(log).toContain('runtime memory settings: --expose-gc, MALLOC_MMAP_THRESHOLD_=1048576');
    expect(log.some((m) => /memory settings missing/.test(m))).toBe(false);
    expect(await answers(server.url)).toBe(true);
    server.process.kill('SIGTERM');
    expect(await server.exited).toEqual({ code: 0, signal: null });
    expect(await answers(server.url)).toBe(false);
  });

  it('leaves no server behind when the command is killed outright (SIGKILL)', async () => {
    const server = await launch([]);
    server.process.kill('SIGKILL');
    await server.exited;
    // The server's channel to the command closed with it: it stops (polled until then; no time is asserted).
    while (await answers(server.url)) await new Promise((r) => setTimeout(r, 100));
    expect(await answers(server.url)).toBe(false);
  });

  it('warns when --proxy, or --admin without a token, listens on an address other machines reach', async () => {
    const caDir = mkdtempSync(join(tmpdir(), 'launcher-ca-'));
    const open = await launch(['--host', '0.0.0.0', '--proxy', '--admin', '--ca-dir', caDir]);
    const warnings = (await open.log()).filter((l) => l.level === 40).map((l) => l.msg);
    expect(warnings.some((w) => /--host 0\.0\.0\.0 listens where other machines reach it, and --proxy makes the port a forward proxy/.test(w))).toBe(true);
    expect(warnings.some((w) => /--admin without --admin-token lets any of them reset the server.*add --admin-token TOKEN/.test(w))).toBe(true);
    open.process.kill('SIGTERM');
    await open.exited;
    const local = await launch(['--proxy', '--admin', '--ca-dir', caDir]);
    expect(
      (await local.log())
        .filter((l) => l.level === 40)
        .map((l) => l.msg)
        .filter((w) => /other machines/.test(w)),
    ).toEqual([]);
  });
});

describe('bin/loops-mock.js run as a command (sh reads it first)', () => {
  it('execs node with nothing on stderr: its second line is valid sh and valid JavaScript', async () => {
    // A formatter once rewrote `":" //;` as `':'; //;`, which makes sh try to run `//` (a directory).
    const child = spawn(BIN, ['--version'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout!.on('data', (c) => {
      out += c;
    });
    child.stderr!.on('data', (c) => {
      err += c;
    });
    const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    expect({ code, err }).toEqual({ code: 0, err: '' });
    expect(out).toMatch(/^loops-mock \d+\.\d+\.\d+ \(tracks the Baseten Loops API /);
  });
});

describe('what a server keeps for the next one (--cache-dir, LOOPS_MOCK_CACHE_DIR)', () => {
  /** The files under `dir`, as paths relative to it. */
  const filesUnder = (dir: string): string[] =>
    existsSync(dir)
      ? readdirSync(dir, { recursive: true, withFileTypes: true })
          .filter((e) => e.isFile())
          .map((e) => join(e.parentPath, e.name).slice(dir.length + 1))
      : [];
  const warmedUp = async (url: string) => {
    for (;;) {
      const health = (await (await fetch(`${url}/healthz`)).json()) as { engine: string };
      if (health.engine === 'ready') return;
      await new Promise((r) => setTimeout(r, 100));
    }
  };

  it("keeps onnxruntime's optimized graphs there, and on Node 22.1+ the compiled modules; removes retired entries; none keeps nothing", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'loops-mock-cache-'));
    // An earlier version's base weights: no longer read, so removed once the server is ready.
    mkdirSync(join(dir, 'base-weights'));
    writeFileSync(join(dir, 'base-weights', '1a3482c767a2959c34a4ab34.bin'), 'retired');
    // A vocabulary of 64 words: graphs of other shapes than the built-in families' the package's build optimized,
    // so the warm-up's are optimized here and kept.
    const vocab = Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`w${i}`, i]));
    const tokenizer = join(mkdtempSync(join(tmpdir(), 'loops-mock-tokenizer-')), 'tokenizer.json');
    const model = { type: 'WordLevel', vocab, unk_token: 'w0' };
    const none = { truncation: null, padding: null, normalizer: null, post_processor: null, decoder: null };
    writeFileSync(tokenizer, JSON.stringify({ version: '1.0', ...none, added_tokens: [], pre_tokenizer: { type: 'Whitespace' }, model }));
    const kept = await launch(['--warm', 'Qwen/Qwen3.5-2B', '--tokenizer', `Qwen/Qwen3.5-2B=${tokenizer}`], { LOOPS_MOCK_CACHE_DIR: dir });
    await warmedUp(kept.url);
    kept.process.kill('SIGTERM');
    expect((await kept.exited).code).toBe(0);
    const files = filesUnder(dir);
    expect(files.filter((f) => f.startsWith('onnxruntime-models/') && f.endsWith('.bin')).length).toBeGreaterThanOrEqual(7);
    expect(existsSync(join(dir, 'base-weights'))).toBe(false);
    // Node's own compile cache exists from 22.1 on (module.enableCompileCache); on 20 nothing is kept for it.
    const hasCompileCache = typeof ((await import('node:module')).default as { enableCompileCache?: unknown }).enableCompileCache === 'function';
    expect(files.some((f) => f.startsWith('node-compile/'))).toBe(hasCompileCache);

    // Qwen's own vocabulary: the warm-up's graphs come optimized from the package's build, none is made here.
    const builtIn = mkdtempSync(join(tmpdir(), 'loops-mock-cache-built-in-'));
    const shipped = await launch(['--warm', 'Qwen/Qwen3.5-2B'], { LOOPS_MOCK_CACHE_DIR: builtIn });
    await warmedUp(shipped.url);
    shipped.process.kill('SIGTERM');
    expect((await shipped.exited).code).toBe(0);
    expect(filesUnder(builtIn).filter((f) => f.startsWith('onnxruntime-models/'))).toEqual([]);

    // The flag beats the variable; none keeps nothing at all.
    const empty = mkdtempSync(join(tmpdir(), 'loops-mock-cache-none-'));
    const off = await launch(['--warm', 'Qwen/Qwen3.5-2B', '--cache-dir', 'none'], { LOOPS_MOCK_CACHE_DIR: empty });
    await warmedUp(off.url);
    off.process.kill('SIGTERM');
    expect((await off.exited).code).toBe(0);
    expect(filesUnder(empty)).toEqual([]);
  }, 60_000);

  // Issue 29: a CI client sends its first round the moment the variables are printed; they come once the default
  // model is warm, so that round costs what a later one does (the figures: npm run bench -- --only first-round).
  it('prints the variables only once the default model is warm: /healthz says ready at once, and the dashboard is served', async () => {
    const server = await launch(['--warm', 'Qwen/Qwen3.5-2B']);
    const health = (await (await fetch(`${server.url}/healthz`)).json()) as { engine: string };
    expect(health.engine).toBe('ready');
    const page = await fetch(`${server.url}/_mock/ui`);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('<html');
    const log = (await server.log()).map((l) => l.msg);
    const warm = log.findIndex((m) => /Qwen\/Qwen3\.5-2B: engine warm \(--warm\)/.test(m));
    expect(warm).toBeGreaterThanOrEqual(0);
    // Said before the CLI's last start-up line, which it writes just before the variables.
    expect(warm).toBeLessThan(log.findIndex((m) => /^runtime memory settings/.test(m)));
    server.process.kill('SIGTERM');
    expect((await server.exited).code).toBe(0);
  }, 60_000);
});
