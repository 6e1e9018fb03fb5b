import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { failuresOf, runSoak, targetsOf } from './suite.js';

/**
 * `npm run soak`: the reliability suite at full size, its figures printed beside their targets
 * (or as JSON with --json); exit status 1 when a target is missed, 2 for a bad flag.
 */
const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
function readFlags() {
  try {
    return parseArgs({
      options: {
        seed: { type: 'string', default: 'soak' },
        cases: { type: 'string', default: '10000' },
        'raw-cases': { type: 'string', default: '1000' },
        kills: { type: 'string', default: '20' },
        waves: { type: 'string', default: '10,25,50' },
        'proxy-names': { type: 'string', default: '300' },
        'proxy-aborted': { type: 'string', default: '1100' },
        'no-machine-cases': { type: 'boolean', default: false },
        json: { type: 'boolean', default: false },
      },
    }).values;
  } catch (e) {
    console.error(
      `soak: ${(e as Error).message}\nusage: npm run soak -- [--seed S] [--cases N] [--raw-cases N] [--kills N] [--waves 10,25,50] [--proxy-names N] [--proxy-aborted N] [--no-machine-cases] [--json]`,
    );
    process.exit(2);
  }
}
const flags = readFlags();
const whole = (name: string, text: string, min: number): number => {
  const n = Number(text);
  if (!Number.isInteger(n) || n < min) {
    console.error(`soak: --${name} must be a whole number of at least ${min}, got '${text}'`);
    process.exit(2);
  }
  return n;
};
const waves = flags.waves.split(',').map((w) => whole('waves', w.trim(), 1));
const report = await runSoak({
  root,
  seed: flags.seed,
  cases: whole('cases', flags.cases, 1),
  rawCases: whole('raw-cases', flags['raw-cases'], 1),
  kills: whole('kills', flags.kills, 1),
  waves,
  machineCases: !flags['no-machine-cases'],
  proxyNames: whole('proxy-names', flags['proxy-names'], 1),
  proxyAborted: whole('proxy-aborted', flags['proxy-aborted'], 0),
});
const rows = targetsOf(report);
if (flags.json) {
  console.log(JSON.stringify({ ...report, targets: rows }, null, 2));
} else {
  console.log(`soak: seed '${report.options.seed}', ${report.seconds.toFixed(0)} s`);
  console.log(`fuzz: ${report.fuzz.cases} cases by family ${JSON.stringify(report.fuzz.byFamily)}; answers by status ${JSON.stringify(report.fuzz.byStatus)}`);
  console.log(`malformed HTTP: ${report.raw.cases} cases, ${report.raw.noAnswer} closed without an answer (cut off by the half-close)`);
  for (const w of report.load.waves)
    console.log(`load: wave of ${w.clients} clients x ${w.rounds} rounds in ${w.seconds.toFixed(1)} s, ${w.errors} errors, RSS after ${w.rssMb.toFixed(0)} MB`);
  for (const r of rows) console.log(`${r.met ? 'ok  ' : 'MISS'} ${r.figure}: ${r.value} (target ${r.target})`);
  if (report.machine) {
    const m = report.machine;
    console.log(
      `disk full: ${m.diskFull.how}; ${m.diskFull.spells} full spells, ${m.diskFull.acknowledged} checkpoints acknowledged, ${m.diskFull.answered507} answers 507`,
    );
    console.log(
      `corrupt database: ${m.corruptDatabase.cases} damages; corrupt checkpoint: ${m.corruptCheckpoint.cases} damages, ${m.corruptCheckpoint.probes} uses of them`,
    );
    console.log(`proxy: ${m.proxy.names} new names x 2 rounds, ${m.proxy.aborted} aborted CONNECTs a round, fd limit ${m.proxy.fdLimit}`);
    for (const c of m.requestMemory.cases)
      console.log(`request memory: ${c.case} (${c.expect}): ${c.outcome}, peak ${c.peakMb.toFixed(0)} MB, ${c.afterMb.toFixed(0)} MB after`);
  }
  for (const f of failuresOf(report)) console.log(`  ${f}`);
}
process.exit(rows.every((r) => r.met) ? 0 : 1);
