// The dashboard's live data: the read-only data routes (/_mock/dashboard/*) and, with --admin, the admin API
// (/_mock/*); the overview every view reads; and the poll loop, which draws the view on screen again once a
// second (every five while the tab is hidden). docs/dashboard.md says why it is built so.

import { dateTime, h, main, region } from './dom.js';

const POLL_MS = 1000;
const liveLine = document.getElementById('live');
const serverFacts = document.getElementById('server-facts');

export class HttpError extends Error {
  constructor(status, body) {
    super(body?.error?.message ?? `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export async function api(path, init = {}) {
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

export const post = (path, body) => api(path, { method: 'POST', body: body === undefined ? undefined : JSON.stringify(body) });

export async function loadOverview() {
  const overview = await api('/_mock/dashboard/overview');
  const scenario = overview.scenario ? ` · scenario ${overview.scenario.name ?? '(unnamed)'}` : '';
  serverFacts.textContent = `v${overview.version} · clock ${overview.clock.mode}, ${dateTime(overview.clock.now)} UTC · ${overview.admin ? 'admin API on' : 'read-only (no --admin)'}${scenario}`;
  return overview;
}

/** A list drawn from the overview: `pick` chooses its data, `render` draws it when that changed. */
export function overviewView(title, pick, render) {
  const body = h('div');
  main.append(h('h2', { text: title }), h('section', {}, body));
  const show = region(body);
  return async () => show(pick(await loadOverview()), render);
}

/** One record's page: its data route, drawn again when it changes. */
export function detailView(path, render) {
  const body = h('div');
  main.append(body);
  const show = region(body);
  return async () => {
    await loadOverview();
    show(await api(path), render);
  };
}

// ---- routing and the poll loop ---------------------------------------------------

let views = {};
let onRefused = () => {};
let refresh = null;
let generation = 0;
let timer = null;

/**
 * Starts the page: `viewsByName` maps a hash route (#/runs, #/run/ID) to a function that draws the view and
 * returns its refresh; `refused` draws the sign-in page when the server answers 401 or 403.
 */
export function startPolling(viewsByName, refused) {
  views = viewsByName;
  onRefused = refused;
  window.addEventListener('hashchange', () => {
    route();
    main.focus();
  });
  route();
}

/** Draws the view the location names, and polls it. */
export function route() {
  const hash = location.hash || '#/runs';
  const [, name = 'runs', arg] = /^#\/([a-z]+)(?:\/(.+))?$/.exec(hash) ?? [];
  const make = views[name] ?? views.runs;
  for (const a of document.querySelectorAll('nav a')) {
    const current = a.dataset.view === name || (a.dataset.view === 'runs' && name === 'run') || (a.dataset.view === 'samplers' && name === 'sampler');
    if (current) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
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
    if (e instanceof HttpError && (e.status === 401 || e.status === 403)) {
      onRefused(e);
      liveLine.textContent = 'signed out';
      return;
    }
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
export async function tickNow() {
  clearTimeout(timer);
  await tick(generation);
}
