import type { Socket } from 'node:net';
import { VERSION } from '../version.js';

/**
 * What the HTTP server answers when a request never reaches the app: Node's
 * parser refused it (a malformed line, a bad Content-Length, a chunk size
 * that is not one), it arrived too slowly (--headers-timeout-ms,
 * --body-timeout-ms), or its request line or headers were too large. Always
 * the error shape every answer has, with X-Loops-Mock-Version, then the
 * connection is closed (the stream cannot be trusted after a parse error).
 */
export function answerClientError(error: Error, socket: Socket): void {
  const err = error as NodeJS.ErrnoException & { rawPacket?: Buffer };
  if (err.code === 'ECONNRESET' || socket.destroyed || !socket.writable) {
    socket.destroy();
    return;
  }
  const { status, type, message } = describe(err);
  const body = JSON.stringify({ error: { type, message, ...(err.code ? { code: err.code } : {}) } });
  socket.end(
    `HTTP/1.1 ${status} ${REASONS[status]}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nx-loops-mock-version: ${VERSION}\r\nconnection: close\r\n\r\n${body}`,
  );
}

const REASONS: Record<number, string> = { 400: 'Bad Request', 408: 'Request Timeout', 414: 'URI Too Long', 431: 'Request Header Fields Too Large' };

function describe(err: NodeJS.ErrnoException & { rawPacket?: Buffer; reason?: string }): { status: number; type: string; message: string } {
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    return {
      status: 408,
      type: 'request_timeout',
      message: 'The request did not arrive in time: its headers within --headers-timeout-ms, the whole of it within --body-timeout-ms. Send it at once.',
    };
  }
  if (err.code === 'HPE_HEADER_OVERFLOW') {
    // Node counts the request line with the headers: no line end in what was read means the URL itself is too long.
    const raw = err.rawPacket ?? Buffer.alloc(0);
    const lineEnd = raw.indexOf('\r\n');
    if (lineEnd < 0 || lineEnd > 8192)
      return {
        status: 414,
        type: 'uri_too_long',
        message: 'The request line is longer than the 16 KB this server reads; send a shorter URL (large inputs go in the body).',
      };
    return {
      status: 431,
      type: 'headers_too_large',
      message: 'The request headers are larger than the 16 KB this server reads; send fewer or shorter headers.',
    };
  }
  const detail = (err.reason ?? err.message ?? 'unreadable').replace(/[\r\n]+/g, ' ').slice(0, 200);
  return {
    status: 400,
    type: 'invalid_request',
    message: `The request is not well-formed HTTP/1.1 (${err.code ?? 'parse error'}: ${detail}); nothing was done.`,
  };
}
