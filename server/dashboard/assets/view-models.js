// The Models view (#/models): the checkpoints deployed to inference, with the model names a request sends and
// their OpenAI-compatible URLs.

import { dateTime, facts, h, statusBadge, table } from './dom.js';
import { overviewView } from './live.js';

export const modelsView = () =>
  overviewView(
    'Deployed models',
    (o) => o.models,
    (list) =>
      table(
        'models-table',
        [['Model'], ['Deployment'], ['Status'], ['Base model'], ["Checkpoints (a request's model)"], ['Inference URLs'], ['Deployed (UTC)']],
        list.map((m) =>
          h(
            'tr',
            { 'data-model-id': m.model_id, 'data-deployment-id': m.deployment_id },
            h('td', {}, h('span', { class: 'mono', text: m.model_id }), h('div', { class: 'muted', text: m.model_name })),
            h('td', {}, h('span', { class: 'mono', text: m.deployment_id }), h('div', { class: 'muted', text: m.instance_type_id })),
            h('td', {}, statusBadge(m.status)),
            h('td', { class: 'mono', text: m.base_model }),
            h(
              'td',
              {},
              h(
                'ul',
                { class: 'plain' },
                m.checkpoints.map((c) => h('li', { class: 'checkpoint-model' }, h('code', { text: c.model }), h('span', { class: 'muted', text: ` ${c.id}` }))),
              ),
            ),
            h(
              'td',
              {},
              facts([
                ['chat', h('code', { class: 'url-chat', text: m.inference.chat_completions })],
                ['completions', h('code', { class: 'url-completions', text: m.inference.completions })],
                ['models', h('code', { class: 'url-models', text: m.inference.models })],
                ['base_url', h('code', { class: 'url-base', text: m.inference.base_url })],
              ]),
            ),
            h('td', { text: dateTime(m.created_at) }),
          ),
        ),
        'No checkpoints deployed to inference yet: POST /v1/loops/checkpoints/deploy with sampler checkpoint ids (truss: loops checkpoints deploy).',
      ),
  );
