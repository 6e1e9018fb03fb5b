import { connect } from 'node:net';
import { Prng } from '../models/prng.js';
import { HANG_MS, errorShapeProblem } from './http.js';
import { chance, pick } from './schema-values.js';

/**
 * HTTP that no client library would send, over raw sockets: the framing
 * errors Node's parser refuses, oversized lines, and seeded byte mutations
 * of valid requests. Each case writes its bytes, half-closes, and reads
 * every answer until the server closes. An answer with an error status must
 * have the error shape and the version header; none may be a 5xx; the
 * server must close within 30 s.
 */

export interface RawFigures {
  cases: number;
  fiveXx: number;
  wrongShape: number;
  hangs: number;
  /** Cases the server closed without an answer (a request cut off by the half-close, say): allowed, counted to show it. */
  noAnswer: number;
  failures: string[];
}

const CRLF = '\r\n';

function templates(key: string): string[] {
  const auth = `Authorization: Bearer ${key}${CRLF}`;
  return [
    `GET /v1/loops/runs HTTP/1.1${CRLF}Host: localhost${CRLF}${auth}${CRLF}`,
    `POST /v1/loops/sessions HTTP/1.1${CRLF}Host: localhost${CRLF}${auth}Content-Type: application/json${CRLF}Content-Length: 2${CRLF}${CRLF}{}`,
    `POST /v1/loops/sessions HTTP/1.1${CRLF}Host: localhost${CRLF}${auth}Content-Type: application/json${CRLF}Transfer-Encoding: chunked${CRLF}${CRLF}2${CRLF}{}${CRLF}0${CRLF}${CRLF}`,
    `GET /hf/api/models/Qwen/Qwen3.5-2B HTTP/1.1${CRLF}Host: localhost${CRLF}${CRLF}`,
  ];
}

/** The framing errors of issue 14 item 10 and their neighbours, each a whole request. */
function fixedCases(key: string): string[] {
  const auth = `Authorization: Bearer ${key}${CRLF}`;
  const get = (target: string, extra = '') => `GET ${target} HTTP/1.1${CRLF}Host: localhost${CRLF}${auth}${extra}${CRLF}`;
  const post = (headers: string, body: string) =>
    `POST /v1/loops/sessions HTTP/1.1${CRLF}Host: localhost${CRLF}${auth}Content-Type: application/json${CRLF}${headers}${CRLF}${body}`;
  return [
    get('/v1/loops/runs', `Bad header line${CRLF}`),
    post(`Content-Length: abc${CRLF}`, '{}'),
    post(`Content-Length: 2${CRLF}Transfer-Encoding: chunked${CRLF}`, `2${CRLF}{}${CRLF}0${CRLF}${CRLF}`),
    post(`Transfer-Encoding: chunked${CRLF}`, `zz${CRLF}{}${CRLF}0${CRLF}${CRLF}`),
    `GET /v1/loops/\u0000runs HTTP/1.1${CRLF}Host: localhost${CRLF}${CRLF}`,
    get('v1/loops/runs'),
    get('/v1/loops/runs', `X Bad: 1${CRLF}`),
    get(`/v1/loops/runs?x=${'a'.repeat(17_000)}`),
    get('/v1/loops/runs', `X-Big: ${'b'.repeat(17_000)}${CRLF}`),
    `BREW /v1/loops/runs HTTP/1.1${CRLF}Host: localhost${CRLF}${CRLF}`,
    `GET /v1/loops/runs HTTP/2.0${CRLF}Host: localhost${CRLF}${CRLF}`,
    `GET /v1/loops/runs${CRLF}${CRLF}`,
    `GET /v1/loops/runs HTTP/1.1\nHost: localhost\n\n`,
    get('/v1/loops/runs', `X-Folded: a${CRLF} b${CRLF}`),
    post(`Content-Length: 2${CRLF}Content-Length: 3${CRLF}`, '{}'),
    post(`Content-Length: -1${CRLF}`, '{}'),
    post(`Content-Length: 99999999999999999999${CRLF}`, '{}'),
    post(`Expect: 100-continue${CRLF}Content-Length: 2${CRLF}`, '{}'),
    post(`Transfer-Encoding: gzip, chunked${CRLF}`, `2${CRLF}{}${CRLF}0${CRLF}${CRLF}`),
    post(`Transfer-Encoding: chunked${CRLF}`, `2;ext=${'e'.repeat(20_000)}${CRLF}{}${CRLF}0${CRLF}${CRLF}`),
    `${get('/v1/loops/runs')}${get('/v1/loops/runs', `Bad header line${CRLF}`)}`,
    `PRI * HTTP/2.0${CRLF}${CRLF}SM${CRLF}${CRLF}`,
    get('/v1/loops/runs', `Host: second${CRLF}`),
    get('/%5Fmock/faults'),
    get('/v1/loops/runs/%zz'),
    `\u0016\u0003\u0001\u0000\u00a5\u0001\u0000\u0000\u00a1\u0003\u0003`,
  ];
}

