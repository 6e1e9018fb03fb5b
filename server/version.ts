import { packageRoot } from '../models/package-root.js';

/** Sent as `X-Loops-Mock-Version` on every response. */
export const VERSION = packageRoot(import.meta.url)?.version ?? '0.0.0';

/**
 * The version of Baseten's published management API schema (its info.version) that this mock's
 * routes and bodies follow; `loops-mock --version` names it. Checked against that document where
 * it is at hand (server/test/release.test.ts).
 */
export const LOOPS_API_VERSION = '1.0.0';
