import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import type { LoopsCore } from '../core/core.js';
import { LoopsError } from '../core/errors.js';
import type { Principal } from '../core/records.js';
import { TokenAttempts } from './token-attempts.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The caller, set by the auth hook of the front doors that need one. */
    principal: Principal;
  }
}

const AUTH = /^(Bearer|Api-Key)\s+(\S+)\s*$/i;

/** The API key of `Authorization: Bearer <key>` or the legacy `Authorization: Api-Key <key>`, or undefined when absent. */
export function apiKeyOf(request: FastifyRequest): string | undefined {
  const header = request.headers.authorization;
  if (header === undefined) return undefined;
  const m = AUTH.exec(header);
  if (!m)
    throw new LoopsError('unauthorized', "Malformed Authorization header: send 'Authorization: Bearer <BASETEN_API_KEY>' (or the legacy 'Api-Key <key>').");
  return m[2]!;
}

/** Authenticates a request that must carry a key (the control plane). */
export function requirePrincipal(core: LoopsCore, request: FastifyRequest): Principal {
  const key = apiKeyOf(request);
  if (key === undefined) throw new LoopsError('unauthorized', "Missing Authorization header: send 'Authorization: Bearer <BASETEN_API_KEY>'.");
  return core.accounts.authenticate(key);
}

/** The cookie the dashboard's sign-in form sets: the admin token, for a page that cannot send a header on a link. */
export const ADMIN_COOKIE = 'loops_mock_admin';

/** The admin token a request carries: `Authorization: Bearer <token>`, or the dashboard's cookie. */
export function adminTokenOf(request: FastifyRequest): string | undefined {
  const header = request.headers.authorization;
  if (header?.startsWith('Bearer ')) return header.slice('Bearer '.length);
  const cookie = request.headers.cookie ?? '';
  const m = new RegExp(`(?:^|;\\s*)${ADMIN_COOKIE}=([^;]*)`).exec(cookie);
  if (!m) return undefined;
  try {
    return decodeURIComponent(m[1]!);
  } catch {
    return undefined;
  }
}

/** Whether a request carries the admin token, compared in constant time (hashes of equal length, so the length leaks nothing either). */
export function hasAdminToken(request: FastifyRequest, expected: string): boolean {
  const given = adminTokenOf(request);
  return given !== undefined && sameToken(given, expected);
}

/** Two tokens compared in constant time. */
export function sameToken(given: string, expected: string): boolean {
  const digest = (text: string) => createHash('sha256').update(text).digest();
  return timingSafeEqual(digest(given), digest(expected));
}

/**
 * The admin token's check for the admin API, the dashboard's data routes and
 * its sign-in, one per server: wrong tokens are limited per client address
 * (token-attempts.ts), so the token cannot be guessed at the speed of the port.
 */
export class AdminTokenGate {
  constructor(
    private readonly token: string,
    private readonly attempts = new TokenAttempts(),
  ) {}

  /** Whether the request carries the token (header or cookie); a wrong one counts. Throws 429 while the address must wait. */
  admits(request: FastifyRequest): boolean {
    const given = adminTokenOf(request);
    return given !== undefined && this.accepts(request, given);
  }

  /** Whether `given` is the token (the sign-in form's); a wrong one counts. Throws 429 while the address must wait. */
  accepts(request: FastifyRequest, given: string): boolean {
    const address = request.ip || 'unknown';
    const wait = this.attempts.waitSeconds(address);
    if (wait > 0) {
      throw new LoopsError(
        'rate_limited',
        `Too many wrong admin tokens from ${address} (${this.attempts.limit} different ones within ${this.attempts.windowMs / 1000} s): try again in ${wait} s.`,
        { retry_after_s: wait },
      );
    }
    if (sameToken(given, this.token)) return true;
    this.attempts.recordWrong(address, given);
    return false;
  }

  /** Whether the request carries the token, neither counted nor refused (for a flag such as the overview's signed_in). */
  carries(request: FastifyRequest): boolean {
    return hasAdminToken(request, this.token);
  }
}
