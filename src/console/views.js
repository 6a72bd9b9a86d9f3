// The console's views. Each has a title and load(ctx), which fetches and returns the view's body.
// ctx: session, params (URLSearchParams of the hash), canAct (operator), go(view, params),
// refresh(), act(question, run): confirm, run, report, refresh.

import { api, jobPath, withQuery } from './api.js';
import {
  h, s, badge, table, facts, formatTime, formatAgo, formatDuration, formatNumber, prettyJson,
  secondsBetween, tenantLabel, clockTime,
} from './dom.js';

const STATUSES = ['queued', 'running', 'succeeded', 'failed', 'expired', 'cancelled'];
const CALLBACK_STATES = ['none', 'pending', 'delivered', 'failed'];
const PRIORITIES = ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'];

// --- shared pieces --------------------------------------------------------------------------

function select(name, label, values, current, anyLabel = 'Any') {
  return h('label', { class: 'field' }, h('span', {}, label),
    h('select', { name },
      h('option', { value: '' }, anyLabel),
      values.map(([value, text]) => h('option', { value, selected: value === current }, text))));
}

function textInput(name, label, current) {
  return h('label', { class: 'field' }, h('span', {}, label),
    h('input', { type: 'text', name, value: current || '', autocomplete: 'off', spellcheck: 'false' }));
}

// The filter form: on Apply, the view is shown again with the form's values in the hash.
function filterForm(ctx, view, controls) {
  const form = h('form', { class: 'filters', novalidate: true },
    controls, h('button', { type: 'submit', class: 'primary' }, 'Apply'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const params = {};
    for (const [name, value] of new FormData(form)) if (value !== '') params[name] = String(value);
    ctx.go(view, params);
  });
  return form;
}

function tenantSelect(ctx) {
  const tenants = Array.isArray(ctx.session.tenants) ? ctx.session.tenants : [];
  if (!tenants.length) return null;
  return select('tenant', 'Tenant', tenants.map((t) => [String(t), String(t)]),
    ctx.params.get('tenant') || '', 'All tenants');
}

function showTenants(ctx) {
  return Array.isArray(ctx.session.tenants) && ctx.session.tenants.length > 0;
}

function tenantQuery(tenant) {
  return tenant ? { tenant } : {};
}

function jobLink(job) {
  const params = new URLSearchParams({ id: String(job.id) });
  if (job.tenant) params.set('tenant', String(job.tenant));
  return h('a', { href: `#/job?${params}`, class: 'mono' }, String(job.id));
}

function ofTenant(job) {
  return job.tenant ? ` of tenant "${job.tenant}"` : '';
}

function cancelButton(ctx, job) {
  return h('button', {
    type: 'button',
    class: 'danger small',
    onclick: () => ctx.act(
      `Cancel job "${job.id}"${ofTenant(job)}? It is ${job.status} now; it will end cancelled ` +
        'and its callback (if any) will say so.',
      async () => {
        await api('POST', withQuery(jobPath(job.id, '/cancel'), tenantQuery(job.tenant)));
        return `Job "${job.id}" cancelled.`;
      }),
  }, 'Cancel');
}

function redeliverButton(ctx, job) {
  const url = job.callback && job.callback.url ? ` to ${job.callback.url}` : '';
  return h('button', {
    type: 'button',
    class: 'small',
    onclick: () => ctx.act(
      `Redeliver the callback of job "${job.id}"${ofTenant(job)}${url}? ` +
        'It goes back into delivery with a fresh attempt budget.',
      async () => {
        await api('POST', withQuery(jobPath(job.id, '/redeliver'), tenantQuery(job.tenant)));
        return `Redelivering the callback of job "${job.id}".`;
      }),
  }, 'Redeliver');
}

function jobActions(ctx, job) {
  if (!ctx.canAct) return [];
  const buttons = [];
  if (job.status === 'queued' || job.status === 'running') buttons.push(cancelButton(ctx, job));
  if (job.callback && job.callback.state === 'failed') buttons.push(redeliverButton(ctx, job));
  return h('div', { class: 'actions' }, buttons);
}

function pager(ctx, view, nextCursor) {
  const cursor = ctx.params.get('cursor');
  if (!cursor && !nextCursor) return null;
  const base = Object.fromEntries(ctx.params);
  delete base.cursor;
  return h('div', { class: 'pager' },
    cursor ? h('button', { type: 'button', onclick: () => ctx.go(view, base) }, 'Back to first page') : null,
    nextCursor ? h('button', {
      type: 'button',
      onclick: () => ctx.go(view, { ...base, cursor: String(nextCursor) }),
    }, 'Next page') : null);
}

