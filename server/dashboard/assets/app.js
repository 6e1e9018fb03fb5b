// The loops-mock dashboard: a framework-free page over the read-only data routes (/_mock/dashboard/*) and, with
// --admin, the admin API (/_mock/*), served as ES modules with no build step: live.js talks to the server and
// polls the view on screen, dom.js and charts.js draw, and each view-*.js is one view. docs/dashboard.md says
// why it is built so.

import { startPolling } from './live.js';
import { showRefusal } from './signin.js';
import { journalView } from './view-journal.js';
import { modelsView } from './view-models.js';
import { rulesView } from './view-rules.js';
import { runsView, runView } from './view-runs.js';
import { samplersView, samplerView } from './view-samplers.js';

startPolling(
  {
    runs: runsView,
    samplers: samplersView,
    models: modelsView,
    run: runView,
    sampler: samplerView,
    journal: journalView,
    rules: rulesView,
  },
  showRefusal,
);
