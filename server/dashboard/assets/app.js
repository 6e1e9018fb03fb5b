// The loops-mock dashboard: a framework-free page over the read-only data routes
// (/_mock/dashboard/*) and, with --admin, the admin API (/_mock/*). It polls the
// view on screen once a second; the journal view reads from a cursor, so each
// poll carries only the new entries. docs/dashboard.md says why it is built so.

import { niceTicks, tickLabels } from './ticks.js';

const POLL_MS = 1000;
const SURFACES = ['control', 'trainer', 'sampler', 'admin', 'hub', 'proxy', 'service'];
const main = document.getElementById('main');
const liveLine = document.getElementById('live');
const serverFacts = document.getElementById('server-facts');

// ---- talking to the server ------------------------------------------------

class HttpError extends Error {
  constructor(status, body) {
    super(body?.error?.message ?? `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, init = {}) {
  // X-Loops-Mock-Admin: the admin API refuses changes without it (or a JSON body), which no other site's page can send.
  const headers = { accept: 'application/json', 'x-loops-mock-admin': '1', ...(init.body !== undefined ? { 'content-type': 'application/json' } : {}) };
  const res = await fetch(path, { credentials: 'same-origin', ...init, headers });
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = { error: { type: 'bad_reply', message: text.slice(0, 300) } };
  }
  if (!res.ok) throw new HttpError(res.status, body);
  return body;
}

const post = (path, body) => api(path, { method: 'POST', body: body === undefined ? undefined : JSON.stringify(body) });

// ---- building the page (text nodes only: journal entries carry client input) ----

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  el.append(...flat(children));
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  el.append(...flat(children));
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = String(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

function flat(children) {
  return children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false).map((c) => (c instanceof Node ? c : document.createTextNode(String(c))));
}

// ---- words and numbers --------------------------------------------------------

const time = (iso) => (iso ? iso.slice(11, 23) : '');
const dateTime = (iso) => (iso ? `${iso.slice(0, 10)} ${iso.slice(11, 19)}` : '—');
const num = (x, digits = 4) => (typeof x === 'number' ? (Math.abs(x) >= 1e-3 || x === 0 ? Number(x.toPrecision(digits)).toString() : x.toExponential(2)) : '—');
function bytes(n) {
  if (typeof n !== 'number') return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let u = 0;
  while (n >= 1024 && u < units.length - 1) { n /= 1024; u++; }
  return `${u === 0 ? n : n.toFixed(1)} ${units[u]}`;
}

/** A status as a word with a colour: the colour repeats the word, never replaces it. */
function badge(text, tone) {
  return h('span', { class: `badge ${tone}`, text });
}
function statusTone(status) {
  if (['ACTIVE', 'done', 'COMPLETE'].includes(status)) return 'ok';
  if (['FAILED', 'DEPLOY_FAILED', 'UNHEALTHY', 'error', 'BUILD_FAILED'].includes(status)) return 'bad';
  if (['INACTIVE', 'STOPPED'].includes(status)) return 'none';
  return 'warn';
}
const statusBadge = (status) => badge(status, statusTone(status));
function httpBadge(status) {
  if (status === 0) return badge('dropped', 'bad');
  if (status < 300) return badge(String(status), 'ok');
  if (status === 408) return badge('408 floor', 'warn');
  if (status < 500) return badge(String(status), 'bad');
  return badge(String(status), 'bad');
}

const runLink = (id) => h('a', { href: `#/run/${encodeURIComponent(id)}`, class: 'mono', text: id });
const samplerLink = (id) => h('a', { href: `#/sampler/${encodeURIComponent(id)}`, class: 'mono', text: id });

function replicaWords(replicas) {
  if (!replicas.length) return 'no replicas';
  return replicas.map((r) => `replica ${r.replica}: v${r.policy_version}${r.syncing_version !== null ? ` (syncing v${r.syncing_version})` : ''}${r.paused ? ' (paused)' : ''}`).join('; ');
}

function table(id, columns, rows, empty) {
  if (!rows.length) return h('p', { class: 'empty', id, text: empty });
  return h('table', { id },
    h('thead', {}, h('tr', {}, columns.map(([label, cls]) => h('th', { scope: 'col', class: cls, text: label })))),
    h('tbody', {}, rows));
}

const facts = (pairs) => h('dl', { class: 'facts' }, pairs.map(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)]));

// ---- charts: hand-drawn SVG, two kinds (points over steps, versions over time) ----

/**
 * A chart frame: axes with ticks and labels, and scale functions for what is drawn in it.
 * x and y are { label, min, max, integer, unit }: tick labels carry the digits that tell them apart, then the unit.
 */
function frame({ id, caption, x, y, width = 640, height = 260 }) {
  const m = { l: 62, r: 18, t: 14, b: 44 };
  const xt = niceTicks(x.min, x.max, 6, x.integer);
  const yt = niceTicks(y.min, y.max, 5, y.integer);
  const sx = (v) => m.l + ((v - xt.lo) / (xt.hi - xt.lo || 1)) * (width - m.l - m.r);
  const sy = (v) => height - m.b - ((v - yt.lo) / (yt.hi - yt.lo || 1)) * (height - m.t - m.b);
  const xl = tickLabels(xt.ticks).map((l) => l + (x.unit ?? ''));
  const yl = tickLabels(yt.ticks).map((l) => l + (y.unit ?? ''));
  const svg = s('svg', { id, class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': caption },
    s('g', { class: 'grid' }, yt.ticks.map((t) => s('line', { x1: m.l, x2: width - m.r, y1: sy(t), y2: sy(t) }))),
    s('g', { class: 'axis' },
      s('line', { x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b }),
      s('line', { x1: m.l, x2: m.l, y1: m.t, y2: height - m.b }),
      xt.ticks.map((t, i) => [s('line', { x1: sx(t), x2: sx(t), y1: height - m.b, y2: height - m.b + 4 }), s('text', { class: 'tick-x', x: sx(t), y: height - m.b + 16, 'text-anchor': 'middle', text: xl[i] })]),
      yt.ticks.map((t, i) => [s('line', { x1: m.l - 4, x2: m.l, y1: sy(t), y2: sy(t) }), s('text', { class: 'tick-y', x: m.l - 7, y: sy(t) + 4, 'text-anchor': 'end', text: yl[i] })])),
    s('text', { class: 'axis-label', x: (m.l + width - m.r) / 2, y: height - 6, 'text-anchor': 'middle', text: x.label }),
    s('text', { class: 'axis-label', transform: `translate(14 ${(m.t + height - m.b) / 2}) rotate(-90)`, 'text-anchor': 'middle', text: y.label }));
  return { svg, sx, sy, plot: { left: m.l, right: width - m.r, top: m.t, bottom: height - m.b } };
}

function domain(values, fallback) {
  const finite = values.filter((v) => Number.isFinite(v));
  return finite.length ? { min: Math.min(...finite), max: Math.max(...finite) } : fallback;
}

/** Points over optimizer steps: one series per kind, each point a mark with its own tooltip. */
function stepChart({ id, caption, yLabel, series }) {
  const all = series.flatMap((se) => se.points);
  if (!all.length) return h('figure', {}, h('figcaption', { text: caption }), h('p', { class: 'empty', id, text: 'No points yet.' }));
  const xd = domain(all.map((p) => p.x), { min: 0, max: 1 });
  const yd = domain(all.map((p) => p.y), { min: 0, max: 1 });
  const f = frame({ id, caption: `${caption}: ${all.length} points`, x: { label: 'optimizer step', ...xd, integer: true }, y: { label: yLabel, ...yd } });
  for (const se of series) {
    const sorted = [...se.points].sort((a, b) => a.x - b.x);
    if (sorted.length > 1) f.svg.append(s('path', { class: se.lineClass, d: sorted.map((p, i) => `${i ? 'L' : 'M'}${f.sx(p.x)},${f.sy(p.y)}`).join('') }));
    for (const p of sorted) {
      const title = s('title', { text: p.title });
      const attrs = { class: se.pointClass, 'data-step': p.x, 'data-value': p.y };
      f.svg.append(se.shape === 'square'
        ? s('rect', { ...attrs, x: f.sx(p.x) - 4, y: f.sy(p.y) - 4, width: 8, height: 8 }, title)
        : s('circle', { ...attrs, cx: f.sx(p.x), cy: f.sy(p.y), r: 4 }, title));
    }
  }
  const legend = h('div', { class: 'legend' }, series.filter((se) => se.points.length).map((se) => h('span', {},
    h('span', {}, svgSwatch(se)), ` ${se.name} (${se.points.length})`)));
  return h('figure', {}, h('figcaption', { text: caption }), f.svg, legend);
}

function svgSwatch(se) {
  return s('svg', { width: 12, height: 12, 'aria-hidden': 'true' }, se.shape === 'square' ? s('rect', { class: se.pointClass, x: 2, y: 2, width: 8, height: 8 }) : s('circle', { class: se.pointClass, cx: 6, cy: 6, r: 4 }));
}

// ---- views ------------------------------------------------------------------

/** Re-renders a region only when its data changed: keyboard focus and scroll survive the polls. */
function region(el) {
  let last = '';
  return (data, render) => {
    const key = JSON.stringify(data);
    if (key === last) return;
    last = key;
    const focused = document.activeElement?.id;
    el.replaceChildren(...flat([render(data)]));
    if (focused) document.getElementById(focused)?.focus();
  };
}

let overview = null;
async function loadOverview() {
  overview = await api('/_mock/dashboard/overview');
  const scenario = overview.scenario ? ` · scenario ${overview.scenario.name ?? '(unnamed)'}` : '';
  serverFacts.textContent = `v${overview.version} · clock ${overview.clock.mode}, ${dateTime(overview.clock.now)} UTC · ${overview.admin ? 'admin API on' : 'read-only (no --admin)'}${scenario}`;
  return overview;
}

/** A list drawn from the overview: `pick` chooses its data, `render` draws it when that changed. */
function overviewView(title, pick, render) {
  const body = h('div');
  main.append(h('h2', { text: title }), h('section', {}, body));
  const show = region(body);
  return async () => show(pick(await loadOverview()), render);
}

const views = {
  runs: () => overviewView('Runs', (o) => {
    const samplers = new Map(o.samplers.map((x) => [x.id, x]));
    return o.runs.map((r) => [r, samplers.get(r.sampler_id)]);
  }, (rows) => table('runs-table',
      [['Run'], ['Status'], ['Base model'], ['Rank', 'num'], ['Policy version', 'num'], ['Session'], ['Sampler and replicas'], ['Created (UTC)'], ['Deactivated (UTC)']],
      rows.map(([r, sm]) => h('tr', { 'data-run-id': r.id },
        h('td', {}, runLink(r.id), r.name ? h('div', { class: 'muted', text: r.name }) : null),
        h('td', {}, statusBadge(r.status), r.inactive_reason ? h('div', { class: 'muted', text: r.inactive_reason }) : null),
        h('td', { class: 'mono', text: r.base_model }),
        h('td', { class: 'num', text: r.lora_rank }),
        h('td', { class: 'num', text: r.policy_version }),
        h('td', { class: 'mono', text: r.session_id }),
        h('td', {}, r.sampler_id ? [samplerLink(r.sampler_id), h('div', { class: 'muted', text: sm ? replicaWords(sm.replicas) : '' })] : '—'),
        h('td', { text: dateTime(r.created_at) }),
        h('td', { text: dateTime(r.deactivated_at) }))),
      'No runs yet: create one with POST /v1/loops/runs (or any Loops client).')),

  samplers: () => overviewView('Samplers', (o) => o.samplers, (list) => table('samplers-table',
      [['Sampler'], ['Status'], ['Base model'], ['Run'], ['Published version', 'num'], ['Replicas']],
      list.map((sm) => h('tr', { 'data-sampler-id': sm.id },
        h('td', {}, samplerLink(sm.id)),
        h('td', {}, statusBadge(sm.status)),
        h('td', { class: 'mono', text: sm.base_model }),
        h('td', {}, sm.run_id ? runLink(sm.run_id) : '—'),
        h('td', { class: 'num', text: sm.published_version }),
        h('td', { text: replicaWords(sm.replicas) }))),
      'No samplers yet: each run gets one, and POST /v1/loops/samplers makes more.')),

  models: () => overviewView('Deployed models', (o) => o.models, (list) => table('models-table',
      [['Model'], ['Deployment'], ['Status'], ['Base model'], ["Checkpoints (a request's model)"], ['Inference URLs'], ['Deployed (UTC)']],
      list.map((m) => h('tr', { 'data-model-id': m.model_id, 'data-deployment-id': m.deployment_id },
        h('td', {}, h('span', { class: 'mono', text: m.model_id }), h('div', { class: 'muted', text: m.model_name })),
        h('td', {}, h('span', { class: 'mono', text: m.deployment_id }), h('div', { class: 'muted', text: m.instance_type_id })),
        h('td', {}, statusBadge(m.status)),
        h('td', { class: 'mono', text: m.base_model }),
        h('td', {}, h('ul', { class: 'plain' }, m.checkpoints.map((c) => h('li', { class: 'checkpoint-model' },
          h('code', { text: c.model }), h('span', { class: 'muted', text: ` ${c.id}` }))))),
        h('td', {}, facts([
          ['chat', h('code', { class: 'url-chat', text: m.inference.chat_completions })],
          ['completions', h('code', { class: 'url-completions', text: m.inference.completions })],
          ['models', h('code', { class: 'url-models', text: m.inference.models })],
          ['base_url', h('code', { class: 'url-base', text: m.inference.base_url })],
        ])),
        h('td', { text: dateTime(m.created_at) }))),
      'No checkpoints deployed to inference yet: POST /v1/loops/checkpoints/deploy with sampler checkpoint ids (truss: loops checkpoints deploy).')),

  run: (id) => detailView(`/_mock/dashboard/runs/${encodeURIComponent(id)}`, renderRun),
  sampler: (id) => detailView(`/_mock/dashboard/samplers/${encodeURIComponent(id)}`, renderSampler),

  journal: journalView,
  rules: rulesView,
};

/** One record's page: its data route, drawn again when it changes. */
function detailView(path, render) {
  const body = h('div');
  main.append(body);
  const show = region(body);
  return async () => {
    await loadOverview();
    show(await api(path), render);
  };
}

function renderRun({ run, operations, checkpoints }) {
  const point = (e, kind) => ({ x: e.step, y: e.loss, title: `${kind} at step ${e.step}: loss ${num(e.loss, 6)} (${e.operation_id}, ${time(e.finished_at)})` });
  const train = operations.filter((e) => e.op === 'forward_backward' && typeof e.loss === 'number').map((e) => point(e, 'forward_backward'));
  const evals = operations.filter((e) => e.op === 'forward' && typeof e.loss === 'number').map((e) => point(e, 'forward (eval)'));
  const steps = operations.filter((e) => e.op === 'optim_step' && e.status === 'done');
  const afterStep = (e) => e.policy_version ?? e.step + 1;
  const grad = steps.filter((e) => typeof e.grad_norm === 'number').map((e) => ({ x: afterStep(e), y: e.grad_norm, title: `optim_step ${afterStep(e)}: grad norm ${num(e.grad_norm, 6)}` }));
  const lr = steps.filter((e) => typeof e.learning_rate === 'number').map((e) => ({ x: afterStep(e), y: e.learning_rate, title: `optim_step ${afterStep(e)}: learning rate ${num(e.learning_rate, 6)}` }));
  const newest = [...operations].reverse().slice(0, 300);
  return [
    h('h2', {}, 'Run ', h('span', { class: 'mono', text: run.id }), run.name ? h('span', { class: 'muted', text: ` · ${run.name}` }) : null),
    h('section', {}, facts([
      ['Status', [statusBadge(run.status), run.inactive_reason ? ` ${run.inactive_reason}` : '']],
      ['Base model', h('span', { class: 'mono', text: run.base_model })],
      ['LoRA rank', String(run.lora_rank)],
      ['Policy version', String(run.policy_version)],
      ['Session', h('span', { class: 'mono', text: run.session_id })],
      ['Sampler', run.sampler_id ? samplerLink(run.sampler_id) : '—'],
      ['Trainer URL', h('span', { class: 'mono', text: run.view.base_url })],
      ['Created (UTC)', dateTime(run.created_at)],
      ['Deactivated (UTC)', dateTime(run.deactivated_at)],
    ])),
    h('section', { class: 'charts' },
      stepChart({ id: 'loss-chart', caption: 'Loss per operation', yLabel: 'loss (per token, as returned)', series: [
        { name: 'forward_backward (train)', points: train, pointClass: 'point-train', lineClass: 'line-train', shape: 'circle' },
        { name: 'forward (eval)', points: evals, pointClass: 'point-eval', lineClass: 'line-eval', shape: 'square' },
      ] }),
      stepChart({ id: 'grad-chart', caption: 'Gradient norm per optim_step', yLabel: 'grad norm (L2, before clipping)', series: [
        { name: 'grad norm', points: grad, pointClass: 'point-grad', lineClass: 'line-grad', shape: 'circle' },
      ] }),
      stepChart({ id: 'lr-chart', caption: 'Learning rate per optim_step', yLabel: 'learning rate', series: [
        { name: 'learning rate', points: lr, pointClass: 'point-lr', lineClass: 'line-lr', shape: 'circle' },
      ] })),
    h('h3', { text: 'Checkpoints' }),
    h('section', {}, table('checkpoints',
      [['Checkpoint (path)'], ['Target'], ['Created (UTC)'], ['Size', 'num'], ['Files (download)']],
      checkpoints.map((c) => h('tr', {},
        h('td', { class: 'mono', text: c.path }),
        h('td', { text: c.target }),
        h('td', { text: dateTime(c.created_at) }),
        h('td', { class: 'num', text: bytes(c.size_bytes) }),
        h('td', {}, c.files.map((f) => h('div', {}, h('a', { class: 'download mono', href: f.href, download: f.relative_file_name, 'data-size': f.size_bytes, text: f.relative_file_name }), ` ${bytes(f.size_bytes)}`))))),
      'No checkpoints yet: save_state and save_weights_for_sampler make them.')),
    h('h3', { text: `Operations (${operations.length}${operations.length > newest.length ? `, newest ${newest.length} shown` : ''})` }),
    h('section', {}, table('operations',
      [['Finished (UTC)'], ['Operation'], ['State'], ['Step', 'num'], ['Duration (ms)', 'num'], ['Loss', 'num'], ['Error class'], ['Id']],
      newest.map((e) => h('tr', {},
        h('td', { text: time(e.finished_at) }),
        h('td', { class: 'mono', text: e.op }),
        h('td', {}, statusBadge(e.status)),
        h('td', { class: 'num', text: e.step }),
        h('td', { class: 'num', text: Math.round(e.duration_ms) }),
        h('td', { class: 'num', text: num(e.loss) }),
        h('td', { class: 'mono', text: e.error_class ?? '' }),
        h('td', { class: 'mono muted', text: e.operation_id }))),
      'No operations have finished on this run yet.')),
  ];
}

const REPLICA_COLOURS = ['#1f5fbf', '#c2410c', '#0f766e', '#a21caf', '#4d7c0f', '#be123c'];
const REPLICA_DASHES = ['', '6 3', '2 3', '8 3 2 3', '1 2', '10 4'];

function renderSampler({ sampler, created_at, events, requests, now }) {
  const t0 = Date.parse(created_at);
  const sec = (iso) => (Date.parse(iso) - t0) / 1000;
  const end = Math.max(sec(now), 1);
  const replicaCount = Math.max(sampler.replicas.length, ...events.filter((e) => e.kind === 'live').map((e) => e.replica + 1), 0);
  const publications = events.filter((e) => e.kind === 'published');
  const yOf = (r) => r.floor ?? r.policy_version ?? 0;
  const maxVersion = Math.max(1, ...events.map((e) => e.version), ...requests.map(yOf));
  const f = frame({ id: 'timeline', caption: `Sampler ${sampler.id}: ${publications.length} publications, ${replicaCount} replicas, ${requests.length} requests`, width: 900, height: 320,
    x: { label: 'seconds since the sampler was created (server clock)', min: 0, max: end, unit: 's' },
    y: { label: 'policy version', min: 0, max: maxVersion + 0.5, integer: true } });

  for (const p of publications) {
    const x = f.sx(sec(p.at));
    f.svg.append(s('line', { class: 'publication', x1: x, x2: x, y1: f.plot.top, y2: f.plot.bottom }),
      s('path', { class: 'publication-mark', 'data-version': p.version, d: `M${x - 5},${f.plot.top} L${x + 5},${f.plot.top} L${x},${f.plot.top + 8}Z` }, s('title', { text: `v${p.version} published at ${time(p.at)} (${p.path})` })),
      s('text', { x: x + 4, y: f.plot.top + 18, text: `v${p.version}` }));
  }
  for (let r = 0; r < replicaCount; r++) {
    const lives = events.filter((e) => e.kind === 'live' && e.replica === r);
    let d = `M${f.sx(0)},${f.sy(0)}`;
    let v = 0;
    for (const e of lives) { d += ` L${f.sx(sec(e.at))},${f.sy(v)} L${f.sx(sec(e.at))},${f.sy(e.version)}`; v = e.version; }
    d += ` L${f.sx(end)},${f.sy(v)}`;
    f.svg.append(s('path', { class: 'replica-line', 'data-replica': r, 'data-live-version': v, d, stroke: REPLICA_COLOURS[r % 6], 'stroke-dasharray': REPLICA_DASHES[r % 6] || null },
      s('title', { text: `replica ${r}: ${lives.map((e) => `v${e.version} live at ${time(e.at)}`).join(', ') || 'nothing published live yet'}` })));
  }
  for (const q of requests) {
    const x = f.sx(sec(q.time));
    const y = f.sy(yOf(q));
    const title = s('title', { text: `#${q.seq} ${q.op} at ${time(q.time)}: ${q.status}${q.floor !== null ? `, floor v${q.floor}` : ', no floor'}${q.policy_version !== null ? `, served by v${q.policy_version}` : ''}${q.retry_after ? `, Retry-After ${q.retry_after}s` : ''}` });
    if (q.status === 408) f.svg.append(s('path', { class: 'req-408', 'data-seq': q.seq, d: `M${x - 4},${y - 4} L${x + 4},${y + 4} M${x - 4},${y + 4} L${x + 4},${y - 4}` }, title));
    else f.svg.append(s('circle', { class: q.status < 300 ? 'req-ok' : 'req-other', 'data-seq': q.seq, cx: x, cy: y, r: 3.5 }, title));
  }
  const timeouts = requests.filter((q) => q.status === 408).length;
  const legend = h('div', { class: 'legend' },
    Array.from({ length: replicaCount }, (_, r) => h('span', {}, s('svg', { width: 22, height: 10, 'aria-hidden': 'true' }, s('line', { x1: 0, x2: 22, y1: 5, y2: 5, stroke: REPLICA_COLOURS[r % 6], 'stroke-width': 2, 'stroke-dasharray': REPLICA_DASHES[r % 6] || null })), ` replica ${r}: live version`)),
    h('span', {}, '▼ publication (version published)'),
    h('span', {}, s('svg', { width: 10, height: 10, 'aria-hidden': 'true' }, s('circle', { class: 'req-ok', cx: 5, cy: 5, r: 3.5 })), ' request served (at its floor, or the version that served it)'),
    h('span', {}, s('svg', { width: 10, height: 10, 'aria-hidden': 'true' }, s('path', { class: 'req-408', d: 'M1,1 L9,9 M1,9 L9,1' })), ' 408: no replica had reached the floor'));

  return [
    h('h2', {}, 'Sampler ', h('span', { class: 'mono', text: sampler.id })),
    h('section', {}, facts([
      ['Status', statusBadge(sampler.status)],
      ['Base model', h('span', { class: 'mono', text: sampler.base_model })],
      ['Run', sampler.run_id ? runLink(sampler.run_id) : '—'],
      ['Published version', String(sampler.published_version)],
      ['Replicas now', replicaWords(sampler.replicas)],
      ['Requests', `${requests.length}, of which ${timeouts} answered 408 (version floor not reached)`],
    ])),
    h('section', {}, h('figure', {}, h('figcaption', { text: 'Version-floor timeline' }), f.svg, legend)),
    h('h3', { text: 'Replicas' }),
    h('section', {}, table('replicas', [['Replica', 'num'], ['Live version', 'num'], ['Syncing', 'num'], ['Pending', 'num'], ['Sync delay (ms)', 'num'], ['Paused']],
      sampler.replicas.map((r) => h('tr', {}, h('td', { class: 'num', text: r.replica }), h('td', { class: 'num', text: r.policy_version }), h('td', { class: 'num', text: r.syncing_version ?? '—' }),
        h('td', { class: 'num', text: r.pending_version ?? '—' }), h('td', { class: 'num', text: r.sync_delay_ms }), h('td', { text: r.paused ? 'paused' : 'no' }))),
      'No replicas: the sampler is stopped.')),
    h('h3', { text: 'Sample requests (newest first)' }),
    h('section', {}, table('sampler-requests', [['#', 'num'], ['Time (UTC)'], ['Route'], ['X-Min-Policy-Version', 'num'], ['Answer'], ['Served by version', 'num'], ['Retry-After (s)', 'num']],
      [...requests].reverse().slice(0, 300).map((q) => h('tr', { 'data-status': q.status },
        h('td', { class: 'num', text: q.seq }), h('td', { text: time(q.time) }), h('td', { class: 'mono', text: q.op }), h('td', { class: 'num', text: q.floor ?? '—' }),
        h('td', {}, httpBadge(q.status)), h('td', { class: 'num', text: q.policy_version ?? '—' }), h('td', { class: 'num', text: q.retry_after ?? '' }))),
      'No sample requests yet.')),
  ];
}

// ---- the journal: a cursor, filters, a detail pane ---------------------------

const JOURNAL_ROWS = 1000;

function journalView() {
  const field = (label, input) => h('label', {}, label, input);
  const surface = h('select', { id: 'filter-surface', name: 'surface' }, h('option', { value: '', text: 'any' }), SURFACES.map((x) => h('option', { value: x, text: x })));
  const runId = h('input', { id: 'filter-run', name: 'run_id', placeholder: 'run id', size: 14 });
  const status = h('input', { id: 'filter-status', name: 'status', placeholder: '408 or 4xx', size: 8 });
  const text = h('input', { id: 'filter-q', name: 'q', type: 'search', placeholder: 'text anywhere', size: 18 });
  const paused = h('input', { id: 'filter-paused', type: 'checkbox' });
  const problem = h('p', { class: 'error-box', id: 'journal-problem', hidden: true });
  const note = h('p', { class: 'muted', id: 'journal-note' });
  const tbody = h('tbody');
  const detail = h('pre', { class: 'detail', id: 'journal-detail', tabindex: 0, text: 'Select a request (click, or Enter on a focused row) to see it whole.' });
  const rows = h('table', { id: 'journal-table' }, h('thead', {}, h('tr', {}, [['#', 'num'], ['Time (UTC)'], ['Surface'], ['Method'], ['Path'], ['Status'], ['Latency (ms)', 'num'], ['Op'], ['Fault']].map(([l, c]) => h('th', { scope: 'col', class: c, text: l })))), tbody);

  let since = 0;
  const restart = () => { since = 0; tbody.replaceChildren(); };
  let debounce;
  const later = () => { clearTimeout(debounce); debounce = setTimeout(restart, 300); };
  surface.addEventListener('change', restart);
  for (const input of [runId, status, text]) input.addEventListener('input', later);

  const select = (tr, entry) => {
    for (const other of tbody.querySelectorAll('tr[aria-selected="true"]')) other.setAttribute('aria-selected', 'false');
    tr.setAttribute('aria-selected', 'true');
    detail.textContent = `#${entry.seq} ${entry.method} ${entry.path}${entry.host ? ` (to ${entry.host})` : ''}\n\n${JSON.stringify(entry, null, 2)}`;
  };
  const rowOf = (e) => {
    const tr = h('tr', { class: 'clickable', tabindex: 0, 'data-seq': e.seq, 'data-status': e.status, 'aria-selected': 'false' },
      h('td', { class: 'num', text: e.seq }), h('td', { text: time(e.time) }), h('td', { text: e.surface }), h('td', { text: e.method }),
      h('td', { class: 'mono', text: e.path }), h('td', {}, httpBadge(e.status)), h('td', { class: 'num', text: num(e.latency_ms, 3) }),
      h('td', { class: 'mono', text: e.op ?? '' }), h('td', { text: e.fault ? `${e.fault.action} (${e.fault.id})` : '' }));
    tr.addEventListener('click', () => select(tr, e));
    tr.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); select(tr, e); }
      else if (ev.key === 'ArrowDown') { ev.preventDefault(); tr.nextElementSibling?.focus(); }
      else if (ev.key === 'ArrowUp') { ev.preventDefault(); tr.previousElementSibling?.focus(); }
    });
    return tr;
  };

  main.append(h('h2', { text: 'Journal' }),
    h('section', {}, h('form', { class: 'inline', role: 'search', onsubmit: (ev) => { ev.preventDefault(); restart(); } },
      field('Surface', surface), field('Run', runId), field('Status', status), field('Text', text),
      h('label', {}, 'Pause', paused)), problem, note),
    h('div', { class: 'journal-layout' }, h('section', { class: 'journal-scroll' }, rows), h('section', {}, h('h3', { text: 'Request' }), detail)));

  return async () => {
    await loadOverview();
    if (paused.checked) return;
    const query = new URLSearchParams({ since: String(since), limit: '500' });
    for (const [k, input] of [['surface', surface], ['run_id', runId], ['status', status], ['q', text]]) if (input.value.trim()) query.set(k, input.value.trim());
    let page;
    try {
      page = await api(`/_mock/dashboard/journal?${query}`);
      problem.hidden = true;
    } catch (e) {
      if (!(e instanceof HttpError) || e.status !== 400) throw e;
      problem.hidden = false;
      const hint = e.body?.error?.field === 'query.status' || /status/.test(e.message) ? ' Status takes a code (408) or a class (4xx).' : '';
      problem.textContent = `Filter refused: ${e.message}${hint}`;
      note.textContent = '';
      return;
    }
    // Newest on top; the oldest rows leave once there are too many.
    for (const e of page.entries) tbody.prepend(rowOf(e));
    while (tbody.children.length > JOURNAL_ROWS) tbody.lastElementChild.remove();
    since = page.next_since;
    note.textContent = `${tbody.children.length} shown${page.evicted ? `; ${page.evicted} older entries have left the journal's ring buffer` : ''}. The dashboard's own requests are not journaled.`;
  };
}

// ---- faults, progress rules, held operations, scenario; controls with --admin ----

function rulesView() {
  const body = h('div');
  const controls = h('section', { id: 'controls' });
  const result = h('div', { id: 'control-result', role: 'status' });
  main.append(h('h2', { text: 'Faults & scenario' }), body, h('h3', { text: 'Controls' }), controls);
  const show = region(body);
  let controlsFor = null;

  const act = async (what, call) => {
    result.replaceChildren();
    try {
      const reply = await call();
      result.replaceChildren(h('p', { class: 'muted', text: `${what}: done. ${JSON.stringify(reply).slice(0, 300)}` }));
    } catch (e) {
      result.replaceChildren(h('p', { class: 'error-box', text: `${what} refused (${e.status ?? 'network'}): ${e.message}` }));
    }
    await tickNow();
  };

  const buildControls = async (o) => {
    if (!o.admin) return [h('p', { class: 'muted', text: 'Read-only: start loops-mock with --admin to change fault rules, scenarios and the clock from here.' })];
    if (o.token_needed && !o.signed_in) return [h('p', { text: 'The admin API needs the admin token to change anything.' }), loginForm()];
    const { scenarios } = await api('/_mock/scenarios');
    const scenario = h('select', { id: 'scenario-name' }, scenarios.map((n) => h('option', { value: n, text: n })));
    const rule = h('textarea', { id: 'fault-json', 'aria-label': 'Fault rule as JSON', text: '{"match": {"surface": "sampler", "op": "sample"}, "action": {"type": "respond", "status": 503, "retry_after_s": 1}, "times": 1}' });
    const ms = h('input', { id: 'clock-ms', type: 'number', min: 0, value: 1000, size: 8 });
    return [
      h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); act(`Apply scenario ${scenario.value}`, () => post('/_mock/scenario', { name: scenario.value })); } },
        h('label', {}, 'Scenario', scenario), h('button', { type: 'submit', id: 'apply-scenario', text: 'Apply scenario' })),
      h('h3', { text: 'Add a fault rule (JSON, as POST /_mock/faults takes it)' }),
      h('form', { onsubmit: (ev) => {
        ev.preventDefault();
        let parsed;
        try { parsed = JSON.parse(rule.value); } catch (e) { result.replaceChildren(h('p', { class: 'error-box', text: `Not JSON: ${e.message}` })); return; }
        act('Add fault rule', () => post('/_mock/faults', parsed));
      } }, rule, h('div', { class: 'inline' }, h('button', { type: 'submit', id: 'add-fault', text: 'Add fault rule' }),
        h('button', { type: 'button', class: 'danger', text: 'Remove every fault rule', onclick: () => act('Remove every fault rule', () => api('/_mock/faults', { method: 'DELETE' })) }))),
      o.clock.mode === 'virtual'
        ? h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); act(`Advance the clock ${ms.value} ms`, () => post('/_mock/clock/advance', { ms: Number(ms.value) })); } },
          h('label', {}, 'Advance the virtual clock (ms)', ms), h('button', { type: 'submit', id: 'advance-clock', text: 'Advance' }))
        : h('p', { class: 'muted', text: 'The clock is real (start with --clock virtual to move time from here).' }),
      h('p', {}, h('button', { type: 'button', class: 'danger', id: 'reset-server', text: 'Reset the server (every record, checkpoint and rule)', onclick: () => {
        if (confirm('Reset loops-mock? Every run, sampler, checkpoint and rule is removed.')) act('Reset', () => post('/_mock/reset'));
      } })),
      result,
    ];
  };

  return async () => {
    const o = await loadOverview();
    const key = `${o.admin}/${o.signed_in}/${o.token_needed}/${o.clock.mode}`;
    if (key !== controlsFor) { controlsFor = key; controls.replaceChildren(...flat(await buildControls(o))); }
    const canAct = o.admin && (!o.token_needed || o.signed_in);
    show({ faults: o.faults, progress: o.progress, held: o.held, scenario: o.scenario, canAct }, (d) => [
      h('section', {}, facts([['Scenario applied', d.scenario ? `${d.scenario.name ?? '(unnamed)'} at ${dateTime(d.scenario.applied_at)} UTC` : 'none']])),
      h('h3', { text: 'Fault rules' }),
      h('section', {}, table('faults-table', [['Id'], ['Match'], ['Action'], ['Times left', 'num'], ['Matched', 'num'], ['Acted', 'num'], ['Description'], d.canAct ? [''] : null].filter(Boolean),
        d.faults.map((r) => h('tr', { 'data-fault-id': r.id },
          h('td', { class: 'mono', text: r.id }), h('td', { class: 'mono', text: JSON.stringify(r.match ?? {}) }), h('td', { class: 'mono', text: JSON.stringify(r.action) }),
          h('td', { class: 'num', text: r.remaining ?? '∞' }), h('td', { class: 'num', text: r.matched }), h('td', { class: 'num', text: r.fired }), h('td', { text: r.description ?? '' }),
          d.canAct ? h('td', {}, h('button', { type: 'button', text: 'Remove', 'aria-label': `Remove fault rule ${r.id}`, onclick: () => act(`Remove ${r.id}`, () => api(`/_mock/faults/${encodeURIComponent(r.id)}`, { method: 'DELETE' })) })) : null)),
        'No fault rules.')),
      h('h3', { text: 'Progress rules' }),
      h('section', {}, table('progress-table', [['Id'], ['Match'], ['Mode'], ['Polls / ms', 'num'], ['Applied', 'num'], ['Description']],
        d.progress.map((r) => h('tr', {}, h('td', { class: 'mono', text: r.id }), h('td', { class: 'mono', text: JSON.stringify(r.match ?? {}) }), h('td', { text: r.mode }),
          h('td', { class: 'num', text: r.polls ?? r.ms ?? '' }), h('td', { class: 'num', text: r.applied }), h('td', { text: r.description ?? '' }))),
        'No progress rules: operations finish as soon as they are computed.')),
      h('h3', { text: 'Held operations' }),
      h('section', {}, table('held-table', [['Operation'], ['Run'], ['Op'], ['Status'], ['Rule'], ['Polls seen', 'num'], d.canAct ? [''] : null].filter(Boolean),
        d.held.map((x) => h('tr', {}, h('td', { class: 'mono', text: x.operation_id }), h('td', {}, runLink(x.run_id)), h('td', { class: 'mono', text: x.op }), h('td', {}, statusBadge(x.status)),
          h('td', { class: 'mono', text: `${x.rule} (${x.mode})` }), h('td', { class: 'num', text: x.polls_seen }),
          d.canAct ? h('td', {}, h('button', { type: 'button', text: 'Release', 'aria-label': `Release ${x.operation_id}`, onclick: () => act(`Release ${x.operation_id}`, () => post(`/_mock/operations/${encodeURIComponent(x.operation_id)}/release`)) })) : null)),
        'No operation is held.')),
    ]);
  };
}

// ---- signing in ----------------------------------------------------------------

function loginForm() {
  const token = h('input', { id: 'admin-token', type: 'password', autocomplete: 'current-password', required: true, size: 30 });
  const problem = h('p', { class: 'error-box', id: 'login-problem', hidden: true });
  return h('form', { id: 'login', class: 'inline', onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await post('/_mock/ui/login', { token: token.value });
      route();
    } catch (e) {
      problem.hidden = false;
      problem.textContent = e.message;
    }
  } }, h('label', {}, "Admin token (the server's --admin-token)", token), h('button', { type: 'submit', text: 'Sign in' }), problem);
}

function showRefusal(e) {
  main.replaceChildren(h('h2', { text: 'Sign in' }), h('section', {},
    h('p', { id: 'refusal', text: e.message }),
    e.status === 401 ? loginForm() : null));
  liveLine.textContent = 'signed out';
}

// ---- routing and the poll loop ---------------------------------------------------

let refresh = null;
let generation = 0;
let timer = null;

function route() {
  const hash = location.hash || '#/runs';
  const [, name = 'runs', arg] = /^#\/([a-z]+)(?:\/(.+))?$/.exec(hash) ?? [];
  const make = views[name] ?? views.runs;
  for (const a of document.querySelectorAll('nav a')) {
    const current = a.dataset.view === name || (a.dataset.view === 'runs' && name === 'run') || (a.dataset.view === 'samplers' && name === 'sampler');
    if (current) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  generation++;
  clearTimeout(timer);
  main.replaceChildren();
  refresh = make(arg === undefined ? undefined : decodeURIComponent(arg));
  tick(generation);
}

async function tick(gen) {
  try {
    await refresh();
    if (gen !== generation) return;
    liveLine.classList.remove('offline');
    liveLine.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    if (gen !== generation) return;
    if (e instanceof HttpError && (e.status === 401 || e.status === 403)) { showRefusal(e); return; }
    if (e instanceof HttpError && e.status === 404) {
      main.replaceChildren(h('p', { class: 'error-box', id: 'not-found', text: e.message }));
      return;
    }
    liveLine.classList.add('offline');
    liveLine.textContent = `not updating: ${e.message}`;
  }
  if (gen === generation) timer = setTimeout(() => tick(gen), document.hidden ? POLL_MS * 5 : POLL_MS);
}

/** After a control acts: show its effect now, not at the next poll. */
async function tickNow() {
  clearTimeout(timer);
  await tick(generation);
}

window.addEventListener('hashchange', () => { route(); main.focus(); });
route();
