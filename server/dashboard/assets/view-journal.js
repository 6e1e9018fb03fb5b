// The Journal view (#/journal): every request the server answered, read from a cursor (each poll brings only
// the new entries), with filters and a pane showing one request whole.

import { h, httpBadge, main, num, time } from './dom.js';
import { api, HttpError, loadOverview } from './live.js';

const SURFACES = ['control', 'trainer', 'sampler', 'admin', 'hub', 'proxy', 'service'];
const JOURNAL_ROWS = 1000;

export function journalView() {
  const field = (label, input) => h('label', {}, label, input);
  const surface = h(
    'select',
    { id: 'filter-surface', name: 'surface' },
    h('option', { value: '', text: 'any' }),
    SURFACES.map((x) => h('option', { value: x, text: x })),
  );
  const runId = h('input', { id: 'filter-run', name: 'run_id', placeholder: 'run id', size: 14 });
  const status = h('input', { id: 'filter-status', name: 'status', placeholder: '408 or 4xx', size: 8 });
  const text = h('input', { id: 'filter-q', name: 'q', type: 'search', placeholder: 'text anywhere', size: 18 });
  const paused = h('input', { id: 'filter-paused', type: 'checkbox' });
  const problem = h('p', { class: 'error-box', id: 'journal-problem', hidden: true });
  const note = h('p', { class: 'muted', id: 'journal-note' });
  const tbody = h('tbody');
  const detail = h('pre', { class: 'detail', id: 'journal-detail', tabindex: 0, text: 'Select a request (click, or Enter on a focused row) to see it whole.' });
  const rows = h(
    'table',
    { id: 'journal-table' },
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        [['#', 'num'], ['Time (UTC)'], ['Surface'], ['Method'], ['Path'], ['Status'], ['Latency (ms)', 'num'], ['Op'], ['Fault']].map(([l, c]) =>
          h('th', { scope: 'col', class: c, text: l }),
        ),
      ),
    ),
    tbody,
  );

  let since = 0;
  const restart = () => {
    since = 0;
    tbody.replaceChildren();
  };
  let debounce;
  const later = () => {
    clearTimeout(debounce);
    debounce = setTimeout(restart, 300);
  };
  surface.addEventListener('change', restart);
  for (const input of [runId, status, text]) input.addEventListener('input', later);

  const select = (tr, entry) => {
    for (const other of tbody.querySelectorAll('tr[aria-selected="true"]')) other.setAttribute('aria-selected', 'false');
    tr.setAttribute('aria-selected', 'true');
    detail.textContent = `#${entry.seq} ${entry.method} ${entry.path}${entry.host ? ` (to ${entry.host})` : ''}\n\n${JSON.stringify(entry, null, 2)}`;
  };
  const rowOf = (e) => {
    const tr = h(
      'tr',
      { class: 'clickable', tabindex: 0, 'data-seq': e.seq, 'data-status': e.status, 'aria-selected': 'false' },
      h('td', { class: 'num', text: e.seq }),
      h('td', { text: time(e.time) }),
      h('td', { text: e.surface }),
      h('td', { text: e.method }),
      h('td', { class: 'mono', text: e.path }),
      h('td', {}, httpBadge(e.status)),
      h('td', { class: 'num', text: num(e.latency_ms, 3) }),
      h('td', { class: 'mono', text: e.op ?? '' }),
      h('td', { text: e.fault ? `${e.fault.action} (${e.fault.id})` : '' }),
    );
    tr.addEventListener('click', () => select(tr, e));
    tr.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        select(tr, e);
      } else if (ev.key === 'ArrowDown') {
        ev.preventDefault();
        tr.nextElementSibling?.focus();
      } else if (ev.key === 'ArrowUp') {
        ev.preventDefault();
        tr.previousElementSibling?.focus();
      }
    });
    return tr;
  };

  main.append(
    h('h2', { text: 'Journal' }),
    h(
      'section',
      {},
      h(
        'form',
        {
          class: 'inline',
          role: 'search',
          onsubmit: (ev) => {
            ev.preventDefault();
            restart();
          },
        },
        field('Surface', surface),
        field('Run', runId),
        field('Status', status),
        field('Text', text),
        h('label', {}, 'Pause', paused),
      ),
      problem,
      note,
    ),
    h('div', { class: 'journal-layout' }, h('section', { class: 'journal-scroll' }, rows), h('section', {}, h('h3', { text: 'Request' }), detail)),
  );

  return async () => {
    await loadOverview();
    if (paused.checked) return;
    const query = new URLSearchParams({ since: String(since), limit: '500' });
    for (const [k, input] of [
      ['surface', surface],
      ['run_id', runId],
      ['status', status],
      ['q', text],
    ])
      if (input.value.trim()) query.set(k, input.value.trim());
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
