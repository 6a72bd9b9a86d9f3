// DOM building and formatting. Text from the server only ever goes into text nodes.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'text') el.textContent = String(value);
    else if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else if (name === 'style') throw new Error('inline style attributes are blocked by the CSP');
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// h('td', {class: 'num'}, 'text', childNode, ...): an HTML element.
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

// s('line', {x1: 0, ...}): an SVG element.
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function byId(id) {
  return document.getElementById(id);
}

// --- formatting -----------------------------------------------------------------------------

const pad = (n) => String(n).padStart(2, '0');

// An RFC 3339 time as local "YYYY-MM-DD HH:MM:SS"; what came when it does not parse.
export function formatTime(value) {
  if (value === undefined || value === null || value === '') return '—';
  const d = new Date(value);
  if (Number.isNaN(d.getTime())) return String(value);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function clockTime(unixSeconds) {
  const d = new Date(unixSeconds * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// Seconds as "850 ms", "4.2 s", "3 min 5 s", "2 h 10 min", "3 d 4 h".
export function formatDuration(seconds) {
  if (typeof seconds !== 'number' || !Number.isFinite(seconds)) return '—';
  if (seconds < 0) seconds = 0;
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds < 10 ? seconds.toFixed(1) : Math.round(seconds)} s`;
  const m = Math.floor(seconds / 60);
  if (m < 60) return `${m} min ${Math.floor(seconds % 60)} s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

// Seconds between two RFC 3339 times, or undefined.
export function secondsBetween(from, to) {
  const a = Date.parse(from);
  const b = Date.parse(to);
  return Number.isNaN(a) || Number.isNaN(b) ? undefined : (b - a) / 1000;
}

export function formatAgo(value) {
  const t = Date.parse(value);
  if (Number.isNaN(t)) return '';
  return `${formatDuration(Math.max(0, (Date.now() - t) / 1000))} ago`;
}

export function formatNumber(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
  return Number.isInteger(n) ? n.toLocaleString('en-US') : n.toLocaleString('en-US', {
    maximumFractionDigits: 2,
  });
}

export function prettyJson(value) {
  try {
    return JSON.stringify(value, null, 2) ?? 'null';
  } catch {
    return String(value);
  }
}

export function tenantLabel(tenant) {
  return tenant ? String(tenant) : '(default)';
}

// A coloured pill: badge('failed') gets class "badge badge-failed". Unknown words get no colour.
const KNOWN = new Set(['queued', 'running', 'succeeded', 'failed', 'expired', 'cancelled', 'none',
  'pending', 'delivered', 'closed', 'open', 'half_open', 'paused', 'this', 'loading', 'ready',
  'draining', 'unloaded']);
export function badge(word, label) {
  const text = String(word ?? '—');
  const cls = KNOWN.has(text) ? `badge badge-${text.replace('_', '-')}` : 'badge';
  return h('span', { class: cls }, label ?? text.replace('_', ' '));
}

// A table: columns is [{label, class?}], rows are arrays of cells (text or nodes), each row may
// carry {cells, class}. An empty list shows `empty` across the table.
export function table(columns, rows, { caption, captionClass, empty = 'Nothing to show.', cls } = {}) {
  const body = rows.length
    ? rows.map((row) => {
      const cells = Array.isArray(row) ? row : row.cells;
      return h('tr', { class: Array.isArray(row) ? null : row.class },
        cells.map((cell, i) => h('td', { class: columns[i].class }, cell)));
    })
    : [h('tr', { class: 'empty' }, h('td', { colspan: columns.length }, empty))];
  return h('div', { class: 'table-wrap' },
    h('table', { class: cls },
      caption ? h('caption', { class: captionClass }, caption) : null,
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.class }, c.label)))),
      h('tbody', {}, body)));
}

// A definition list from [label, value] pairs.
export function facts(pairs) {
  return h('dl', { class: 'facts' },
    pairs.filter(Boolean).map(([label, value]) => [h('dt', {}, label), h('dd', {}, value)]));
}

// --- messages -------------------------------------------------------------------------------

export function showBanner(message) {
  const el = byId('banner');
  el.textContent = message;
  el.hidden = false;
}

export function hideBanner() {
  const el = byId('banner');
  el.hidden = true;
  el.textContent = '';
}

let statusTimer = 0;
export function showStatus(message, ok) {
  const el = byId('status');
  el.textContent = message;
  el.className = ok ? 'status status-ok' : 'status status-error';
  el.hidden = false;
  clearTimeout(statusTimer);
  statusTimer = setTimeout(() => { el.hidden = true; }, 12000);
}

export function hideStatus() {
  clearTimeout(statusTimer);
  byId('status').hidden = true;
}

// --- confirmation ---------------------------------------------------------------------------

// Opens the dialog with `question`; resolves true for Confirm, false for Back or Escape.
export function confirmDialog(question) {
  const dialog = byId('confirm');
  byId('confirm-text').textContent = question;
  return new Promise((resolve) => {
    const ok = byId('confirm-ok');
    const back = byId('confirm-back');
    const finish = (answer) => {
      ok.removeEventListener('click', onOk);
      back.removeEventListener('click', onBack);
      dialog.removeEventListener('cancel', onBack);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    const onOk = () => finish(true);
    const onBack = (event) => {
      if (event) event.preventDefault();
      finish(false);
    };
    ok.addEventListener('click', onOk);
    back.addEventListener('click', onBack);
    dialog.addEventListener('cancel', onBack);
    dialog.showModal();
    back.focus();
  });
}
