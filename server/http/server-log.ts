import { Writable } from 'node:stream';
import { pino, type Logger } from 'pino';
import type { JournalEntry } from '../core/journal.js';

export type LogFormat = 'pretty' | 'json';

/** pino's numeric levels, for the pretty line. */
const LEVEL_NAMES: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };

/**
 * The server's log on stderr, for a person at a terminal (pretty: one short
 * line each) or for a log collector (json: pino's NDJSON). Fastify logs its
 * own errors through it; the server adds one line per request and the
 * lifecycle events of runs, samplers and publications.
 */
export function createServerLog(level: string, format: LogFormat, out: NodeJS.WritableStream = process.stderr): Logger {
  if (format === 'json') return pino({ level, base: undefined, timestamp: pino.stdTimeFunctions.isoTime }, out as never);
  return pino({ level, base: undefined }, prettyStream(out));
}

/** pino's JSON lines, printed as `HH:MM:SS.mmm LEVEL message key=value ...`. */
function prettyStream(out: NodeJS.WritableStream): Writable {
  return new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (!line) continue;
        let record: Record<string, unknown>;
        try {
          record = JSON.parse(line) as Record<string, unknown>;
        } catch {
          out.write(`${line}\n`);
          continue;
        }
        const { time, level, msg, err, ...rest } = record;
        const clock = new Date(Number(time)).toISOString().slice(11, 23);
        const extras = Object.entries(rest)
          .filter(([k]) => k !== 'reqId' && k !== 'req' && k !== 'res')
          .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`);
        const stack = err && typeof err === 'object' ? `\n${String((err as { stack?: string }).stack ?? (err as { message?: string }).message)}` : '';
        out.write(
          `${clock} ${(LEVEL_NAMES[Number(level)] ?? String(level)).padEnd(5)} ${String(msg ?? '')}${extras.length ? `  ${extras.join(' ')}` : ''}${stack}\n`,
        );
      }
      done();
    },
  });
}

/**
 * One line per request, from its journal entry: method, path, status,
 * duration, and for an error answer its type and message (what a person
 * needs to see why a client was refused). 5xx at error, the rest at info.
 */
export function logRequest(log: Logger, e: JournalEntry): void {
  const sent = e.host ? ` (${e.host})` : '';
  const head = `${e.method} ${e.path}${sent} ${e.status === 0 ? 'dropped' : e.status} ${e.latency_ms.toFixed(1)} ms`;
  const why = e.response?.error_type
    ? ` ${e.response.error_type}${e.response.error_message ? `: ${e.response.error_message}` : ''}`
    : e.proxy?.error
      ? ` ${e.proxy.error}`
      : '';
  const line = `${head}${why}`;
  if (e.status >= 500) log.error(line);
  else log.info(line);
}