function callbackCell(callback) {
  if (!callback) return '—';
  const attempts = Number(callback.attempts) || 0;
  return h('span', {}, badge(callback.state),
    attempts ? h('span', { class: 'muted' }, ` ${attempts} ${attempts === 1 ? 'try' : 'tries'}`) : null);
}

function shorten(text, max = 140) {
  const str = String(text ?? '');
  return str.length > max ? `${str.slice(0, max - 1)}…` : str;
}

function errorText(job) {
  if (job.error) return shorten(`${job.error.code || 'error'}: ${job.error.message || ''}`);
  if (job.callback && job.callback.last_error) return shorten(`callback: ${job.callback.last_error}`);
  return '';
}

function count(value) {
  return h('span', { class: 'num' }, formatNumber(value));
}

// --- Overview -------------------------------------------------------------------------------

function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * magnitude >= value) return step * magnitude;
  return 10 * magnitude;
}

function rateChart(rates) {
  const points = (Array.isArray(rates) ? rates : []).filter((p) => p && Number.isFinite(p.t));
  if (!points.length) {
    return h('p', { class: 'muted' }, 'No rates yet: the chart fills in as this server runs.');
  }
  const W = 760;
  const H = 280;
  const left = 58;
  const right = 18;
  const top = 40;
  const bottom = 50;
  const end = points[points.length - 1].t;
  const start = end - 600;
  const value = (p, k) => (Number.isFinite(p[k]) ? p[k] : 0);
  const peak = Math.max(...points.map((p) => Math.max(value(p, 'accepted_per_s'), value(p, 'completed_per_s'))));
  const yMax = niceCeiling(peak);
  const x = (t) => left + ((t - start) / 600) * (W - left - right);
  const y = (v) => top + (1 - v / yMax) * (H - top - bottom);
  const shown = points.filter((p) => p.t >= start);
  const line = (k) => shown.map((p) => `${x(p.t).toFixed(1)},${y(value(p, k)).toFixed(1)}`).join(' ');

  const grid = [];
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    grid.push(s('line', { x1: left, x2: W - right, y1: y(v), y2: y(v), class: i ? 'grid' : 'axis' }),
      s('text', { x: left - 8, y: y(v) + 4, class: 'tick', 'text-anchor': 'end' },
        formatNumber(Math.round(v * 100) / 100)));
  }
  for (let t = start; t <= end; t += 120) {
    grid.push(s('line', { x1: x(t), x2: x(t), y1: H - bottom, y2: H - bottom + 5, class: 'axis' }),
      s('text', { x: x(t), y: H - bottom + 19, class: 'tick', 'text-anchor': 'middle' }, clockTime(t)));
  }
  const legend = (cls, label, at) => s('g', { transform: `translate(${at},14)` },
    s('line', { x1: 0, x2: 22, y1: 0, y2: 0, class: `series ${cls}` }),
    s('text', { x: 28, y: 4, class: 'legend' }, label));

  return s('svg', {
    viewBox: `0 0 ${W} ${H}`,
    class: 'chart',
    role: 'img',
    'aria-label': 'Jobs accepted and completed per second over the last 10 minutes',
  },
  s('title', {}, 'Jobs accepted and completed per second, last 10 minutes'),
  grid,
  s('line', { x1: left, x2: left, y1: top, y2: H - bottom, class: 'axis' }),
  s('polyline', { points: line('accepted_per_s'), class: 'series series-accepted' }),
  s('polyline', { points: line('completed_per_s'), class: 'series series-completed' }),
  legend('series-accepted', 'accepted / s', left + 8),
  legend('series-completed', 'completed / s', left + 150),
  s('text', { x: (left + W - right) / 2, y: H - 8, class: 'axis-title', 'text-anchor': 'middle' },
    'time (last 10 minutes, one point per 5 s)'),
  s('text', {
    x: 14, y: (top + H - bottom) / 2, class: 'axis-title', 'text-anchor': 'middle',
    transform: `rotate(-90 14 ${(top + H - bottom) / 2})`,
  }, 'jobs per second'));
}

