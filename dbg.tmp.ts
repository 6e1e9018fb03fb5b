import { readFixtures, replayFixture } from './conformance/replay.js';
import { startServer } from './server/index.js';
const s = await startServer({ port: 0, logLevel: 'silent' });
for (const f of readFixtures('sdk-fixtures')) { if (!['task-cleanup','task-rl-step'].includes(f.name)) continue; const r = await replayFixture(f, { server: s.url, key: 'k' }); console.log(f.name, r.differences.slice(0, 8)); }
await s.close();
