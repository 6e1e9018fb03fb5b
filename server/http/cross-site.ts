import type { FastifyRequest } from 'fastify';
import { bareHostName } from './allowed-hosts.js';

/**
 * The header a state-changing admin request carries to show it is not a
 * browser's "simple" request: a page on another site can send a POST with no
 * body, a form or text/plain (fetch with mode 'no-cors', a form), but not with
 * a header of its own nor a JSON body without the server's CORS consent, which
 * this server never gives. Any non-empty value; clients send `1`.
 */
export const ADMIN_REQUEST_HEADER = 'x-loops-mock-admin';

const READS = new Set(['GET', 'HEAD', 'OPTIONS']);
/** The content types a simple request may carry (the Fetch standard's CORS-safelisted ones). */
const SIMPLE_TYPES = new Set(['application/x-www-form-urlencoded', 'multipart/form-data', 'text/plain']);

/** Whether an Origin header names the host the request was sent to (scheme's default port when none). */
function sameOrigin(origin: string, hostHeader: string | undefined): boolean {
  if (!hostHeader) return false;
  let url: URL;
  try {
    url = new URL(origin);
  } catch {
    return false;
  }
  const defaultPort = url.protocol === 'https:' ? '443' : '80';
  const hostPort = /:(\d+)$/.exec(hostHeader.replace(/^\[[^\]]*\]/, ''))?.[1] ?? defaultPort;
  return bareHostName(url.host) === bareHostName(hostHeader) && (url.port || defaultPort) === hostPort;
}

/**
 * Why a request that changes the admin API's state looks sent by a page of
 * another site (CSRF), or undefined when it does not. Refused: a browser's
 * `Sec-Fetch-Site` other than same-origin (another port of 127.0.0.1 is
 * same-site, and refused too), else an `Origin` that is not this server's.
 * Then it must carry X-Loops-Mock-Admin, a body type no simple request can
 * have (JSON, YAML), or `Sec-Fetch-Site: same-origin`, which only the
 * browser sets (the dashboard's own fetches).
 */
export function crossSiteRefusal(request: FastifyRequest): { message: string; field: string } | undefined {
  if (READS.has(request.method)) return undefined;
  const site = request.headers['sec-fetch-site'];
  // A browser that sends Sec-Fetch-Site says where the request comes from; a reverse proxy that rewrites Host leaves it true.
  if (site !== undefined && site !== 'same-origin' && site !== 'none') {
    return {
      field: 'headers.sec-fetch-site',
      message: `The admin API refuses a ${request.method} a browser sent from another origin (Sec-Fetch-Site: ${String(site).slice(0, 40)}): a web page must not reset or reconfigure loops-mock. Use the dashboard on this server's own address, or a client outside the browser.`,
    };
  }
  const origin = request.headers.origin;
  if (site === undefined && origin !== undefined && !sameOrigin(origin, request.headers.host)) {
    return {
      field: 'headers.origin',
      message: `The admin API refuses a ${request.method} from the page at ${origin.slice(0, 100)} (Origin is not this server's): a web page of another site must not reset or reconfigure loops-mock.`,
    };
  }
  const marked = request.headers[ADMIN_REQUEST_HEADER];
  if (typeof marked === 'string' && marked !== '') return undefined;
  if (site === 'same-origin') return undefined;
  const type = request.headers['content-type']?.split(';')[0]?.trim().toLowerCase();
  if (type !== undefined && type !== '' && !SIMPLE_TYPES.has(type)) return undefined;
  return {
    field: `headers.${ADMIN_REQUEST_HEADER}`,
    message: `${request.method} ${request.url.split('?')[0]!.slice(0, 200)} changes the server's state: send the header 'X-Loops-Mock-Admin: 1' (or a JSON body with Content-Type: application/json), which a web page of another site cannot, so that it cannot reset or reconfigure loops-mock (curl -X ${request.method} -H 'X-Loops-Mock-Admin: 1' ...).`,
  };
}