function priorityBars(byPriority) {
  const entries = Object.entries(byPriority || {})
    .filter(([, n]) => Number(n) > 0)
    .sort(([a], [b]) => Number(a) - Number(b));
  if (!entries.length) return h('p', { class: 'muted' }, 'Nothing queued.');
  const most = Math.max(...entries.map(([, n]) => Number(n)));
  return h('div', { class: 'bars' }, entries.map(([priority, n]) => {
    const fill = h('span', { class: 'bar-fill' });
    fill.style.width = `${Math.max(2, (Number(n) / most) * 100)}%`;
    return h('div', { class: 'bar-row' },
      h('span', { class: 'bar-label' }, `priority ${priority}`),
      h('span', { class: 'bar' }, fill),
      h('span', { class: 'num' }, formatNumber(Number(n))));
  }));
}

function card(title, ...body) {
  return h('section', { class: 'card' }, h('h2', {}, title), body);
}

const overview = {
  title: 'Overview',
  autoRefreshMs: 5000,
  async load() {
    const data = await api('GET', '/v1/console/overview');
    const q = data && data.queue;
    const srv = (data && data.server) || {};
    const noCount = h('p', { class: 'muted' }, 'No count of the queue now: the job store cannot count it, or its last count failed.');
    const tiles = h('div', { class: 'tiles' },
      [
        ['Queued', q ? q.queued : undefined, 'queued'],
        ['Running', q ? q.running : undefined, 'running'],
        ['Oldest queued', q ? formatDuration(q.oldest_queued_seconds) : '—'],
        ['Callbacks retrying', q ? q.callbacks_waiting : undefined, 'pending'],
        ['Dead letters', q ? q.callbacks_failed : undefined, 'failed'],
      ].map(([label, value, tone]) => h('div', { class: `tile${tone ? ` tone-${tone}` : ''}` },
        h('span', { class: 'tile-value' }, typeof value === 'string' ? value : formatNumber(value)),
        h('span', { class: 'tile-label' }, label))));

    const statusRows = [
      ['queued', q ? q.queued : undefined, 'in the store'],
      ['running', q ? q.running : undefined, 'in the store'],
      ['succeeded', srv.succeeded, 'this server'],
      ['failed', srv.failed, 'this server'],
      ['expired', srv.expired, 'this server'],
      ['cancelled', srv.cancelled, 'this server'],
    ].map(([status, n, where]) => [badge(status), count(n), h('span', { class: 'muted' }, where)]);

    return h('div', {},
      tiles,
      h('div', { class: 'cards' },
        card('Jobs by status',
          table([{ label: 'Status' }, { label: 'Jobs', class: 'num' }, { label: 'Counted' }], statusRows),
          facts([
            ['Accepted by this server', count(srv.accepted)],
            ['In flight on this server', count(srv.in_flight)],
            ['This server\'s queue', count(srv.queue_depth)],
          ])),
        card('Queue by priority',
          q ? priorityBars(q.queued_by_priority) : noCount,
          q ? facts([['Oldest queued job', formatDuration(q.oldest_queued_seconds)]]) : null),
        card('Callbacks',
          facts([
            ['Delivered (this server)', count(srv.callbacks_delivered)],
            ['Retrying, waiting (store)', q ? count(q.callbacks_waiting) : '—'],
            ['Failed, dead letters (store)', q ? count(q.callbacks_failed) : '—'],
            ['Given up (this server)', count(srv.callbacks_given_up)],
            ['Attempts retried (this server)', count(srv.callback_attempts_retried)],
          ]))),
      card('Throughput', rateChart(data && data.rates)),
      h('p', { class: 'muted' }, 'Refreshes every 5 s. Counters marked "this server" count since it started.'));
  },
};

// --- Jobs -----------------------------------------------------------------------------------

