import { Agent, request, type IncomingHttpHeaders } from 'node:http';

/** A request that has not answered within this is a hang (the bound; long polls are set far below it). */
export const HANG_MS = 30_000;

export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
}

/** What a request came to: an answer, no answer within HANG_MS, or a connection that failed. */
export type Outcome = { kind: 'answer'; answer: Answer } | { kind: 'hang' } | { kind: 'transport'; message: string };

/** Keep-alive HTTP with a hang bound; bodies are sent as given (text), so a case can send what JSON.stringify cannot. */
export function soakClient(base: string, sockets: number) {
  const agent = new Agent({ keepAlive: true, maxSockets: sockets });
  const send = (method: string, path: string, body: string | undefined, headers: Record<string, string>): Promise<Outcome> =>
    new Promise((resolve) => {
      let settled = false;
      const done = (o: Outcome) => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          resolve(o);
        }
      };
      const req = request(`${base}${path}`, { method, agent, headers }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => done({ kind: 'answer', answer: { status: res.statusCode!, headers: res.headers, text: Buffer.concat(chunks).toString() } }));
        res.on('error', (e) => done({ kind: 'transport', message: e.message }));
      });
      const timer = setTimeout(() => {
        done({ kind: 'hang' });
        req.destroy();
      }, HANG_MS);
      req.on('error', (e) => done({ kind: 'transport', message: e.message }));
      req.end(body);
    });
  return { send, close: () => agent.destroy() };
}

/**
 * What is wrong with an error answer's shape, or null: every status from 400 on carries
 * `{"error": {"type": string, "message": string}}` as JSON and the X-Loops-Mock-Version header.
 * A deployed checkpoint's inference door (`/model/...`) answers as Baseten's edge does for the model
 * itself (unknown, starting, stopped, no key): `{"error": "<message>"}`; its own 4xx are OpenAI's shape.
 * `/graphql/` answers GraphQL's `{"errors": [{"message"}]}`.
 */
export function errorShapeProblem(status: number, headers: IncomingHttpHeaders, text: string, path = ''): string | null {
  if (status < 400) return null;
  if (!headers['x-loops-mock-version']) return 'no X-Loops-Mock-Version header';
  if (!String(headers['content-type'] ?? '').startsWith('application/json')) return `content-type ${headers['content-type'] ?? 'missing'}`;
  let body: any;
  try {
    body = JSON.parse(text);
  } catch {
    return 'body is not JSON';
  }
  if (path.startsWith('/model/') && typeof body?.error === 'string' && body.error.length > 0) return null;
  // GraphQL answers a request that is not one with a 400 and GraphQL's own errors list.
  if (path.startsWith('/graphql') && typeof body?.errors?.[0]?.message === 'string') return null;
  if (typeof body?.error?.type !== 'string' || typeof body?.error?.message !== 'string') return 'body is not {"error": {"type", "message"}}';
  return null;
}
