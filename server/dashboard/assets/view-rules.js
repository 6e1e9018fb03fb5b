// The Faults & scenario view (#/rules): fault rules, progress rules, held operations and the scenario applied;
// with --admin, the controls that change them (they call the admin API).

import { dateTime, facts, flat, h, main, region, runLink, statusBadge, table } from './dom.js';
import { api, loadOverview, post, tickNow } from './live.js';
import { loginForm } from './signin.js';

export function rulesView() {
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
    if (!o.admin)
      return [h('p', { class: 'muted', text: 'Read-only: start loops-mock with --admin to change fault rules, scenarios and the clock from here.' })];
    if (o.token_needed && !o.signed_in) return [h('p', { text: 'The admin API needs the admin token to change anything.' }), loginForm()];
    const { scenarios } = await api('/_mock/scenarios');
    const scenario = h(
      'select',
      { id: 'scenario-name' },
      scenarios.map((n) => h('option', { value: n, text: n })),
    );
    const rule = h('textarea', {
      id: 'fault-json',
      'aria-label': 'Fault rule as JSON',
      text: '{"match": {"surface": "sampler", "op": "sample"}, "action": {"type": "respond", "status": 503, "retry_after_s": 1}, "times": 1}',
    });
    const ms = h('input', { id: 'clock-ms', type: 'number', min: 0, value: 1000, size: 8 });
    return [
      h(
        'form',
        {
          class: 'inline',
          onsubmit: (ev) => {
            ev.preventDefault();
            act(`Apply scenario ${scenario.value}`, () => post('/_mock/scenario', { name: scenario.value }));
          },
        },
        h('label', {}, 'Scenario', scenario),
        h('button', { type: 'submit', id: 'apply-scenario', text: 'Apply scenario' }),
      ),
      h('h3', { text: 'Add a fault rule (JSON, as POST /_mock/faults takes it)' }),
      h(
        'form',
        {
          onsubmit: (ev) => {
            ev.preventDefault();
            let parsed;
            try {
              parsed = JSON.parse(rule.value);
            } catch (e) {
              result.replaceChildren(h('p', { class: 'error-box', text: `Not JSON: ${e.message}` }));
              return;
            }
            act('Add fault rule', () => post('/_mock/faults', parsed));
          },
        },
        rule,
        h(
          'div',
          { class: 'inline' },
          h('button', { type: 'submit', id: 'add-fault', text: 'Add fault rule' }),
          h('button', {
            type: 'button',
            class: 'danger',
            text: 'Remove every fault rule',
            onclick: () => act('Remove every fault rule', () => api('/_mock/faults', { method: 'DELETE' })),
          }),
        ),
      ),
      o.clock.mode === 'virtual'
        ? h(
            'form',
            {
              class: 'inline',
              onsubmit: (ev) => {
                ev.preventDefault();
                act(`Advance the clock ${ms.value} ms`, () => post('/_mock/clock/advance', { ms: Number(ms.value) }));
              },
            },
            h('label', {}, 'Advance the virtual clock (ms)', ms),
            h('button', { type: 'submit', id: 'advance-clock', text: 'Advance' }),
          )
        : h('p', { class: 'muted', text: 'The clock is real (start with --clock virtual to move time from here).' }),
      h(
        'p',
        {},
        h('button', {
          type: 'button',
          class: 'danger',
          id: 'reset-server',
          text: 'Reset the server (every record, checkpoint and rule)',
          onclick: () => {
            if (confirm('Reset loops-mock? Every run, sampler, checkpoint and rule is removed.')) act('Reset', () => post('/_mock/reset'));
          },
        }),
      ),
      result,
    ];
  };

  return async () => {
    const o = await loadOverview();
    const key = `${o.admin}/${o.signed_in}/${o.token_needed}/${o.clock.mode}`;
    if (key !== controlsFor) {
      controlsFor = key;
      controls.replaceChildren(...flat(await buildControls(o)));
    }
    const canAct = o.admin && (!o.token_needed || o.signed_in);
    show({ faults: o.faults, progress: o.progress, held: o.held, scenario: o.scenario, canAct }, (d) => [
      h('section', {}, facts([['Scenario applied', d.scenario ? `${d.scenario.name ?? '(unnamed)'} at ${dateTime(d.scenario.applied_at)} UTC` : 'none']])),
      h('h3', { text: 'Fault rules' }),
      h(
        'section',
        {},
        table(
          'faults-table',
          [['Id'], ['Match'], ['Action'], ['Times left', 'num'], ['Matched', 'num'], ['Acted', 'num'], ['Description'], d.canAct ? [''] : null].filter(Boolean),
          d.faults.map((r) =>
            h(
              'tr',
              { 'data-fault-id': r.id },
              h('td', { class: 'mono', text: r.id }),
              h('td', { class: 'mono', text: JSON.stringify(r.match ?? {}) }),
              h('td', { class: 'mono', text: JSON.stringify(r.action) }),
              h('td', { class: 'num', text: r.remaining ?? '∞' }),
              h('td', { class: 'num', text: r.matched }),
              h('td', { class: 'num', text: r.fired }),
              h('td', { text: r.description ?? '' }),
              d.canAct
                ? h(
                    'td',
                    {},
                    h('button', {
                      type: 'button',
                      text: 'Remove',
                      'aria-label': `Remove fault rule ${r.id}`,
                      onclick: () => act(`Remove ${r.id}`, () => api(`/_mock/faults/${encodeURIComponent(r.id)}`, { method: 'DELETE' })),
                    }),
                  )
                : null,
            ),
          ),
          'No fault rules.',
        ),
      ),
      h('h3', { text: 'Progress rules' }),
      h(
        'section',
        {},
        table(
          'progress-table',
          [['Id'], ['Match'], ['Mode'], ['Polls / ms', 'num'], ['Applied', 'num'], ['Description']],
          d.progress.map((r) =>
            h(
              'tr',
              {},
              h('td', { class: 'mono', text: r.id }),
              h('td', { class: 'mono', text: JSON.stringify(r.match ?? {}) }),
              h('td', { text: r.mode }),
              h('td', { class: 'num', text: r.polls ?? r.ms ?? '' }),
              h('td', { class: 'num', text: r.applied }),
              h('td', { text: r.description ?? '' }),
            ),
          ),
          'No progress rules: operations finish as soon as they are computed.',
        ),
      ),
      h('h3', { text: 'Held operations' }),
      h(
        'section',
        {},
        table(
          'held-table',
          [['Operation'], ['Run'], ['Op'], ['Status'], ['Rule'], ['Polls seen', 'num'], d.canAct ? [''] : null].filter(Boolean),
          d.held.map((x) =>
            h(
              'tr',
              {},
              h('td', { class: 'mono', text: x.operation_id }),
              h('td', {}, runLink(x.run_id)),
              h('td', { class: 'mono', text: x.op }),
              h('td', {}, statusBadge(x.status)),
              h('td', { class: 'mono', text: `${x.rule} (${x.mode})` }),
              h('td', { class: 'num', text: x.polls_seen }),
              d.canAct
                ? h(
                    'td',
                    {},
                    h('button', {
                      type: 'button',
                      text: 'Release',
                      'aria-label': `Release ${x.operation_id}`,
                      onclick: () => act(`Release ${x.operation_id}`, () => post(`/_mock/operations/${encodeURIComponent(x.operation_id)}/release`)),
                    }),
                  )
                : null,
            ),
          ),
          'No operation is held.',
        ),
      ),
    ]);
  };
}