const jobs = {
  title: 'Jobs',
  async load(ctx) {
    const p = ctx.params;
    const query = {};
    for (const name of ['status', 'callback_state', 'priority', 'id_prefix', 'tenant', 'limit', 'cursor']) {
      if (p.get(name)) query[name] = p.get(name);
    }
    const form = filterForm(ctx, 'jobs', [
      select('status', 'Status', STATUSES.map((v) => [v, v]), p.get('status') || ''),
      select('callback_state', 'Callback', CALLBACK_STATES.map((v) => [v, v]), p.get('callback_state') || ''),
      select('priority', 'Priority', PRIORITIES.map((v) => [v, v]), p.get('priority') || ''),
      textInput('id_prefix', 'Id prefix', p.get('id_prefix')),
      tenantSelect(ctx),
    ]);
    const data = await api('GET', '/v1/console/jobs', { query });
    const list = Array.isArray(data && data.jobs) ? data.jobs : [];
    const withTenant = showTenants(ctx);
    const columns = [
      { label: 'Id' },
      withTenant ? { label: 'Tenant' } : null,
      { label: 'Status' },
      { label: 'Priority', class: 'num' },
      { label: 'Created' },
      { label: 'Finished' },
      { label: 'Callback' },
      { label: 'Error' },
      ctx.canAct ? { label: 'Actions' } : null,
    ].filter(Boolean);
    const rows = list.map((job) => ({
      class: `status-${job.status}`,
      cells: [
        jobLink(job),
        withTenant ? tenantLabel(job.tenant) : null,
        badge(job.status),
        formatNumber(job.priority),
        formatTime(job.created_at),
        formatTime(job.finished_at),
        callbackCell(job.callback),
        h('span', { class: 'error-text' }, errorText(job)),
        ctx.canAct ? jobActions(ctx, job) : null,
      ].filter((c) => c !== null),
    }));
    return h('div', {}, form,
      table(columns, rows, { empty: 'No jobs match these filters.' }),
      pager(ctx, 'jobs', data && data.next_cursor));
  },
};

// --- Job detail -----------------------------------------------------------------------------

function attemptTable(log) {
  const rows = (Array.isArray(log) ? log : []).map((a, i) => {
    const outcome = Number.isInteger(a.status)
      ? h('span', { class: a.status >= 200 && a.status < 300 ? 'ok-text' : 'error-text' }, `HTTP ${a.status}`)
      : null;
    // An error that only repeats the status ("HTTP 500") is not shown twice.
    const repeats = outcome && String(a.error || '').trim() === `HTTP ${a.status}`;
    const error = a.error && !repeats ? h('span', { class: 'error-text' }, shorten(a.error, 300)) : null;
    return [
      String(i + 1),
      formatTime(a.at),
      h('span', {}, outcome, outcome && error ? ' ' : null, error, !outcome && !error ? '—' : null),
      Number.isFinite(a.latency_ms) ? `${formatNumber(Math.round(a.latency_ms))} ms` : '—',
      Array.isArray(a.signatures) && a.signatures.length ? a.signatures.join(', ') : 'none',
    ];
  });
  return table([
    { label: '#', class: 'num' }, { label: 'Time' }, { label: 'HTTP status or error' },
    { label: 'Latency', class: 'num' }, { label: 'Signatures' },
  ], rows, { caption: 'Delivery attempts', empty: 'No attempts yet.', cls: 'attempts', captionClass: 'sr-only' });
}

function pre(value) {
  return h('pre', { class: 'json' }, prettyJson(value));
}

const job = {
  title: 'Job',
  async load(ctx) {
    const id = ctx.params.get('id');
    if (!id) return h('p', {}, 'No job id given. Pick one from ', h('a', { href: '#/jobs' }, 'Jobs'), '.');
    const tenant = ctx.params.get('tenant') || '';
    const d = await api('GET', jobPath(id), { query: tenantQuery(tenant) });
    const cb = d.callback || {};
    const queuedFor = secondsBetween(d.created_at, d.started_at || d.finished_at);
    return h('div', { class: 'detail' },
      h('div', { class: 'detail-head' },
        h('h2', { class: 'mono' }, String(d.id)),
        badge(d.status),
        d.tenant ? h('span', { class: 'muted' }, `tenant ${d.tenant}`) : null,
        h('span', { class: 'muted' }, `priority ${formatNumber(d.priority)}`),
        d.model ? h('span', { class: 'muted mono' }, `model ${d.model.name}/${d.model.version}`) : null,
        jobActions(ctx, d)),
      h('div', { class: 'cards' },
        card('Timeline', facts([
          ['Created', formatTime(d.created_at)],
          ['Started', formatTime(d.started_at)],
          ['Finished', formatTime(d.finished_at)],
          ['Waited in queue', formatDuration(queuedFor)],
          ['Inference time', formatDuration(d.inference_seconds)],
          ['Total', formatDuration(secondsBetween(d.created_at, d.finished_at))],
        ])),
        card('Callback', facts([
          ['URL', h('span', { class: 'mono break' }, cb.url ? String(cb.url) : 'none (polled only)')],
          ['State', badge(cb.state)],
          ['Attempts', formatNumber(cb.attempts)],
          ['Webhook events', Array.isArray(d.webhook_events) && d.webhook_events.length
            ? d.webhook_events.join(', ') : '—'],
          cb.last_error ? ['Last error', h('span', { class: 'error-text break' }, String(cb.last_error))] : null,
        ]))),
      card('Request input', pre(d.input)),
      d.error
        ? card('Error', pre(d.error))
        : card('Result', 'result' in d ? pre(d.result) : h('p', { class: 'muted' }, 'No result yet.')),
      card('Delivery attempts', attemptTable(d.attempt_log),
        h('p', { class: 'muted' }, 'The last 10 attempts, oldest first.')));
  },
};

