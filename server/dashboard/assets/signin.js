// Signing the dashboard in with the admin token (the server's --admin-token): the form, and the page shown when
// the server refuses the dashboard's requests.

import { h, main } from './dom.js';
import { post, route } from './live.js';

export function loginForm() {
  const token = h('input', { id: 'admin-token', type: 'password', autocomplete: 'current-password', required: true, size: 30 });
  const problem = h('p', { class: 'error-box', id: 'login-problem', hidden: true });
  return h(
    'form',
    {
      id: 'login',
      class: 'inline',
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          await post('/_mock/ui/login', { token: token.value });
          route();
        } catch (e) {
          problem.hidden = false;
          problem.textContent = e.message;
        }
      },
    },
    h('label', {}, "Admin token (the server's --admin-token)", token),
    h('button', { type: 'submit', text: 'Sign in' }),
    problem,
  );
}

/** What the page shows when the server answers 401 or 403: why, and the sign-in form where a token helps. */
export function showRefusal(e) {
  main.replaceChildren(h('h2', { text: 'Sign in' }), h('section', {}, h('p', { id: 'refusal', text: e.message }), e.status === 401 ? loginForm() : null));
}
