/**
 * Entries of the cache folder (--cache-dir): what one process computed at its start, kept for the next. An entry
 * is one file: a first line naming what it holds, a line of JSON with its key, its size and a checksum, then its
 * bytes. One that is cut short, garbled, of another kind or made from other inputs is detected, never used, and
 * made again; a folder that cannot be written only costs the time.
 */
import { closeSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { threadId } from 'node:worker_threads';

/** What a lookup found: a usable entry, none, one it refused (and replaced), or no cache to use. */
export type CacheOutcome = 'hit' | 'miss' | 'rebuilt' | 'off';

/** An entry's header line: its key and the checksum of its `bytes` bytes, and what its kind adds. */
interface Header {
  key: string;
  bytes: number;
  /** Of the bytes, and of `about` as JSON: a header edited in place is refused too. */
  checksum: number;
  aboutChecksum: number;
  about: unknown;
}

const aboutChecksum = (about: unknown) => checksum([Buffer.from(JSON.stringify(about ?? null))]);

/**
 * A 32-bit checksum of the parts as if they were one run of bytes (every part but the last a multiple of 4
 * bytes long): ~10 ms for 39 MB, where a hash would cost what making the weights does.
 */
function checksum(parts: Uint8Array[]): number {
  let h = 0x811c9dc5;
  for (const part of parts) {
    const whole = part.byteLength >>> 2;
    if (part.byteOffset % 4 === 0) {
      const words = new Uint32Array(part.buffer, part.byteOffset, whole);
      for (let i = 0; i < whole; i++) h = Math.imul(h ^ words[i]!, 0x01000193) ^ (h >>> 15);
    } else {
      // Bytes that do not lie 4-aligned (a small entry in Node's shared pool): the same words, read byte by byte.
      for (let i = 0; i < 4 * whole; i += 4)
        h = Math.imul(h ^ (part[i]! | (part[i + 1]! << 8) | (part[i + 2]! << 16) | (part[i + 3]! << 24)), 0x01000193) ^ (h >>> 15);
    }
    for (let i = whole * 4; i < part.byteLength; i++) h = Math.imul(h ^ part[i]!, 0x01000193) ^ (h >>> 15);
  }
  return h >>> 0;
}

/** The entry's bytes (starting 4-aligned in the file) and what its header says of them, or why it cannot be used. */
function readEntry(file: string, magic: string, key: string): { bytes: Buffer; about: unknown } | string {
  let data: Buffer;
  try {
    data = readFileSync(file);
  } catch {
    return 'missing';
  }
  const headerEnd = data.indexOf(0x0a, magic.length);
  if (data.toString('latin1', 0, magic.length) !== magic || headerEnd < 0) return 'not an entry of this cache';
  let header: Header;
  try {
    header = JSON.parse(data.toString('utf8', magic.length, headerEnd)) as Header;
  } catch {
    return 'a garbled header';
  }
  if (typeof header !== 'object' || header === null) return 'a garbled header';
  if (header.key !== key) return 'made by other code or from other inputs';
  const start = headerEnd + 1;
  if (data.length - start !== header.bytes) return `${data.length} bytes, not the ${start + header.bytes} it should have`;
  const bytes = data.subarray(start);
  if (checksum([bytes]) !== header.checksum) return 'bytes that do not match their checksum';
  if (aboutChecksum(header.about) !== header.aboutChecksum) return 'a header that does not match its checksum';
  return { bytes, about: header.about };
}

let written = 0;
/**
 * A name no other writer uses at the same time: processes, and worker threads of one process (test files run
 * side by side in one; each engine's worker writes its own entries), may make the same entry at once.
 */
export function uniqueSuffix(): string {
  return `${process.pid}-${threadId}-${written++}`;
}

/** Writes an entry whole or not at all (a temporary file renamed over it): a reader never sees half of one. */
function writeEntry(file: string, magic: string, key: string, parts: Uint8Array[], about: unknown): void {
  const header: Header = { key, bytes: parts.reduce((n, p) => n + p.byteLength, 0), checksum: checksum(parts), aboutChecksum: aboutChecksum(about), about };
  let head = `${magic}${JSON.stringify(header)}`;
  // The bytes start at a multiple of 4, so that a reader can view them as numbers where they lie.
  head += ' '.repeat((4 - ((Buffer.byteLength(head) + 1) % 4)) % 4);
  const tmp = `${file}.${uniqueSuffix()}.tmp`;
  try {
    // Each part written from where it lies: no copy of a large entry into one buffer.
    const fd = openSync(tmp, 'w');
    try {
      writeSync(fd, `${head}\n`);
      for (const p of parts) writeSync(fd, p);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, file);
  } finally {
    rmSync(tmp, { force: true });
  }
}

/** One kind of entry: its folder under the cache, its first line, and how its value becomes bytes and back. */
export interface EntryKind<T> {
  folder: string;
  /** The entry's first line, with a version: a change of layout changes it, and older entries are refused. */
  magic: string;
  /** The value as parts of bytes (all but the last a multiple of 4 long) and what the header carries beside them. */
  encode(value: T): { parts: Uint8Array[]; about: unknown };
  /** The value back from its bytes, or why they cannot be one. */
  decode(bytes: Buffer, about: unknown): T | string;
}

/** The entry under `key` in `cacheDir`: its value, or why there is none to use ('missing' where there is none at all). */
export function lookUp<T>(kind: EntryKind<T>, cacheDir: string, key: string): { value: T } | { refused: string } {
  const found = readEntry(entryFile(kind, cacheDir, key), kind.magic, key);
  let value: T | string;
  try {
    value = typeof found === 'string' ? found : kind.decode(found.bytes, found.about);
  } catch (err) {
    // A header of the right checksum but a shape its kind does not read (made by other code): refused like the rest.
    value = `a header its kind cannot read (${(err as Error).message})`;
  }
  return typeof value === 'string' ? { refused: value } : { value };
}

/** Keeps `value` under `key` for the next process; a folder that cannot be written only loses it. */
export function keep<T>(kind: EntryKind<T>, cacheDir: string, key: string, value: T): void {
  try {
    mkdirSync(join(cacheDir, kind.folder), { recursive: true });
    const { parts, about } = kind.encode(value);
    writeEntry(entryFile(kind, cacheDir, key), kind.magic, key, parts, about);
  } catch {
    // A full or read-only disk: this process made it, the next one will again.
  }
}

/** The file names use the key's start. */
const entryFile = (kind: EntryKind<unknown>, cacheDir: string, key: string) => join(cacheDir, kind.folder, `${key.slice(0, 24)}.bin`);

/**
 * The value under `key` from `cacheDir` when it holds a sound entry for it, else made by `make` and kept there
 * for the next process. `key` is a hash of everything the value is made from.
 */
export function cached<T>(kind: EntryKind<T>, cacheDir: string | null, key: string, make: () => T): { value: T; outcome: CacheOutcome; refused?: string } {
  if (!cacheDir) return { value: make(), outcome: 'off' };
  const found = lookUp(kind, cacheDir, key);
  if ('value' in found) return { value: found.value, outcome: 'hit' };
  const made = make();
  keep(kind, cacheDir, key, made);
  return found.refused === 'missing' ? { value: made, outcome: 'miss' } : { value: made, outcome: 'rebuilt', refused: found.refused };
}
