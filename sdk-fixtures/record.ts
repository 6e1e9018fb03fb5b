/**
 * Regenerates sdk-fixtures/*.json: `npm run fixtures:record`. Each flow runs
 * through `loops-mock record` in front of a fresh loops-mock: the conformance
 * driver's four tasks (the guides' flows) and the scripted error flows.
 * Point LOOPS_FIXTURES_UPSTREAM (and LOOPS_FIXTURES_KEY) at another endpoint
 * to record it instead.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { taskInputs, TASK_NAMES, TASKS, type TaskName } from '../conformance/tasks.js';
import { startServer } from '../server/index.js';
import { startRecorder } from '../server/record/recorder.js';
import { caller, ERROR_FLOWS } from './error-flows.js';

export const FIXTURES_DIR = dirname(fileURLToPath(import.meta.url));
const DRIVER = resolve(FIXTURES_DIR, '../conformance/drivers/python/driver.py');

/** Records one conformance task, run by the reference driver through a recorder, as `task-<name>`. */
export async function recordTask(upstream: string, key: string, out: string, task: TaskName): Promise<string> {
  const recorder = await startRecorder({ upstream, out, flow: `task-${task}`, description: TASKS[task] });
  const dir = mkdtempSync(join(tmpdir(), 'record-'));
  writeFileSync(join(dir, 'input.json'), JSON.stringify(taskInputs()[task]));
  try {
    const code = await new Promise<number | null>((done) => {
      const child = spawn('python3', [DRIVER], {
        // The cleanup task fails by design and prints its traceback: keep the output quiet.
        stdio: ['ignore', 'ignore', 'ignore'],
        env: {
          ...process.env,
          LOOPS_BASE_URL: recorder.url,
          BASETEN_MANAGEMENT_API_URL_OVERRIDE: recorder.url,
          BASETEN_API_KEY: key,
          LOOPS_CONFORMANCE_TASK: task,
          LOOPS_CONFORMANCE_INPUT: join(dir, 'input.json'),
          LOOPS_CONFORMANCE_OUTPUT: join(dir, 'output.json'),
        },
      });
      child.on('close', done);
    });
    if (code !== 0 && task !== 'cleanup') throw new Error(`the driver failed the ${task} task while recording (exit ${code})`);
    return recorder.file;
  } finally {
    await recorder.close();
  }
}

/** Records one scripted error flow. */
export async function recordErrorFlow(upstream: string, key: string, out: string, name: string): Promise<string> {
  const flow = ERROR_FLOWS[name]!;
  const recorder = await startRecorder({ upstream, out, flow: name, description: flow.description });
  try {
    await flow.run(caller(recorder.url, key));
    return recorder.file;
  } finally {
    await recorder.close();
  }
}

async function main(): Promise<void> {
  const external = process.env.LOOPS_FIXTURES_UPSTREAM;
  const server = external ? undefined : await startServer({ port: 0, logLevel: 'silent' });
  const upstream = external ?? server!.url;
  try {
    // Against the local mock each flow gets its own key (its own organisation), so lists hold only its runs.
    const keyFor = (flow: string) => process.env.LOOPS_FIXTURES_KEY ?? `fixtures-key-${flow}`;
    for (const task of TASK_NAMES) process.stdout.write(`${await recordTask(upstream, keyFor(task), FIXTURES_DIR, task)}\n`);
    for (const name of Object.keys(ERROR_FLOWS)) process.stdout.write(`${await recordErrorFlow(upstream, keyFor(name), FIXTURES_DIR, name)}\n`);
  } finally {
    await server?.close();
  }
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
