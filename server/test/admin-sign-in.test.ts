import { afterEach, describe, expect, it } from 'vitest';
import { TokenAttempts } from '../http/token-attempts.js';
import type { RunningServer } from '../index.js';
import { startTestServer } from './helpers.js';

// Issue 31 item 19: the admin token could be guessed at the speed of the port (sign-in, Bearer, cookie).

let server: RunningServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

describe('wrong admin tokens are limited per client address', () => {
  it('counts distinct wrong tokens in a window; the same one again counts once; the window frees the address', () => {
    let now = 0;
    const attempts = new TokenAttempts(() => now, 3, 60_000);
    attempts.recordWrong('1.1.1.1', 'a');
    attempts.recordWrong('1.1.1.1', 'a');
    attempts.recordWrong('1.1.1.1', 'b');
    expect(attempts.waitSeconds('1.1.1.1')).toBe(0);
    now = 10_000;
    attempts.recordWrong('1.1.1.1', 'c');
    // Until the oldest of them ('a', at 0) leaves the window.
    expect(attempts.waitSeconds('1.1.1.1')).toBe(50);
    expect(attempts.waitSeconds('2.2.2.2')).toBe(0);
    now = 59_500;
    expect(attempts.waitSeconds('1.1.1.1')).toBe(1);
    // 'a' (at 0) leaves the window: two wrong tokens are left, under the limit.
    now = 60_000;
    expect(attempts.waitSeconds('1.1.1.1')).toBe(0);
  });

  it('sign-in and the admin API answer 429 with Retry-After after ten wrong tokens, the right one too, for that address only', async () => {
    // With --api-key the dashboard's data routes check the token too.
    server = await startTestServer({ admin: true, adminToken: 'sesame', apiKey: 'k' });
    const login = (token: string, remoteAddress = '127.0.0.1') =>
      server!.app.inject({ method: 'POST', url: '/_mock/ui/login', payload: { token }, remoteAddress });
    // A stale cookie polled again and again is one wrong token, never a lockout.
    for (let i = 0; i < 30; i++) expect((await login('stale')).statusCode).toBe(401);
    expect((await login('sesame')).statusCode).toBe(200);
    for (let i = 0; i < 9; i++) expect((await login(`guess-${i}`)).statusCode).toBe(401);
    const locked = await login('sesame');
    expect(locked.statusCode).toBe(429);
    // Ten wrong ones ('stale' and nine guesses): the next attempt waits until the oldest is a minute old.
    const error = locked.json().error;
    expect(error).toMatchObject({ type: 'rate_limited' });
    expect(error.retry_after_s).toBeGreaterThanOrEqual(1);
    expect(error.retry_after_s).toBeLessThanOrEqual(60);
    expect(error.message).toMatch(new RegExp(`Too many wrong admin tokens.*try again in ${error.retry_after_s} s`));
    expect(locked.headers['retry-after']).toBe(String(error.retry_after_s));
    const bearer = await server.app.inject({ method: 'GET', url: '/_mock/faults', headers: { authorization: 'Bearer sesame' } });
    expect(bearer.statusCode).toBe(429);
    const cookie = await server.app.inject({ method: 'GET', url: '/_mock/dashboard/overview', headers: { cookie: 'loops_mock_admin=sesame' } });
    expect(cookie.statusCode).toBe(429);
    expect((await login('sesame', '10.0.0.2')).statusCode).toBe(200);
  });

  it('wrong Bearer tokens on the admin API count as sign-in attempts do', async () => {
    server = await startTestServer({ admin: true, adminToken: 'sesame' });
    for (let i = 0; i < 10; i++) {
      expect((await server.app.inject({ method: 'GET', url: '/_mock/journal', headers: { authorization: `Bearer guess-${i}` } })).statusCode).toBe(401);
    }
    expect((await server.app.inject({ method: 'POST', url: '/_mock/ui/login', payload: { token: 'sesame' } })).statusCode).toBe(429);
  });
});
