import { randomBytes } from 'node:crypto';

const LOWER = 'abcdefghijklmnopqrstuvwxyz0123456789';
const MIXED = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

// Random bytes drawn in blocks: one getrandom call per thousands of ids, not one per id.
let pool = Buffer.alloc(0);
let offset = 0;
function nextByte(): number {
  if (offset >= pool.length) {
    pool = randomBytes(4096);
    offset = 0;
  }
  return pool[offset++]!;
}

function randomFrom(alphabet: string, length: number): string {
  // Rejection sampling keeps every character equally likely.
  const limit = 256 - (256 % alphabet.length);
  let out = '';
  while (out.length < length) {
    const byte = nextByte();
    if (byte < limit) out += alphabet[byte % alphabet.length];
  }
  return out;
}

/** Run, session, sampler and deployment ids look like Baseten's: 7 lowercase letters or digits (`e3mvjo3`). */
export const newResourceId = (): string => randomFrom(LOWER, 7);
/** Baseten model ids are 8 lowercase characters. */
export const newModelId = (): string => randomFrom(LOWER, 8);
/** Checkpoint global ids are 7 mixed-case characters (`VqKXRGB`). */
export const newCheckpointId = (): string => randomFrom(MIXED, 7);
/** An opaque secret, hex. */
export const newSecret = (bytes = 32): string => randomBytes(bytes).toString('hex');