// --- Dead letters ---------------------------------------------------------------------------

function describeFilter(tenant, prefix) {
  const parts = [tenant ? `tenant "${tenant}"` : 'any tenant', prefix ? `id prefix "${prefix}"` : 'any id'];
  return parts.join(' and ');
}

function redeliverAllButton(ctx, tenant, prefix) {
  return h('button', {
    type: 'button',
    class: 'quiet',
    onclick: async () => {
      const filter = {};
      if (tenant) filter.tenant = tenant;
      if (prefix) filter.id_prefix = prefix;
      let dry;
      try {
        dry = await api('POST', '/v1/console/dead-letters/redeliver', { body: { ...filter, dry_run: true } });
      } catch (err) {
        ctx.report(err.message, false);
        return;
      }
      const matched = Number(dry && dry.matched) || 0;
      if (!matched) {
        ctx.report(`No dead letters match ${describeFilter(tenant, prefix)}.`, true);
        return;
      }
      const n = dry.more ? `at least ${formatNumber(matched)}` : formatNumber(matched);
      const noun = matched === 1 && !dry.more ? 'dead letter' : 'dead letters';
      ctx.act(`Redeliver all ${n} ${noun} matching ${describeFilter(tenant, prefix)}?`, async () => {
        const done = await api('POST', '/v1/console/dead-letters/redeliver', { body: { ...filter, dry_run: false } });
        const sent = Number(done && done.redelivered) || 0;
        return `Redelivering ${formatNumber(sent)} dead ${sent === 1 ? 'letter' : 'letters'}.` +
          (done && done.more ? ' More remain: press Redeliver all again.' : '');
      });
    },
  }, 'Redeliver all');
}

const deadLetters = {
  title: 'Dead letters',
  async load(ctx) {
    const p = ctx.params;
    const tenant = p.get('tenant') || '';
    const prefix = p.get('id_prefix') || '';
    const form = filterForm(ctx, 'dead-letters', [tenantSelect(ctx), textInput('id_prefix', 'Id prefix', prefix)]);
    const data = await api('GET', '/v1/console/jobs', {
      query: { callback_state: 'failed', tenant, id_prefix: prefix, cursor: p.get('cursor'), limit: p.get('limit') },
    });
    const list = Array.isArray(data && data.jobs) ? data.jobs : [];
    const withTenant = showTenants(ctx);
    const columns = [
      { label: 'Id' }, withTenant ? { label: 'Tenant' } : null, { label: 'Callback URL' },
      { label: 'Attempts', class: 'num' }, { label: 'Last error' }, { label: 'Created' },
      ctx.canAct ? { label: 'Actions' } : null,
    ].filter(Boolean);
    const rows = list.map((j) => {
      const cb = j.callback || {};
      return [
        jobLink(j),
        withTenant ? tenantLabel(j.tenant) : null,
        h('span', { class: 'mono break' }, shorten(cb.url, 100)),
        formatNumber(cb.attempts),
        h('span', { class: 'error-text' }, shorten(cb.last_error)),
        formatTime(j.created_at),
        ctx.canAct ? h('div', { class: 'actions' }, redeliverButton(ctx, j)) : null,
      ].filter((c) => c !== null);
    });
    return h('div', {},
      h('div', { class: 'toolbar' }, form,
        ctx.canAct ? h('div', { class: 'toolbar-end' }, redeliverAllButton(ctx, tenant, prefix)) : null),
      h('p', { class: 'muted' }, 'Jobs whose callback was given up, newest first.'),
      table(columns, rows, { empty: 'No dead letters match.' }),
      pager(ctx, 'dead-letters', data && data.next_cursor));
  },
};

