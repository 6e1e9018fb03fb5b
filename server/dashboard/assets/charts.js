// The dashboard's charts: hand-drawn SVG, two kinds: points over optimizer steps (a run's loss, gradient norm and
// learning rate) and versions over time (a sampler's publications, its replicas' live versions and the requests
// that met them). Axes come from ticks.js.

import { h, s, time } from './dom.js';
import { niceTicks, tickLabels } from './ticks.js';

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
  const svg = s(
    'svg',
    { id, class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': caption },
    s(
      'g',
      { class: 'grid' },
      yt.ticks.map((t) => s('line', { x1: m.l, x2: width - m.r, y1: sy(t), y2: sy(t) })),
    ),
    s(
      'g',
      { class: 'axis' },
      s('line', { x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b }),
      s('line', { x1: m.l, x2: m.l, y1: m.t, y2: height - m.b }),
      xt.ticks.map((t, i) => [
        s('line', { x1: sx(t), x2: sx(t), y1: height - m.b, y2: height - m.b + 4 }),
        s('text', { class: 'tick-x', x: sx(t), y: height - m.b + 16, 'text-anchor': 'middle', text: xl[i] }),
      ]),
      yt.ticks.map((t, i) => [
        s('line', { x1: m.l - 4, x2: m.l, y1: sy(t), y2: sy(t) }),
        s('text', { class: 'tick-y', x: m.l - 7, y: sy(t) + 4, 'text-anchor': 'end', text: yl[i] }),
      ]),
    ),
    s('text', { class: 'axis-label', x: (m.l + width - m.r) / 2, y: height - 6, 'text-anchor': 'middle', text: x.label }),
    s('text', { class: 'axis-label', transform: `translate(14 ${(m.t + height - m.b) / 2}) rotate(-90)`, 'text-anchor': 'middle', text: y.label }),
  );
  return { svg, sx, sy, plot: { left: m.l, right: width - m.r, top: m.t, bottom: height - m.b } };
}

function domain(values, fallback) {
  const finite = values.filter((v) => Number.isFinite(v));
  return finite.length ? { min: Math.min(...finite), max: Math.max(...finite) } : fallback;
}

/** Points over optimizer steps: one series per kind, each point a mark with its own tooltip. */
export function stepChart({ id, caption, yLabel, series }) {
  const all = series.flatMap((se) => se.points);
  if (!all.length) return h('figure', {}, h('figcaption', { text: caption }), h('p', { class: 'empty', id, text: 'No points yet.' }));
  const xd = domain(
    all.map((p) => p.x),
    { min: 0, max: 1 },
  );
  const yd = domain(
    all.map((p) => p.y),
    { min: 0, max: 1 },
  );
  const f = frame({ id, caption: `${caption}: ${all.length} points`, x: { label: 'optimizer step', ...xd, integer: true }, y: { label: yLabel, ...yd } });
  for (const se of series) {
    const sorted = [...se.points].sort((a, b) => a.x - b.x);
    if (sorted.length > 1) f.svg.append(s('path', { class: se.lineClass, d: sorted.map((p, i) => `${i ? 'L' : 'M'}${f.sx(p.x)},${f.sy(p.y)}`).join('') }));
    for (const p of sorted) {
      const title = s('title', { text: p.title });
      const attrs = { class: se.pointClass, 'data-step': p.x, 'data-value': p.y };
      f.svg.append(
        se.shape === 'square'
          ? s('rect', { ...attrs, x: f.sx(p.x) - 4, y: f.sy(p.y) - 4, width: 8, height: 8 }, title)
          : s('circle', { ...attrs, cx: f.sx(p.x), cy: f.sy(p.y), r: 4 }, title),
      );
    }
  }
  const legend = h(
    'div',
    { class: 'legend' },
    series.filter((se) => se.points.length).map((se) => h('span', {}, h('span', {}, svgSwatch(se)), ` ${se.name} (${se.points.length})`)),
  );
  return h('figure', {}, h('figcaption', { text: caption }), f.svg, legend);
}

function svgSwatch(se) {
  return s(
    'svg',
    { width: 12, height: 12, 'aria-hidden': 'true' },
    se.shape === 'square' ? s('rect', { class: se.pointClass, x: 2, y: 2, width: 8, height: 8 }) : s('circle', { class: se.pointClass, cx: 6, cy: 6, r: 4 }),
  );
}

const REPLICA_COLOURS = ['#1f5fbf', '#c2410c', '#0f766e', '#a21caf', '#4d7c0f', '#be123c'];
const REPLICA_DASHES = ['', '6 3', '2 3', '8 3 2 3', '1 2', '10 4'];

/**
 * A sampler's version-floor timeline: each publication a dropped line, each replica a step line of the version
 * live on it (colour and dash tell them apart), each request a mark at its floor (a cross where it met a 408).
 */
