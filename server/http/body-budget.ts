import { Transform } from 'node:stream';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { LoopsError } from '../core/errors.js';
import type { Settings } from '../core/settings.js';

/**
 * The bytes of request bodies held at once, within `body_bytes_in_flight`
 * (issue 31 item 13: 40 concurrent 9 MB bodies took the server to 2.6 GB,
 * each costing about three times its size once read and parsed). A body is
 * counted from its Content-Length before it is read (as it arrives when
 * chunked) until its answer is sent; one that would pass the budget is a 503
 * with Retry-After, its body discarded as it arrives. A body alone is always taken, whatever the budget:
 * --body-limit bounds it.
 */
export function installBodyBudget(app: FastifyInstance, settings: Pick<Settings, 'bodyBytesInFlight'>): void {
  let held = 0;
  const holding = new WeakMap<FastifyRequest, number>();

  const take = (request: FastifyRequest, bytes: number) => {
    const limit = settings.bodyBytesInFlight;
    if (held > 0 && held + bytes > limit) {
      throw new LoopsError(
        'unavailable',
        `The server is holding ${held} bytes of other requests' bodies; with this one's ${bytes} that would pass its limit of ${limit} bytes held at once (--body-bytes-in-flight). Retry shortly, or send smaller bodies.`,
        { retry_after_s: 1, limit: 'body_bytes_in_flight', limit_value: limit },
      );
    }
    held += bytes;
    holding.set(request, (holding.get(request) ?? 0) + bytes);
  };
  const release = async (request: FastifyRequest) => {
    const bytes = holding.get(request);
    if (bytes === undefined) return;
    holding.delete(request);
    held -= bytes;
  };

  app.addHook('preParsing', async (request, _reply, payload) => {
    const declared = Number(request.headers['content-length']);
    if (Number.isFinite(declared) && declared > 0) {
      // Refused, the body is left unread: Node discards it as it arrives once the 503 is sent (nothing is kept),
      // so the client can finish sending and read the answer on a connection that stays usable.
      take(request, declared);
      return payload;
    }
    if (request.headers['transfer-encoding'] === undefined) return payload;
    // Chunked: counted as it arrives.
    let received = 0;
    const counted = new Transform({
      transform(chunk: Buffer, _encoding, done) {
        received += chunk.length;
        try {
          take(request, chunk.length);
          done(null, chunk);
        } catch (err) {
          done(err as Error);
        }
      },
    });
    payload.on('error', (err) => counted.destroy(err));
    payload.pipe(counted);
    // Fastify reads the length received from the stream it is given.
    Object.defineProperty(counted, 'receivedEncodedLength', { get: () => received });
    return counted;
  });
  app.addHook('onResponse', release);
  app.addHook('onRequestAbort', release);
}