/** A valid request with 1 to 3 bytes replaced, inserted or deleted, or cut short. */
function mutated(rng: Prng, key: string): string {
  let text = pick(rng, templates(key));
  const edits = 1 + Math.floor(rng.next() * 3);
  for (let e = 0; e < edits; e++) {
    const at = Math.floor(rng.next() * text.length);
    const byte = pick(rng, ['\u0000', '\r', '\n', ' ', ':', '\u007f', '\u00ff', 'A', '%', '\t', String.fromCharCode(Math.floor(rng.next() * 256))]);
    const op = Math.floor(rng.next() * 4);
    if (op === 0) text = text.slice(0, at) + byte + text.slice(at + 1);
    else if (op === 1) text = text.slice(0, at) + byte + text.slice(at);
    else if (op === 2) text = text.slice(0, at) + text.slice(at + 1);
    else if (chance(rng, 0.5)) text = text.slice(0, at);
  }
  return text;
}

interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** The answers in what the server sent: status line, headers, and a Content-Length or chunked body each. */
export function parseAnswers(bytes: Buffer): RawAnswer[] {
  const answers: RawAnswer[] = [];
  let rest = bytes.toString('latin1');
  while (rest.startsWith('HTTP/')) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const [statusLine, ...lines] = rest.slice(0, end).split('\r\n');
    const headers: Record<string, string> = {};
    for (const line of lines) {
      const colon = line.indexOf(':');
      headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    rest = rest.slice(end + 4);
    let body = '';
    if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      body = rest.slice(0, n);
      rest = rest.slice(n);
    } else if (headers['transfer-encoding']?.includes('chunked')) {
      for (;;) {
        const lineEnd = rest.indexOf('\r\n');
        const size = parseInt(rest.slice(0, lineEnd), 16);
        rest = rest.slice(lineEnd + 2);
        if (!size) {
          rest = rest.slice(rest.indexOf('\r\n') + 2);
          break;
        }
        body += rest.slice(0, size);
        rest = rest.slice(size + 2);
      }
    }
    answers.push({ status: Number(statusLine!.split(' ')[1]), headers, body: Buffer.from(body, 'latin1').toString() });
  }
  return answers;
}

/** Writes the bytes, half-closes, and collects what comes back until the server closes, or HANG_MS. */
function exchange(port: number, text: string): Promise<{ bytes: Buffer; hung: boolean }> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const socket = connect(port, '127.0.0.1', () => socket.end(Buffer.from(text, 'latin1')));
    const timer = setTimeout(() => {
      socket.destroy();
      resolve({ bytes: Buffer.concat(chunks), hung: true });
    }, HANG_MS);
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ bytes: Buffer.concat(chunks), hung: false });
    });
  });
}

export async function runMalformedHttp(port: number, key: string, cases: number, seed: string, concurrency = 8): Promise<RawFigures> {
  const figures: RawFigures = { cases: 0, fiveXx: 0, wrongShape: 0, hangs: 0, noAnswer: 0, failures: [] };
  const fixed = fixedCases(key);
  const texts = Array.from({ length: Math.max(cases, fixed.length) }, (_, i) => (i < fixed.length ? fixed[i]! : mutated(new Prng(`${seed}:raw:${i}`), key)));
  const fail = (i: number, reason: string) => {
    if (figures.failures.length < 20) figures.failures.push(`raw case ${i} ${JSON.stringify(texts[i]!.slice(0, 120))}: ${reason}`);
  };
  let next = 0;
  const worker = async () => {
    while (next < texts.length) {
      const i = next++;
      const { bytes, hung } = await exchange(port, texts[i]!);
      figures.cases++;
      if (hung) {
        figures.hangs++;
        fail(i, 'not closed within 30 s');
        continue;
      }
      const answers = parseAnswers(bytes);
      if (!answers.length) figures.noAnswer++;
      for (const a of answers) {
        if (a.status >= 500) {
          figures.fiveXx++;
          fail(i, `${a.status} ${a.body.slice(0, 200)}`);
        }
        const shape = errorShapeProblem(a.status, a.headers, a.body);
        if (shape) {
          figures.wrongShape++;
          fail(i, `${a.status}: ${shape}`);
        }
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return figures;
}