export function versionTimeline({ sampler, created_at, events, requests, now }) {
  const t0 = Date.parse(created_at);
  const sec = (iso) => (Date.parse(iso) - t0) / 1000;
  const end = Math.max(sec(now), 1);
  const replicaCount = Math.max(sampler.replicas.length, ...events.filter((e) => e.kind === 'live').map((e) => e.replica + 1), 0);
  const publications = events.filter((e) => e.kind === 'published');
  const yOf = (r) => r.floor ?? r.policy_version ?? 0;
  const maxVersion = Math.max(1, ...events.map((e) => e.version), ...requests.map(yOf));
  const f = frame({
    id: 'timeline',
    caption: `Sampler ${sampler.id}: ${publications.length} publications, ${replicaCount} replicas, ${requests.length} requests`,
    width: 900,
    height: 320,
    x: { label: 'seconds since the sampler was created (server clock)', min: 0, max: end, unit: 's' },
    y: { label: 'policy version', min: 0, max: maxVersion + 0.5, integer: true },
  });

  for (const p of publications) {
    const x = f.sx(sec(p.at));
    f.svg.append(
      s('line', { class: 'publication', x1: x, x2: x, y1: f.plot.top, y2: f.plot.bottom }),
      s(
        'path',
        { class: 'publication-mark', 'data-version': p.version, d: `M${x - 5},${f.plot.top} L${x + 5},${f.plot.top} L${x},${f.plot.top + 8}Z` },
        s('title', { text: `v${p.version} published at ${time(p.at)} (${p.path})` }),
      ),
      s('text', { x: x + 4, y: f.plot.top + 18, text: `v${p.version}` }),
    );
  }
  for (let r = 0; r < replicaCount; r++) {
    const lives = events.filter((e) => e.kind === 'live' && e.replica === r);
    let d = `M${f.sx(0)},${f.sy(0)}`;
    let v = 0;
    for (const e of lives) {
      d += ` L${f.sx(sec(e.at))},${f.sy(v)} L${f.sx(sec(e.at))},${f.sy(e.version)}`;
      v = e.version;
    }
    d += ` L${f.sx(end)},${f.sy(v)}`;
    f.svg.append(
      s(
        'path',
        {
          class: 'replica-line',
          'data-replica': r,
          'data-live-version': v,
          d,
          stroke: REPLICA_COLOURS[r % 6],
          'stroke-dasharray': REPLICA_DASHES[r % 6] || null,
        },
        s('title', { text: `replica ${r}: ${lives.map((e) => `v${e.version} live at ${time(e.at)}`).join(', ') || 'nothing published live yet'}` }),
      ),
    );
  }
  for (const q of requests) {
    const x = f.sx(sec(q.time));
    const y = f.sy(yOf(q));
    const title = s('title', {
      text: `#${q.seq} ${q.op} at ${time(q.time)}: ${q.status}${q.floor !== null ? `, floor v${q.floor}` : ', no floor'}${q.policy_version !== null ? `, served by v${q.policy_version}` : ''}${q.retry_after ? `, Retry-After ${q.retry_after}s` : ''}`,
    });
    if (q.status === 408)
      f.svg.append(s('path', { class: 'req-408', 'data-seq': q.seq, d: `M${x - 4},${y - 4} L${x + 4},${y + 4} M${x - 4},${y + 4} L${x + 4},${y - 4}` }, title));
    else f.svg.append(s('circle', { class: q.status < 300 ? 'req-ok' : 'req-other', 'data-seq': q.seq, cx: x, cy: y, r: 3.5 }, title));
  }
  const legend = h(
    'div',
    { class: 'legend' },
    Array.from({ length: replicaCount }, (_, r) =>
      h(
        'span',
        {},
        s(
          'svg',
          { width: 22, height: 10, 'aria-hidden': 'true' },
          s('line', { x1: 0, x2: 22, y1: 5, y2: 5, stroke: REPLICA_COLOURS[r % 6], 'stroke-width': 2, 'stroke-dasharray': REPLICA_DASHES[r % 6] || null }),
        ),
        ` replica ${r}: live version`,
      ),
    ),
    h('span', {}, '▼ publication (version published)'),
    h(
      'span',
      {},
      s('svg', { width: 10, height: 10, 'aria-hidden': 'true' }, s('circle', { class: 'req-ok', cx: 5, cy: 5, r: 3.5 })),
      ' request served (at its floor, or the version that served it)',
    ),
    h(
      'span',
      {},
      s('svg', { width: 10, height: 10, 'aria-hidden': 'true' }, s('path', { class: 'req-408', d: 'M1,1 L9,9 M1,9 L9,1' })),
      ' 408: no replica had reached the floor',
    ),
  );
  return h('figure', {}, h('figcaption', { text: 'Version-floor timeline' }), f.svg, legend);
}