// --- Endpoints ------------------------------------------------------------------------------

function pauseButton(ctx, origin, paused) {
  const verb = paused ? 'Resume' : 'Pause';
  const question = paused
    ? `Resume callbacks to ${origin}? Held callbacks go out again as they come due.`
    : `Pause callbacks to ${origin}? Nothing more is sent there, for every tenant, until it is ` +
      'resumed; its callbacks wait in the store without spending attempts.';
  return h('button', {
    type: 'button',
    class: paused ? 'small primary' : 'small danger',
    onclick: () => ctx.act(question, async () => {
      const path = `/v1/callback-endpoints/${paused ? 'resume' : 'pause'}`;
      const answer = await api('POST', path, { body: { origin } });
      const shown = (answer && answer.origin) || origin;
      return answer && answer.paused ? `Paused ${shown}.` : `Resumed ${shown}.`;
    }),
  }, verb);
}

function successRate(e) {
  const ok = Number(e.delivered) || 0;
  const bad = Number(e.failed) || 0;
  return ok + bad ? `${((ok / (ok + bad)) * 100).toFixed(ok + bad >= 1000 ? 1 : 0)}%` : '—';
}

const endpoints = {
  title: 'Endpoints',
  async load(ctx) {
    const [data, paused] = await Promise.all([
      api('GET', '/v1/callback-endpoints'),
      api('GET', '/v1/console/paused-origins'),
    ]);
    const list = Array.isArray(data && data.endpoints) ? data.endpoints : [];
    const pausedSet = new Set((paused && Array.isArray(paused.origins) ? paused.origins : []).map(String));
    const listed = new Set(list.map((e) => String(e.origin)));
    const entries = list.map((e) => ({ ...e, paused: Boolean(e.paused) || pausedSet.has(String(e.origin)) }));
    for (const origin of pausedSet) if (!listed.has(origin)) entries.push({ origin, paused: true, idle: true });

    const columns = [
      { label: 'Origin' }, { label: 'Tenant' }, { label: 'Circuit' },
      { label: 'Consecutive failures', class: 'num' }, { label: 'In flight', class: 'num' },
      { label: 'Waiting', class: 'num' }, { label: 'Deferred', class: 'num' },
      { label: 'Success rate', class: 'num' }, { label: 'Paused' },
      ctx.canAct ? { label: 'Actions' } : null,
    ].filter(Boolean);
    const rows = entries.map((e) => ({
      class: e.paused ? 'paused' : null,
      cells: [
        h('span', { class: 'mono' }, String(e.origin)),
        e.idle ? '—' : tenantLabel(e.tenant),
        e.idle ? '—' : badge(e.state),
        e.idle ? '—' : formatNumber(e.consecutive_failures),
        e.idle ? '—' : formatNumber(e.in_flight),
        e.idle ? '—' : formatNumber(e.waiting),
        e.idle ? '—' : formatNumber(e.deferred),
        e.idle ? '—' : h('span', { title: `${formatNumber(e.delivered)} delivered, ${formatNumber(e.failed)} failed` },
          successRate(e)),
        e.paused ? badge('paused', 'paused') : 'no',
        ctx.canAct ? h('div', { class: 'actions' }, pauseButton(ctx, String(e.origin), e.paused)) : null,
      ].filter((c) => c !== null),
    }));
    return h('div', {},
      h('p', { class: 'muted' },
        'Receiver origins with callbacks in flight, waiting, failing, open or paused, one row per ' +
        'origin and tenant, as this server sees them. A pause holds the origin for every tenant.'),
      table(columns, rows, { empty: 'No receiver has anything in flight, failing or paused.' }));
  },
};

// --- Servers --------------------------------------------------------------------------------

const servers = {
  title: 'Servers',
  async load() {
    const data = await api('GET', '/v1/console/servers');
    const list = Array.isArray(data && data.servers) ? data.servers : [];
    const rows = list.map((srv) => ({
      class: srv.this ? 'this-server' : null,
      cells: [
        h('span', {}, h('span', { class: 'mono' }, String(srv.id)), srv.this ? ' ' : null,
          srv.this ? badge('this', 'this server') : null),
        formatNumber(srv.leases),
        h('span', {}, formatTime(srv.last_seen), h('span', { class: 'muted' }, ` ${formatAgo(srv.last_seen)}`)),
      ],
    }));
    return h('div', {},
      h('p', { class: 'muted' }, 'The servers sharing this job store, and the jobs each holds a lease on.'),
      table([{ label: 'Server id' }, { label: 'Leases', class: 'num' }, { label: 'Last seen' }], rows,
        { empty: 'No servers are listed.' }));
  },
};

