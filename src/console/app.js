// The console's entry: sign-in, the hash router (#/view?filters), refreshes and actions.

import { api, ApiError, getKey, setKey, clearKey } from './api.js';
import { h, byId, confirmDialog, showBanner, hideBanner, showStatus, hideStatus } from './dom.js';
import { views } from './views.js';

let session = null;
let timer = 0;
let renderCount = 0;

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const q = raw.indexOf('?');
  const name = q < 0 ? raw : raw.slice(0, q);
  const params = new URLSearchParams(q < 0 ? '' : raw.slice(q + 1));
  return { name: Object.hasOwn(views, name) ? name : 'overview', params };
}

function hashFor(name, params) {
  const query = new URLSearchParams(params || {}).toString();
  return `#/${name}${query ? `?${query}` : ''}`;
}

function go(name, params) {
  const target = hashFor(name, params);
  if (location.hash === target) render();
  else location.hash = target;
}

function report(message, ok) {
  showStatus(message, ok);
}

// Confirm, run, report, show the view again. run resolves to the success message.
async function act(question, run) {
  if (!(await confirmDialog(question))) return;
  try {
    report(await run(), true);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      signOut('The key is no longer accepted; sign in again.');
      return;
    }
    report(err.message || String(err), false);
  }
  await render({ keepStatus: true });
}

function markNav(name) {
  const current = name === 'job' ? 'jobs' : name;
  for (const link of byId('nav').querySelectorAll('a')) {
    if (link.dataset.view === current) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

async function render(options = {}) {
  if (!session) return;
  clearTimeout(timer);
  const mine = ++renderCount;
  const { name, params } = parseHash();
  const view = views[name];
  const canAct = session.role === 'operator';
  const ctx = { session, params, canAct, go, refresh: () => render(), act, report };
  if (!options.keepStatus && !options.auto) hideStatus();
  markNav(name);
  document.title = `${view.title} · rebound console`;

  const root = byId('view');
  const head = h('div', { class: 'view-head' },
    h('h1', {}, view.title),
    h('button', { type: 'button', class: 'quiet', onclick: () => render({ keepStatus: true }) }, 'Refresh'));
  if (!options.auto) {
    root.replaceChildren(head, h('p', { class: 'muted loading' }, 'Loading…'));
  }
  root.setAttribute('aria-busy', 'true');
  let body;
  try {
    body = await view.load(ctx);
    if (mine !== renderCount) return;
    hideBanner();
  } catch (err) {
    if (mine !== renderCount) return;
    if (err instanceof ApiError && err.status === 401) {
      signOut('The key is no longer accepted; sign in again.');
      return;
    }
    showBanner(`${view.title}: ${err.message || String(err)}`);
    body = options.auto ? null : h('p', { class: 'muted' }, 'Could not load this view. Refresh to try again.');
  } finally {
    if (mine === renderCount) root.removeAttribute('aria-busy');
  }
  if (body) root.replaceChildren(head, body);
  if (view.autoRefreshMs) {
    timer = setTimeout(() => render({ auto: true }), view.autoRefreshMs);
  }
}

function showSignedIn() {
  byId('sign-in').hidden = true;
  byId('view').hidden = false;
  byId('nav').hidden = false;
  byId('who').hidden = false;
  const where = [session.store ? `store ${session.store}` : '', session.server_id ? `server ${session.server_id}` : '']
    .filter(Boolean).join(', ');
  byId('who-text').replaceChildren(
    h('strong', {}, String(session.name ?? '')),
    ' ',
    h('span', { class: `role role-${session.role === 'operator' ? 'operator' : 'viewer'}` }, String(session.role)),
    where ? h('span', { class: 'muted where' }, where) : null);
}

function showSignIn(message) {
  clearTimeout(timer);
  renderCount++;
  byId('view').hidden = true;
  byId('view').replaceChildren();
  byId('nav').hidden = true;
  byId('who').hidden = true;
  byId('sign-in').hidden = false;
  hideBanner();
  const error = byId('sign-in-error');
  error.textContent = message || '';
  error.hidden = !message;
  const input = byId('api-key');
  input.value = '';
  input.focus();
}

function signOut(message) {
  session = null;
  clearKey();
  hideStatus();
  showSignIn(message);
}

async function signIn(key) {
  const answer = await api('GET', '/v1/console/session', { key });
  if (!answer || (answer.role !== 'operator' && answer.role !== 'viewer')) {
    throw new ApiError(403, 'forbidden', 'This key is neither an operator nor a viewer key.');
  }
  return answer;
}

async function onSignIn(event) {
  event.preventDefault();
  const input = byId('api-key');
  const button = event.target.querySelector('button[type="submit"]');
  const key = input.value.trim();
  const error = byId('sign-in-error');
  if (!key) {
    error.textContent = 'Enter an API key.';
    error.hidden = false;
    return;
  }
  button.disabled = true;
  try {
    session = await signIn(key);
    setKey(key);
    input.value = '';
    error.hidden = true;
    showSignedIn();
    if (!location.hash || location.hash === '#' || location.hash === '#/') location.hash = '#/overview';
    else render();
  } catch (err) {
    session = null;
    error.textContent = err.status === 401 || err.status === 403
      ? `Not signed in: ${err.message}`
      : `Could not sign in: ${err.message}`;
    error.hidden = false;
    input.select();
  } finally {
    button.disabled = false;
  }
}

async function start() {
  byId('sign-in-form').addEventListener('submit', onSignIn);
  byId('sign-out').addEventListener('click', () => signOut(''));
  window.addEventListener('hashchange', () => render());
  // A link to the view already shown loads it again (the hash does not change, so no hashchange).
  document.querySelector('.top').addEventListener('click', (event) => {
    const link = event.target.closest('a[href^="#"]');
    if (link && link.getAttribute('href') === location.hash) {
      event.preventDefault();
      render();
    }
  });
  const key = getKey();
  if (!key) {
    showSignIn('');
    return;
  }
  try {
    session = await signIn(key);
    showSignedIn();
    render();
  } catch (err) {
    if (err.status === 401 || err.status === 403) signOut('The stored key is no longer accepted; sign in again.');
    else showSignIn(`Could not reach the server: ${err.message}`);
  }
}

start();
