// The Samplers view (#/samplers): every sampler with its replicas, and one sampler's page (#/sampler/ID): when
// each version was published and went live on each replica, and the requests that met them.

import { versionTimeline } from './charts.js';
import { facts, h, httpBadge, replicaWords, runLink, samplerLink, statusBadge, table, time } from './dom.js';
import { detailView, overviewView } from './live.js';

export const samplersView = () =>
  overviewView(
    'Samplers',
    (o) => o.samplers,
    (list) =>
      table(
        'samplers-table',
        [['Sampler'], ['Status'], ['Base model'], ['Run'], ['Published version', 'num'], ['Replicas']],
        list.map((sm) =>
          h(
            'tr',
            { 'data-sampler-id': sm.id },
            h('td', {}, samplerLink(sm.id)),
            h('td', {}, statusBadge(sm.status)),
            h('td', { class: 'mono', text: sm.base_model }),
            h('td', {}, sm.run_id ? runLink(sm.run_id) : '—'),
            h('td', { class: 'num', text: sm.published_version }),
            h('td', { text: replicaWords(sm.replicas) }),
          ),
        ),
        'No samplers yet: each run gets one, and POST /v1/loops/samplers makes more.',
      ),
  );

export const samplerView = (id) => detailView(`/_mock/dashboard/samplers/${encodeURIComponent(id)}`, renderSampler);

/** A sampler's page: its facts, its version-floor timeline, its replicas and the sample requests it met. */
function renderSampler(data) {
  const { sampler, requests } = data;
  const timeouts = requests.filter((q) => q.status === 408).length;
  return [
    h('h2', {}, 'Sampler ', h('span', { class: 'mono', text: sampler.id })),
    h(
      'section',
      {},
      facts([
        ['Status', statusBadge(sampler.status)],
        ['Base model', h('span', { class: 'mono', text: sampler.base_model })],
        ['Run', sampler.run_id ? runLink(sampler.run_id) : '—'],
        ['Published version', String(sampler.published_version)],
        ['Replicas now', replicaWords(sampler.replicas)],
        ['Requests', `${requests.length}, of which ${timeouts} answered 408 (version floor not reached)`],
      ]),
    ),
    h('section', {}, versionTimeline(data)),
    h('h3', { text: 'Replicas' }),
    h(
      'section',
      {},
      table(
        'replicas',
        [['Replica', 'num'], ['Live version', 'num'], ['Syncing', 'num'], ['Pending', 'num'], ['Sync delay (ms)', 'num'], ['Paused']],
        sampler.replicas.map((r) =>
          h(
            'tr',
            {},
            h('td', { class: 'num', text: r.replica }),
            h('td', { class: 'num', text: r.policy_version }),
            h('td', { class: 'num', text: r.syncing_version ?? '—' }),
            h('td', { class: 'num', text: r.pending_version ?? '—' }),
            h('td', { class: 'num', text: r.sync_delay_ms }),
            h('td', { text: r.paused ? 'paused' : 'no' }),
          ),
        ),
        'No replicas: the sampler is stopped.',
      ),
    ),
    h('h3', { text: 'Sample requests (newest first)' }),
    h(
      'section',
      {},
      table(
        'sampler-requests',
        [['#', 'num'], ['Time (UTC)'], ['Route'], ['X-Min-Policy-Version', 'num'], ['Answer'], ['Served by version', 'num'], ['Retry-After (s)', 'num']],
        [...requests]
          .reverse()
          .slice(0, 300)
          .map((q) =>
            h(
              'tr',
              { 'data-status': q.status },
              h('td', { class: 'num', text: q.seq }),
              h('td', { text: time(q.time) }),
              h('td', { class: 'mono', text: q.op }),
              h('td', { class: 'num', text: q.floor ?? '—' }),
              h('td', {}, httpBadge(q.status)),
              h('td', { class: 'num', text: q.policy_version ?? '—' }),
              h('td', { class: 'num', text: q.retry_after ?? '' }),
            ),
          ),
        'No sample requests yet.',
      ),
    ),
  ];
}
