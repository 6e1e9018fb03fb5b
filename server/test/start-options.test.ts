import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, FLAG_ROWS } from '../config.js';
import { ManualClock, startServer, type RunningServer } from '../index.js';
import { DEPRECATED_OPTION_NAMES, optionNameOf, resolveStartOptions, START_OPTION_NAMES } from '../start-options.js';

/** startServer()'s options are the flags in camelCase, read through the settings table (issue 28). */
const servers: RunningServer[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
});

describe('startServer options', () => {
  it('are the flags of loops-mock serve in camelCase, one name per flag', () => {
    for (const row of FLAG_ROWS) expect(START_OPTION_NAMES).toContain(optionNameOf(row.flag));
    expect(optionNameOf('presign-ttl-s')).toBe('presignTtlS');
    // A field named otherwise inside the server is a 0.1 name with its alias; a new flag gets no other name.
    for (const row of FLAG_ROWS) if (row.option !== optionNameOf(row.flag)) expect(DEPRECATED_OPTION_NAMES[row.option], row.flag).toBe(optionNameOf(row.flag));
    const { options } = resolveStartOptions({
      warm: 'none',
      clock: 'virtual',
      apiKey: 'k1:org',
      journal: '/tmp/j.ndjson',
      presignTtlS: 60,
      tokenizer: 'Qwen/Qwen3-8B=./t.json',
    });
    expect(options).toMatchObject({
      warmModels: [],
      clockMode: 'virtual',
      apiKeys: [{ key: 'k1', org: 'org' }],
      journalFile: '/tmp/j.ndjson',
      presignTtlSeconds: 60,
      tokenizers: { 'Qwen/Qwen3-8B': './t.json' },
    });
  });

  it("take the flag text or the typed value, through the flag's own check", () => {
    expect(resolveStartOptions({ port: '0' as unknown as number }).options.port).toBe(0);
    expect(resolveStartOptions({ warm: [] }).options.warmModels).toEqual([]);
    expect(resolveStartOptions({ warm: ['Qwen/Qwen3-8B'] }).options.warmModels).toEqual(['Qwen/Qwen3-8B']);
    expect(resolveStartOptions({ apiKey: ['a', 'b:org'] }).options.apiKeys).toEqual([{ key: 'a' }, { key: 'b', org: 'org' }]);
    expect(resolveStartOptions({ apiKey: [{ key: 'x', org: 'o' }] }).options.apiKeys).toEqual([{ key: 'x', org: 'o' }]);
    expect(resolveStartOptions({ admin: true, batchRuns: false }).options).toMatchObject({ admin: true, batchRuns: false });
    expect(() => resolveStartOptions({ port: 70_000 })).toThrow(/startServer option 'port': --port must be a whole number from 0 to 65535, got '70000'/);
    expect(() => resolveStartOptions({ warm: 'Nope/Model' })).toThrow(/startServer option 'warm': --warm: 'Nope\/Model' is not a supported base model/);
    expect(() => resolveStartOptions({ admin: 'yes please' as unknown as boolean })).toThrow(/startServer option 'admin': --admin is a switch/);
    expect(() => resolveStartOptions({ port: {} as unknown as number })).toThrow(/startServer option 'port' \(--port\): must be a number or a string/);
  });

  it('refuse an unknown or misspelt name, naming the nearest', () => {
    const refused = (given: object) => {
      try {
        resolveStartOptions(given as never);
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        return (err as Error).message;
      }
      throw new Error('accepted');
    };
    expect(refused({ warmModel: 'none' })).toMatch(
      /^startServer: unknown option 'warmModel' \(did you mean 'warm'\?\); the options are the flags of loops-mock serve in camelCase \(port, host, /,
    );
    expect(refused({ logLevl: 'warn' })).toMatch(/unknown option 'logLevl' \(did you mean 'logLevel'\?\)/);
    expect(refused({ presignTtlSecs: 5 })).toMatch(/did you mean 'presignTtlS'\?/);
    expect(refused({ zzzzzzzzzzzz: 1 })).toMatch(/^startServer: unknown option 'zzzzzzzzzzzz'; the options/);
    // An old name beside its new one would leave which wins to chance.
    expect(refused({ warm: 'none', warmModels: [] })).toMatch(/'warmModels' and 'warm' are the same option \(--warm\)/);
  });

  it('keep the 0.1 names as deprecated aliases', () => {
    const { options } = resolveStartOptions({
      warmModels: [],
      clockMode: 'virtual',
      apiKeys: [{ key: 'old' }],
      journalFile: '/tmp/x',
      presignTtlSeconds: 7,
      tokenizers: {},
    });
    expect(options).toMatchObject({
      warmModels: [],
      clockMode: 'virtual',
      apiKeys: [{ key: 'old' }],
      journalFile: '/tmp/x',
      presignTtlSeconds: 7,
      tokenizers: {},
    });
  });

  it('take a Clock for clock (time driven by hand)', async () => {
    const clock = new ManualClock(Date.parse('2030-01-01T00:00:00Z'));
    const server = await startServer({ port: 0, logLevel: 'silent', warm: 'none', clock });
    servers.push(server);
    expect(server.core.clock).toBe(clock);
  });

  it('an unknown option fails startServer before anything listens', async () => {
    await expect(startServer({ port: 0, warmModle: 'none' } as never)).rejects.toThrow(/unknown option 'warmModle' \(did you mean 'warm'\?\)/);
  });
});

describe('close() and the warm-up', () => {
  it('close() returns while the engine still warms (it waits for no warm-up); /healthz said warming (200), then the engines close after it', async () => {
    const server = await startServer({ port: 0, logLevel: 'silent' });
    const warming = await fetch(`${server.url}/healthz`);
    expect([warming.status, ((await warming.json()) as { engine: string }).engine]).toEqual([200, 'warming']);
    await server.close();
    // Done closing, the warm-up (seconds of graph builds) not: close() did not wait for it.
    expect(server.engine()).toBe('warming');
    await expect(fetch(`${server.url}/healthz`)).rejects.toThrow();
    await server.enginesClosed();
    expect(server.engine()).toBe('ready');
  }, 60_000);

  it('/healthz says ready with nothing to warm', async () => {
    const server = await startServer({ port: 0, logLevel: 'silent', warm: 'none' });
    servers.push(server);
    await new Promise((resolve) => setImmediate(resolve));
    const res = await fetch(`${server.url}/healthz`);
    expect(((await res.json()) as { engine: string }).engine).toBe('ready');
  });
});

describe("the browser's icon", () => {
  it('GET /favicon.ico is an empty 204, not journaled', async () => {
    const server = await startServer({ port: 0, logLevel: 'silent', warm: 'none', admin: true });
    servers.push(server);
    const icon = await fetch(`${server.url}/favicon.ico`);
    expect(icon.status).toBe(204);
    const journal = (await (await fetch(`${server.url}/_mock/journal`)).json()) as { entries: { path: string }[] };
    expect(journal.entries.map((e) => e.path)).not.toContain('/favicon.ico');
  });
});
