// Loaded into a server process (node --import) where the soak cannot mount a small tmpfs: a disk of
// LOOPS_MOCK_SOAK_DISK_BYTES that the process's writes fill. Checkpoint files (fs.writeSync) and the
// database's write statements spend it; past it they fail as a full disk does (ENOSPC, SQLITE_FULL).
// A filler file at LOOPS_MOCK_SOAK_DISK_FILLER takes its size off the room while it exists: deleting it
// is freeing space. Nothing is freed otherwise (a real disk would give a removed folder's bytes back).
import fs from 'node:fs';
import { createRequire, syncBuiltinESMExports } from 'node:module';

const capacity = Number(process.env.LOOPS_MOCK_SOAK_DISK_BYTES);
const filler = process.env.LOOPS_MOCK_SOAK_DISK_FILLER;
let used = 0;

function spend(bytes) {
  const held = filler && fs.existsSync(filler) ? fs.statSync(filler).size : 0;
  if (used + held + bytes > capacity) return false;
  used += bytes;
  return true;
}

const writeSync = fs.writeSync;
fs.writeSync = function (fd, data, ...rest) {
  const length = typeof data === 'string' ? Buffer.byteLength(data) : typeof rest[1] === 'number' ? rest[1] : data.byteLength;
  if (!spend(length)) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
  return writeSync.call(this, fd, data, ...rest);
};
syncBuiltinESMExports();

// The server's own better-sqlite3 (the CommonJS cache is one per process).
const Database = createRequire(import.meta.url)('better-sqlite3');
const statement = Object.getPrototypeOf(new Database(':memory:').prepare('SELECT 1'));
const run = statement.run;
statement.run = function (...args) {
  if (!this.reader && !/^(BEGIN|SAVEPOINT|RELEASE|ROLLBACK)/.test(this.source)) {
    const bytes = 64 + args.reduce((n, a) => n + (typeof a === 'string' ? Buffer.byteLength(a) : 8), 0);
    if (!spend(bytes)) throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
  }
  return run.apply(this, args);
};
