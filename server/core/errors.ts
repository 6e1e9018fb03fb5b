/**
 * Errors the core raises. They carry a kind, never an HTTP status: each front
 * door maps kinds to its own statuses (server/http/errors.ts).
 */
export type ErrorKind =
  | 'invalid_request'
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'conflict'
  /** Too many attempts: wrong admin tokens from one address (server/http/token-attempts.ts). */
  | 'rate_limited'
  | 'payload_too_large'
  | 'unavailable'
  /** The data dir refused a write (full, or an I/O error): see storage-errors.ts. */
  | 'insufficient_storage';

export class LoopsError extends Error {
  constructor(
    readonly kind: ErrorKind,
    message: string,
    /** Extra fields for the error body, e.g. `field` or `supported`. */
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = 'LoopsError';
  }
}

export const invalid = (message: string, details?: Record<string, unknown>) => new LoopsError('invalid_request', message, details);
export const notFound = (message: string, details?: Record<string, unknown>) => new LoopsError('not_found', message, details);
export const conflict = (message: string, details?: Record<string, unknown>) => new LoopsError('conflict', message, details);