// --- Models ---------------------------------------------------------------------------------

function modelPath(name, tail = '') {
  return `/v1/models/${encodeURIComponent(name)}${tail}`;
}

function formatBytes(n) {
  const v = Number(n);
  if (!Number.isFinite(v) || v <= 0) return '—';
  if (v < 1024) return `${v} B`;
  if (v < 1 << 20) return `${(v / 1024).toFixed(1)} KiB`;
  return `${(v / (1 << 20)).toFixed(1)} MiB`;
}

// Where the route sends a version's new jobs: "default", "10 %", or nothing.
function routeShare(model, version) {
  if (model.default_version === version) return 'default';
  const split = (Array.isArray(model.split) ? model.split : []).find((x) => x.version === version);
  return split ? `${split.percent} %` : '';
}

function versionButton(ctx, model, v) {
  const name = String(model.name);
  const version = String(v.version);
  if ((v.state === 'ready' || v.state === 'draining') && !routeShare(model, version)) {
    // Two ways to unload: the jobs not started run on it first (queued=finish), or they go to
    // the version the route chooses for each (queued=reroute).
    const unload = (queued, label, question, done) => h('button', {
      type: 'button',
      class: 'small danger',
      onclick: () => ctx.act(question, async () => {
        await api('DELETE',
          modelPath(name, `/versions/${encodeURIComponent(version)}?queued=${queued}`));
        return done;
      }),
    }, label);
    return [
      unload('finish', 'Unload',
        `Unload version ${version} of ${name}? It takes no new job; the jobs queued for it run ` +
        'on it first, then it is released (on every server of a shared store).',
        `Unloading ${name} version ${version}.`),
      unload('reroute', 'Reroute',
        `Unload version ${version} of ${name} and send its queued jobs to the route? It takes ` +
        'no new job; its jobs not started yet (here and waiting in the store) run on the ' +
        'version the route chooses for each instead, and each job\'s status and callback name ' +
        'that version; the jobs running finish on it, then it is released (on every server of a ' +
        'shared store).',
        `Unloading ${name} version ${version}; its queued jobs go to the route.`),
    ];
  }
  if (v.state === 'failed' || v.state === 'unloaded') {
    return loadButton(ctx, name, version, 'Load');
  }
  return null;
}

function loadVersion(ctx, name, version) {
  return ctx.act(
    `Load version ${version} of ${name}? It loads in the background and takes no job until a ` +
    'route sends it some.',
    async () => {
      await api('PUT', modelPath(name, `/versions/${encodeURIComponent(version)}`));
      return `Loading ${name} version ${version}.`;
    });
}

function loadButton(ctx, name, version, label) {
  return h('button', { type: 'button', class: 'small primary', onclick: () => loadVersion(ctx, name, version) },
    label);
}

