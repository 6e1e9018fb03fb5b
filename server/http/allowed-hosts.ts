import { isIP } from 'node:net';
import type { IncomingMessage } from 'node:http';

/**
 * Which Host values the server answers: its own names only, so that a page on
 * another site cannot read or drive it through DNS rebinding (a name the page's
 * site controls, re-pointed at 127.0.0.1: the browser then treats this server
 * as that site). Always answered: localhost and *.localhost (they never leave
 * the machine), any IP address (no DNS, so nothing to re-point), and a request
 * with no Host at all (HTTP/1.0; browsers always send one). Added: the names
 * the server is started with (--allowed-host, the bound --host, --public-url's
 * host) and, in proxy mode, Baseten's and the Hub's hosts, which the requests
 * decrypted by its interception carry.
 */
export interface HostNames {
  /** Names beyond the built-in ones, without ports. */
  extra?: readonly string[];
  /**
   * Hosts whose requests reach the app through what stands in front of it (proxy mode's
   * interception: Baseten's and the Hub's hosts), with how to name them in the 403.
   */
  intercepted?: { has(host: string): boolean; description: string };
}

/** A host name as compared here: lower case, no port, no IPv6 brackets, no trailing dot. */
export function bareHostName(host: string): string {
  const h = host.trim().toLowerCase();
  const v6 = /^\[([^\]]*)\](?::\d*)?$/.exec(h);
  if (v6) return v6[1]!;
  // One colon is a port; more is an IPv6 address without brackets (as --host takes it).
  const name = (h.match(/:/g)?.length ?? 0) === 1 ? h.replace(/:\d*$/, '') : h;
  return name.replace(/\.$/, '');
}

/** The host a request is addressed to: an absolute-form target's (a proxy request), else its Host header; undefined when it names none. */
export function addressedHost(req: IncomingMessage & { originalUrl?: string }): string | undefined {
  const target = req.originalUrl ?? req.url ?? '';
  if (/^https?:\/\//i.test(target)) {
    try {
      return bareHostName(new URL(target).host);
    } catch {
      return undefined;
    }
  }
  const header = req.headers.host;
  return header ? bareHostName(header) : undefined;
}

/** Decides whether a request's host is one of the server's names; `refusal` says why not and what to do. */
export class HostCheck {
  private readonly extra: Set<string>;

  constructor(private readonly names: HostNames = {}) {
    this.extra = new Set((names.extra ?? []).map(bareHostName).filter((n) => n !== '' && n !== '0.0.0.0' && n !== '::'));
  }

  allows(host: string | undefined): boolean {
    if (host === undefined || host === '') return true;
    if (isIP(host) !== 0) return true;
    if (host === 'localhost' || host.endsWith('.localhost')) return true;
    if (this.extra.has(host)) return true;
    return this.names.intercepted?.has(host) === true;
  }

  /** The 403's message for a host that is not allowed. */
  refusal(host: string): string {
    const shown = host.replace(/[^a-z0-9.:_-]/g, '?').slice(0, 100);
    const own = ['localhost', 'IP addresses', ...(this.names.intercepted ? [this.names.intercepted.description] : []), ...[...this.extra].map((n) => `'${n}'`)];
    return (
      `Host '${shown}' is not one of this server's names (it answers ${own.join(', ')}), so that a web page on another site cannot reach it through DNS rebinding. ` +
      `If you reach loops-mock by this name (--host 0.0.0.0 and the machine's name, a container's service name), start it with --allowed-host ${shown} (or LOOPS_MOCK_ALLOWED_HOST=${shown}).`
    );
  }
}
