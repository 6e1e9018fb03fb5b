import { isIP } from 'node:net';

/** What decides who can reach a starting server and what they can do there. */
export interface Exposure {
  host: string;
  proxy: boolean;
  admin: boolean;
  adminToken?: string;
}

/** Whether an address to listen on is this machine's own loopback (nobody else reaches it). */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, '');
  if (h === 'localhost' || h === '::1') return true;
  return isIP(h) === 4 && h.startsWith('127.');
}

/**
 * The start's warnings, one line each, when a listening address other machines reach meets a mode meant for
 * this machine alone: proxy mode turns the port into a forward proxy (to Baseten's names, answered here, and to
 * every --proxy-passthrough host), and the admin API without a token lets anyone reset the server.
 */
export function exposureWarnings(o: Exposure): string[] {
  if (isLoopback(o.host)) return [];
  const where = `--host ${o.host} listens where other machines reach it`;
  const warnings: string[] = [];
  if (o.proxy)
    warnings.push(
      `${where}, and --proxy makes the port a forward proxy for all of them (Baseten's and the Hub's names answered here, the --proxy-passthrough hosts tunnelled): listen on 127.0.0.1 unless other machines must use the proxy, and then only on a network you trust`,
    );
  if (o.admin && o.adminToken === undefined)
    warnings.push(
      `${where}, and --admin without --admin-token lets any of them reset the server, change its faults and read its journal: add --admin-token TOKEN`,
    );
  return warnings;
}
