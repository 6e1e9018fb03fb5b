// The dashboard's page building: elements from text nodes only (journal entries carry client input), the words
// and numbers it shows, and the tables, badges and links every view draws with.

export const main = document.getElementById('main');

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  el.append(...flat(children));
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
export function s(tag, attrs = {}, ...children) {
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

export function flat(children) {
  return children
    .flat(Infinity)
    .filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c))));
}

export const time = (iso) => (iso ? iso.slice(11, 23) : '');
export const dateTime = (iso) => (iso ? `${iso.slice(0, 10)} ${iso.slice(11, 19)}` : '—');
export const num = (x, digits = 4) =>
  typeof x === 'number' ? (Math.abs(x) >= 1e-3 || x === 0 ? Number(x.toPrecision(digits)).toString() : x.toExponential(2)) : '—';
export function bytes(n) {
  if (typeof n !== 'number') return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let u = 0;
  while (n >= 1024 && u < units.length - 1) {
    n /= 1024;
    u++;
  }
  return `${u === 0 ? n : n.toFixed(1)} ${units[u]}`;
}

/** A status as a word with a colour: the colour repeats the word, never replaces it. */
export function badge(text, tone) {
  return h('span', { class: `badge ${tone}`, text });
}
function statusTone(status) {
  if (['ACTIVE', 'done', 'COMPLETE'].includes(status)) return 'ok';
  if (['FAILED', 'DEPLOY_FAILED', 'UNHEALTHY', 'error', 'BUILD_FAILED'].includes(status)) return 'bad';
  if (['INACTIVE', 'STOPPED'].includes(status)) return 'none';
  return 'warn';
}
export const statusBadge = (status) => badge(status, statusTone(status));
export function httpBadge(status) {
  if (status === 0) return badge('dropped', 'bad');
  if (status < 300) return badge(String(status), 'ok');
  if (status === 408) return badge('408 floor', 'warn');
  if (status < 500) return badge(String(status), 'bad');
  return badge(String(status), 'bad');
}

export const runLink = (id) => h('a', { href: `#/run/${encodeURIComponent(id)}`, class: 'mono', text: id });
export const samplerLink = (id) => h('a', { href: `#/sampler/${encodeURIComponent(id)}`, class: 'mono', text: id });

export function replicaWords(replicas) {
  if (!replicas.length) return 'no replicas';
  return replicas
    .map(
      (r) => `replica ${r.replica}: v${r.policy_version}${r.syncing_version !== null ? ` (syncing v${r.syncing_version})` : ''}${r.paused ? ' (paused)' : ''}`,
    )
    .join('; ');
}

export function table(id, columns, rows, empty) {
  if (!rows.length) return h('p', { class: 'empty', id, text: empty });
  return h(
    'table',
    { id },
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        columns.map(([label, cls]) => h('th', { scope: 'col', class: cls, text: label })),
      ),
    ),
    h('tbody', {}, rows),
  );
}

export const facts = (pairs) =>
  h(
    'dl',
    { class: 'facts' },
    pairs.map(([k, v]) => [h('dt', { text: k }), h('dd', {}, v)]),
  );

/** Re-renders a region only when its data changed: keyboard focus and scroll survive the polls. */
export function region(el) {
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