// The route form: a default version and an optional canary with its percent, sent with the
// generation shown (If-Match), so that a change made meanwhile is refused rather than undone.
function routeForm(ctx, model) {
  const name = String(model.name);
  const ready = (Array.isArray(model.versions) ? model.versions : [])
    .filter((v) => v.state === 'ready').map((v) => String(v.version));
  // The route's own default is offered even when it is not ready here (another server's route),
  // so that the form never preselects a different one.
  if (model.default_version && !ready.includes(String(model.default_version))) {
    ready.unshift(String(model.default_version));
  }
  const splits = Array.isArray(model.split) ? model.split : [];
  const split = splits.length ? splits[0] : null;
  const form = h('form', { class: 'filters route-form', novalidate: true },
    h('label', { class: 'field' }, h('span', {}, 'Default version'),
      h('select', { name: 'default_version' },
        ready.map((v) => h('option', { value: v, selected: v === model.default_version }, v)))),
    h('label', { class: 'field' }, h('span', {}, 'Canary version'),
      h('select', { name: 'canary' },
        h('option', { value: '' }, 'None'),
        ready.map((v) => h('option', { value: v, selected: split && v === split.version }, v)))),
    h('label', { class: 'field' }, h('span', {}, 'Canary %'),
      h('input', { type: 'number', name: 'percent', min: '1', max: '100',
        value: split ? String(split.percent) : '10' })),
    h('button', { type: 'submit', class: 'primary' }, 'Set route'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const target = String(data.get('default_version') || '');
    const canary = String(data.get('canary') || '');
    const percent = Number(data.get('percent'));
    const body = { default_version: target, split: [] };
    if (canary && canary !== target) body.split.push({ version: canary, percent });
    const words = body.split.length
      ? `version ${target}, with ${percent} % of new jobs to version ${canary}`
      : `version ${target} for every new job`;
    const dropped = splits.length > 1
      ? ` This replaces the route's ${splits.length} canaries (${splits.map((x) => `${x.percent} % to ${x.version}`).join(', ')}).`
      : '';
    ctx.act(`Route ${name} to ${words}?${dropped} Jobs accepted before keep their version.`, async () => {
      const answer = await api('PUT', modelPath(name, '/route'), {
        body, headers: { 'If-Match': `"${model.generation}"` },
      });
      return `The route of ${name} is at generation ${answer && answer.generation}.`;
    });
  });
  return form;
}

function loadForm(ctx, model) {
  const name = String(model.name);
  const form = h('form', { class: 'filters load-form', novalidate: true },
    h('label', { class: 'field' }, h('span', {}, 'Version'),
      h('input', { type: 'text', name: 'version', inputmode: 'numeric', autocomplete: 'off',
        spellcheck: 'false', placeholder: 'e.g. 3' })),
    h('button', { type: 'submit' }, 'Load version'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const version = String(new FormData(form).get('version') || '').trim();
    if (version) loadVersion(ctx, name, version);
  });
  return form;
}

function modelSection(ctx, model) {
  const versions = Array.isArray(model.versions) ? model.versions : [];
  const columns = [
    { label: 'Version' }, { label: 'State' }, { label: 'Route' }, { label: 'Queued', class: 'num' },
    { label: 'Running', class: 'num' }, { label: 'Memory', class: 'num' }, { label: 'Digest' },
    { label: 'Loaded' }, ctx.canAct ? { label: 'Actions' } : null,
  ].filter(Boolean);
  const rows = versions.map((v) => ({
    class: `model-version ${String(v.state)}`,
    cells: [
      h('span', { class: 'mono' }, String(v.version)),
      h('span', {}, badge(v.state),
        v.error ? h('span', { class: 'error-text' }, ` ${shorten(v.error.message, 160)}`) : null),
      routeShare(model, String(v.version)),
      v.queued === undefined ? '—' : formatNumber(v.queued),
      v.running === undefined ? '—' : formatNumber(v.running),
      formatBytes(v.memory_bytes),
      h('span', { class: 'mono', title: v.digest || '' }, v.digest ? shorten(v.digest, 19) : '—'),
      v.loaded_at ? formatTime(v.loaded_at) : '—',
      ctx.canAct ? h('div', { class: 'actions' }, versionButton(ctx, model, v)) : null,
    ].filter((c) => c !== null),
  }));
  const split = Array.isArray(model.split) ? model.split : [];
  return h('section', { class: 'model', 'data-model': String(model.name) },
    h('h2', {}, String(model.name)),
    h('p', { class: 'muted' },
      model.default_version
        ? `New jobs go to version ${model.default_version}` +
          split.map((x) => `, ${x.percent} % to version ${x.version}`).join('') +
          ` (route generation ${model.generation}).`
        : 'No route: the model takes no new job.'),
    table(columns, rows, { empty: 'No version.' }),
    ctx.canAct ? h('div', { class: 'toolbar' }, routeForm(ctx, model), loadForm(ctx, model)) : null);
}

const models = {
  title: 'Models',
  async load(ctx) {
    const data = await api('GET', '/v1/models');
    const list = Array.isArray(data && data.models) ? data.models : [];
    return h('div', {},
      h('p', { class: 'muted' },
        'The models this server serves, each version\'s state and where new jobs go. Changes ' +
        'apply to every server of a shared store.'),
      list.length ? list.map((m) => modelSection(ctx, m)) : h('p', {}, 'No model is loaded.'));
  },
};

export const views = {
  overview,
  jobs,
  job,
  'dead-letters': deadLetters,
  endpoints,
  models,
  servers,
};
