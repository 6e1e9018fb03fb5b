// The Runs view (#/runs): every run with its sampler, and one run's page (#/run/ID): its losses, gradient norm
// and learning rate over steps, its checkpoints with download links, and its operations.

import { stepChart } from './charts.js';
import { bytes, dateTime, facts, h, num, replicaWords, runLink, samplerLink, statusBadge, table, time } from './dom.js';
import { detailView, overviewView } from './live.js';

export const runsView = () =>
  overviewView(
    'Runs',
    (o) => {
      const samplers = new Map(o.samplers.map((x) => [x.id, x]));
      return o.runs.map((r) => [r, samplers.get(r.sampler_id)]);
    },
    (rows) =>
      table(
        'runs-table',
        [
          ['Run'],
          ['Status'],
          ['Base model'],
          ['Rank', 'num'],
          ['Policy version', 'num'],
          ['Session'],
          ['Sampler and replicas'],
          ['Created (UTC)'],
          ['Deactivated (UTC)'],
        ],
        rows.map(([r, sm]) =>
          h(
            'tr',
            { 'data-run-id': r.id },
            h('td', {}, runLink(r.id), r.name ? h('div', { class: 'muted', text: r.name }) : null),
            h('td', {}, statusBadge(r.status), r.inactive_reason ? h('div', { class: 'muted', text: r.inactive_reason }) : null),
            h('td', { class: 'mono', text: r.base_model }),
            h('td', { class: 'num', text: r.lora_rank }),
            h('td', { class: 'num', text: r.policy_version }),
            h('td', { class: 'mono', text: r.session_id }),
            h('td', {}, r.sampler_id ? [samplerLink(r.sampler_id), h('div', { class: 'muted', text: sm ? replicaWords(sm.replicas) : '' })] : '—'),
            h('td', { text: dateTime(r.created_at) }),
            h('td', { text: dateTime(r.deactivated_at) }),
          ),
        ),
        'No runs yet: create one with POST /v1/loops/runs (or any Loops client).',
      ),
  );

export const runView = (id) => detailView(`/_mock/dashboard/runs/${encodeURIComponent(id)}`, renderRun);

function renderRun({ run, operations, checkpoints }) {
  const point = (e, kind) => ({ x: e.step, y: e.loss, title: `${kind} at step ${e.step}: loss ${num(e.loss, 6)} (${e.operation_id}, ${time(e.finished_at)})` });
  const train = operations.filter((e) => e.op === 'forward_backward' && typeof e.loss === 'number').map((e) => point(e, 'forward_backward'));
  const evals = operations.filter((e) => e.op === 'forward' && typeof e.loss === 'number').map((e) => point(e, 'forward (eval)'));
  const steps = operations.filter((e) => e.op === 'optim_step' && e.status === 'done');
  const afterStep = (e) => e.policy_version ?? e.step + 1;
  const grad = steps
    .filter((e) => typeof e.grad_norm === 'number')
    .map((e) => ({ x: afterStep(e), y: e.grad_norm, title: `optim_step ${afterStep(e)}: grad norm ${num(e.grad_norm, 6)}` }));
  const lr = steps
    .filter((e) => typeof e.learning_rate === 'number')
    .map((e) => ({ x: afterStep(e), y: e.learning_rate, title: `optim_step ${afterStep(e)}: learning rate ${num(e.learning_rate, 6)}` }));
  const newest = [...operations].reverse().slice(0, 300);
  return [
    h('h2', {}, 'Run ', h('span', { class: 'mono', text: run.id }), run.name ? h('span', { class: 'muted', text: ` · ${run.name}` }) : null),
    h(
      'section',
      {},
      facts([
        ['Status', [statusBadge(run.status), run.inactive_reason ? ` ${run.inactive_reason}` : '']],
        ['Base model', h('span', { class: 'mono', text: run.base_model })],
        ['LoRA rank', String(run.lora_rank)],
        ['Policy version', String(run.policy_version)],
        ['Session', h('span', { class: 'mono', text: run.session_id })],
        ['Sampler', run.sampler_id ? samplerLink(run.sampler_id) : '—'],
        ['Trainer URL', h('span', { class: 'mono', text: run.view.base_url })],
        ['Created (UTC)', dateTime(run.created_at)],
        ['Deactivated (UTC)', dateTime(run.deactivated_at)],
      ]),
    ),
    h(
      'section',
      { class: 'charts' },
      stepChart({
        id: 'loss-chart',
        caption: 'Loss per operation',
        yLabel: 'loss (per token, as returned)',
        series: [
          { name: 'forward_backward (train)', points: train, pointClass: 'point-train', lineClass: 'line-train', shape: 'circle' },
          { name: 'forward (eval)', points: evals, pointClass: 'point-eval', lineClass: 'line-eval', shape: 'square' },
        ],
      }),
      stepChart({
        id: 'grad-chart',
        caption: 'Gradient norm per optim_step',
        yLabel: 'grad norm (L2, before clipping)',
        series: [{ name: 'grad norm', points: grad, pointClass: 'point-grad', lineClass: 'line-grad', shape: 'circle' }],
      }),
      stepChart({
        id: 'lr-chart',
        caption: 'Learning rate per optim_step',
        yLabel: 'learning rate',
        series: [{ name: 'learning rate', points: lr, pointClass: 'point-lr', lineClass: 'line-lr', shape: 'circle' }],
      }),
    ),
    h('h3', { text: 'Checkpoints' }),
    h(
      'section',
      {},
      table(
        'checkpoints',
        [['Checkpoint (path)'], ['Target'], ['Created (UTC)'], ['Size', 'num'], ['Files (download)']],
        checkpoints.map((c) =>
          h(
            'tr',
            {},
            h('td', { class: 'mono', text: c.path }),
            h('td', { text: c.target }),
            h('td', { text: dateTime(c.created_at) }),
            h('td', { class: 'num', text: bytes(c.size_bytes) }),
            h(
              'td',
              {},
              c.files.map((f) =>
                h(
                  'div',
                  {},
                  h('a', { class: 'download mono', href: f.href, download: f.relative_file_name, 'data-size': f.size_bytes, text: f.relative_file_name }),
                  ` ${bytes(f.size_bytes)}`,
                ),
              ),
            ),
          ),
        ),
        'No checkpoints yet: save_state and save_weights_for_sampler make them.',
      ),
    ),
    h('h3', { text: `Operations (${operations.length}${operations.length > newest.length ? `, newest ${newest.length} shown` : ''})` }),
    h(
      'section',
      {},
      table(
        'operations',
        [['Finished (UTC)'], ['Operation'], ['State'], ['Step', 'num'], ['Duration (ms)', 'num'], ['Loss', 'num'], ['Error class'], ['Id']],
        newest.map((e) =>
          h(
            'tr',
            {},
            h('td', { text: time(e.finished_at) }),
            h('td', { class: 'mono', text: e.op }),
            h('td', {}, statusBadge(e.status)),
            h('td', { class: 'num', text: e.step }),
            h('td', { class: 'num', text: Math.round(e.duration_ms) }),
            h('td', { class: 'num', text: num(e.loss) }),
            h('td', { class: 'mono', text: e.error_class ?? '' }),
            h('td', { class: 'mono muted', text: e.operation_id }),
          ),
        ),
        'No operations have finished on this run yet.',
      ),
    ),
  ];
}
