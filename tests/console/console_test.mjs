#!/usr/bin/env node
// End-to-end test of the operator console (src/console, served at /console/): starts
// rebound-server ($REBOUND_SERVER) and two callback receivers of its own, then drives Debian's
// chromium (headless, through puppeteer-core from $REBOUND_NODE_TOOLS or $NODE_PATH) through
// sign-in, every view and every action, checking what the server did through its API.
//
//   REBOUND_SERVER=build/examples/rebound-server node tests/console/console_test.mjs
//
// Environment: REBOUND_SERVER (required), REBOUND_NODE_TOOLS (default /opt/rebound-node-tools),
// NODE_PATH (looked in first when set), REBOUND_SCREENSHOTS (default ./console-screenshots: one
// PNG per view). Exits 0 when every check passed, 1 on the first failure, 2 on a usage error, 77
// when chromium or puppeteer-core is not installed (the test is skipped).

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const CHROMIUM = '/usr/bin/chromium';
const CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-dev-shm-usage'];
const OVERALL_TIMEOUT_MS = 180_000;
const OPERATOR = 'OPKEY';
const VIEWER = 'VIEWKEY';
const ALICE = 'ALICEKEY';
const ACTION_BUTTONS = ['Cancel', 'Redeliver', 'Redeliver all', 'Pause', 'Resume', 'Load', 'Unload',
  'Reroute', 'Set route', 'Load version'];

// --- plumbing -------------------------------------------------------------------------------

const cleanups = [];
let finished = false;

function log(line) {
  process.stdout.write(`${line}\n`);
}

function step(title) {
  log(`\n== ${title}`);
}

function ok(what) {
  log(`  ok: ${what}`);
}

class CheckFailed extends Error {}

function check(condition, what, detail) {
  if (!condition) throw new CheckFailed(`${what}${detail === undefined ? '' : ` (${detail})`}`);
  ok(what);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Polls fn until it returns something truthy; fails with `what` after timeoutMs, or at once
// when fn throws a CheckFailed.
async function waitFor(what, fn, timeoutMs = 10_000, everyMs = 200) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const value = await fn();
      if (value) return value;
    } catch (err) {
      if (err instanceof CheckFailed) throw err;
      last = err;
    }
    if (Date.now() > deadline) {
      throw new CheckFailed(`timed out after ${timeoutMs / 1000} s waiting for ${what}` +
        (last ? `: ${last.message}` : ''));
    }
    await sleep(everyMs);
  }
}

async function runCleanups() {
  while (cleanups.length) {
    const fn = cleanups.pop();
    try {
      await fn();
    } catch (err) {
      log(`  (cleanup: ${err.message})`);
    }
  }
}

async function finish(code, message) {
  if (finished) return;
  finished = true;
  if (message) log(message);
  await runCleanups();
  process.exit(code);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function loadPuppeteer() {
  const tools = process.env.REBOUND_NODE_TOOLS || '/opt/rebound-node-tools';
  const fromTools = createRequire(path.join(tools, 'package.json'));
  const fromNodePath = createRequire(import.meta.url); // resolves through NODE_PATH
  const order = process.env.NODE_PATH ? [fromNodePath, fromTools] : [fromTools, fromNodePath];
  for (const req of order) {
    try {
      return req('puppeteer-core');
    } catch (err) {
      if (err.code !== 'MODULE_NOT_FOUND') throw err;
    }
  }
  return null;
}

// --- the callback receivers -----------------------------------------------------------------

// A node http server on 127.0.0.1 that records every request and answers statusFor().
async function startReceiver(name, statusFor) {
  const got = [];
  const srv = http.createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk) => { body += chunk; });
    req.on('end', () => {
      let json;
      try {
        json = JSON.parse(body);
      } catch {
        json = undefined;
      }
      const status = statusFor();
      got.push({ method: req.method, url: req.url, headers: req.headers, body, json, answered: status });
      res.writeHead(status, { 'Content-Type': 'text/plain' });
      res.end(status < 300 ? 'ok' : 'failing on purpose');
    });
  });
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address();
  cleanups.push(() => new Promise((resolve) => { srv.closeAllConnections(); srv.close(() => resolve()); }));
  const origin = `http://127.0.0.1:${port}`;
  log(`  receiver ${name} at ${origin}`);
  return { name, origin, got, posts: (id) => got.filter((r) => r.method === 'POST' && r.json && r.json.id === id) };
}

// --- rebound-server -------------------------------------------------------------------------

async function startServer(binary, workDir) {
  const port = await freePort();
  // A repository of one model, "sleep" (2 s a job), in version 1; version 2 is added later.
  const models = path.join(workDir, 'models');
  fs.mkdirSync(path.join(models, 'sleep', '1'), { recursive: true });
  fs.writeFileSync(path.join(models, 'sleep', '1', 'config.json'), '{"backend": "sleep", "seconds": 2}');
  const args = ['--host', '127.0.0.1', '--port', String(port), '--model-repository', models, '--store', 'memory',
    '--allow-private-callbacks', '--workers', '1', '--operator-key', `ops:${OPERATOR}`,
    '--viewer-key', `watch:${VIEWER}`, '--api-key', `alice:${ALICE}`, '--api-key', 'bob:BOBKEY',
    '--max-tries', '1',
    // A paused origin's callbacks come back from the store every 2 s (30 s by default), so that a
    // resume shows within seconds.
    '--callback-pause-recheck', '2',
    // Signed callbacks: the attempt table names the scheme (v1).
    '--signing-secret', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'];
  const logPath = path.join(workDir, 'server.log');
  const out = fs.openSync(logPath, 'a');
  log(`  ${binary} ${args.join(' ')}`);
  const child = spawn(binary, args, { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  let exited = null;
  child.on('exit', (code, signal) => { exited = { code, signal }; });
  child.on('error', (err) => { exited = { error: err.message }; });
  cleanups.push(async () => {
    if (exited === null) {
      child.kill('SIGTERM');
      const deadline = Date.now() + 5000;
      while (exited === null && Date.now() < deadline) await sleep(50);
      if (exited === null) child.kill('SIGKILL');
    }
  });
  const base = `http://127.0.0.1:${port}`;
  await waitFor('GET /ping to answer 200', async () => {
    if (exited) throw new CheckFailed(`rebound-server exited before answering /ping: ${JSON.stringify(exited)}`);
    const r = await fetch(`${base}/ping`);
    return r.status === 200;
  }, 20_000, 100);
  return { base, logPath, models, child, exited: () => exited };
}

function makeApi(base) {
  return async function call(method, route, { key, body } = {}) {
    const headers = {};
    if (key) headers.Authorization = `Bearer ${key}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(`${base}${route}`, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let json;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    return { status: r.status, json, text, headers: r.headers };
  };
}

// --- the page -------------------------------------------------------------------------------

// Runs in the page (puppeteer sends its source; it must use nothing from outside): the visible
// buttons (or links) named exactly `name`, within the table rows one of whose cells (or a link or
// span in it) reads exactly `row` when row is given. Returns the first, or with count, how many.
function pageControls(name, row, tag, count) {
  const visible = (el) => el.getClientRects().length > 0 && !el.closest('[hidden]') &&
    getComputedStyle(el).visibility !== 'hidden';
  const rowMatches = (tr) => [...tr.cells].some((td) => td.textContent.trim() === row ||
    [...td.querySelectorAll('a, span')].some((el) => el.textContent.trim() === row));
  const scopes = row ? [...document.querySelectorAll('tr')].filter(rowMatches) : [document];
  const found = [];
  for (const scope of scopes) {
    for (const el of scope.querySelectorAll(tag)) {
      if (el.textContent.trim() === name && visible(el)) found.push(el);
    }
  }
  return count ? found.length : found[0] || null;
}

function makeUi(page) {
  const ui = {
    async find(name, { row, tag = 'button' } = {}) {
      const handle = await page.evaluateHandle(pageControls, name, row || null, tag, false);
      const el = handle.asElement();
      if (!el) await handle.dispose();
      return el;
    },
    async click(name, options = {}) {
      const what = `${options.tag === 'a' ? 'link' : 'button'} "${name}"${options.row ? ` in the row of ${options.row}` : ''}`;
      // A view that refreshes between finding the control and clicking it replaces the control
      // (puppeteer: "Node is detached from document"): found again and clicked, within the time.
      const deadline = Date.now() + (options.timeoutMs ?? 10_000);
      for (;;) {
        const el = await waitFor(what, () => ui.find(name, options), Math.max(1, deadline - Date.now()));
        try {
          await el.click();
          break;
        } catch (e) {
          if (!/detached|not clickable|not visible/i.test(String(e)) || Date.now() > deadline) throw e;
        } finally {
          await el.dispose().catch(() => {});
        }
      }
      ok(`clicked ${what}`);
    },
    async count(names) {
      const counts = {};
      for (const name of names) counts[name] = await page.evaluate(pageControls, name, null, 'button', true);
      return counts;
    },
    // Marks the view shown now as stale, so that view() waits for the next one.
    async stale() {
      await page.evaluate(() => {
        const h1 = document.querySelector('#view h1');
        if (h1) h1.dataset.testStale = '1';
      });
    },
    // Waits until a fresh view titled `title` has loaded (heading shown, not busy, no "Loading…").
    async view(title) {
      await waitFor(`the ${title} view`, () => page.evaluate((t) => {
        const root = document.getElementById('view');
        const h1 = root && root.querySelector('h1');
        return Boolean(root && !root.hidden && h1 && h1.textContent.trim() === t && !h1.dataset.testStale &&
          !root.hasAttribute('aria-busy') && !root.querySelector('.loading'));
      }, title));
      ok(`the ${title} view is shown`);
    },
    async nav(name, title = name) {
      await ui.stale();
      await ui.click(name, { tag: 'a' });
      await ui.view(title);
    },
    async rowTexts(rowId) {
      return page.evaluate((r) => [...document.querySelectorAll('tr')]
        .filter((tr) => [...tr.cells].some((td) => td.textContent.trim() === r ||
          [...td.querySelectorAll('a, span')].some((el) => el.textContent.trim() === r)))
        .map((tr) => tr.textContent.replace(/\s+/g, ' ').trim()), rowId);
    },
    async waitRow(rowId, timeoutMs = 10_000) {
      const rows = await waitFor(`a table row for ${rowId}`, async () => {
        const found = await ui.rowTexts(rowId);
        return found.length ? found : null;
      }, timeoutMs);
      ok(`a row for ${rowId} is shown: "${rows[0]}"`);
      return rows;
    },
    // Clicks Confirm in the open confirmation dialog; returns what the dialog said.
    async confirm(button = 'Confirm') {
      const text = await waitFor('the confirmation dialog', () => page.evaluate(() => {
        const d = document.querySelector('dialog[open]');
        return d ? d.textContent.replace(/\s+/g, ' ').trim() : null;
      }));
      ok(`a confirmation dialog asks: "${text}"`);
      await ui.click(button);
      await waitFor('the dialog to close', () => page.evaluate(() => !document.querySelector('dialog[open]')));
      return text;
    },
    async statusMessage() {
      const text = await waitFor('a status message', () => page.evaluate(() => {
        const el = document.querySelector('[role="status"]');
        return el && !el.hidden && el.textContent.trim() ? el.textContent.trim() : null;
      }));
      return text;
    },
    async signIn(key) {
      const input = await page.waitForSelector('input[type="password"]', { visible: true, timeout: 10_000 });
      await page.evaluate((el) => { el.value = ''; }, input);
      await input.click();
      await input.type(key);
      await input.dispose();
      await ui.click('Sign in');
    },
    async selectByLabel(label, value) {
      const handle = await page.evaluateHandle((l) => {
        for (const lab of document.querySelectorAll('label')) {
          const own = lab.querySelector('span');
          if (own && own.textContent.trim() === l) return lab.querySelector('select, input');
        }
        return null;
      }, label);
      const el = handle.asElement();
      if (!el) throw new CheckFailed(`no field labelled "${label}"`);
      await el.select(value);
      await el.dispose();
      ok(`set "${label}" to ${value}`);
    },
  };
  return ui;
}

// --- the test -------------------------------------------------------------------------------

async function main() {
  const binary = process.env.REBOUND_SERVER;
  if (!binary) {
    log('console_test: set REBOUND_SERVER to the rebound-server binary');
    process.exit(2);
  }
  if (!fs.existsSync(CHROMIUM)) {
    log(`console_test: SKIPPED: ${CHROMIUM} is not installed (apt-get install chromium)`);
    process.exit(77);
  }
  const puppeteer = loadPuppeteer();
  if (!puppeteer) {
    log('console_test: SKIPPED: puppeteer-core not found under $REBOUND_NODE_TOOLS ' +
      '(/opt/rebound-node-tools by default) or $NODE_PATH; run scripts/install-deps.sh');
    process.exit(77);
  }
  const shots = path.resolve(process.env.REBOUND_SCREENSHOTS || 'console-screenshots');
  fs.mkdirSync(shots, { recursive: true });
  const workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'rebound-console-test-'));
  cleanups.push(() => fs.rmSync(workDir, { recursive: true, force: true }));

  const timer = setTimeout(() => {
    fail(new CheckFailed(`the whole test took longer than ${OVERALL_TIMEOUT_MS / 1000} s`));
  }, OVERALL_TIMEOUT_MS);
  cleanups.push(() => clearTimeout(timer));

  step('1. Receivers: A answers 500 (until told otherwise), B answers 200');
  let aAnswers = 500;
  const A = await startReceiver('A', () => aAnswers);
  const B = await startReceiver('B', () => 200);

  step('Starting rebound-server');
  const server = await startServer(binary, workDir);
  state.server = server;
  const { base } = server;
  const call = makeApi(base);
  ok(`rebound-server answers /ping at ${base}`);

  const submit = async (id, extra = {}) => {
    const r = await call('POST', '/v1/inferences', { key: ALICE, body: { id, input: { x: 1 }, ...extra } });
    check(r.status === 202, `alice submits ${id}`, `HTTP ${r.status} ${r.text}`);
  };
  const poll = async (id) => {
    const r = await call('GET', `/v1/inferences/${id}`, { key: ALICE });
    if (r.status !== 200) throw new Error(`GET /v1/inferences/${id}: HTTP ${r.status} ${r.text}`);
    return r.json;
  };

  step('2. A job whose callback fails becomes a dead letter');
  await submit('dl-1', { callback_url: `${A.origin}/hook` });
  await waitFor('dl-1 callback.state failed', async () => (await poll('dl-1')).callback.state === 'failed', 30_000);
  ok('dl-1 callback.state is failed');

  step('3. The console page, its headers and its requests');
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'rebound-console-chromium-'));
  cleanups.push(() => fs.rmSync(userDataDir, { recursive: true, force: true }));
  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    userDataDir,
    defaultViewport: { width: 1280, height: 860 },
  });
  cleanups.push(async () => {
    const proc = browser.process();
    await Promise.race([browser.close(), sleep(5000)]);
    if (proc && proc.exitCode === null) proc.kill('SIGKILL');
  });
  const page = await browser.newPage();
  const ui = makeUi(page);
  const requests = [];
  const pageErrors = [];
  const consoleErrors = [];
  page.on('request', (req) => requests.push(req.url()));
  page.on('pageerror', (err) => pageErrors.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') consoleErrors.push(msg.text());
  });
  page.on('dialog', (d) => d.dismiss()); // no alert()/confirm() is expected; never hang on one
  page.setDefaultTimeout(15_000);

  const response = await page.goto(`${base}/console/`, { waitUntil: 'load' });
  check(response.status() === 200, 'GET /console/ answers 200', response.status());
  const headers = response.headers();
  const csp = headers['content-security-policy'] || '';
  check(csp.includes("script-src 'self'"), "Content-Security-Policy has script-src 'self'", csp);
  check(csp.includes("frame-ancestors 'none'"), "Content-Security-Policy has frame-ancestors 'none'", csp);
  check((headers['x-frame-options'] || '').toUpperCase() === 'DENY', 'X-Frame-Options is DENY',
    headers['x-frame-options']);
  const label = await page.evaluate(() => {
    const input = document.querySelector('input[type="password"]');
    return input && input.labels.length ? input.labels[0].textContent.trim() : null;
  });
  check(label === 'API key', 'the password input is labelled "API key"', label);
  await page.screenshot({ path: path.join(shots, 'sign-in.png'), fullPage: true });
  ok('screenshot sign-in.png');

  step('4. Sign-in, overview, dead letters and redelivery');
  await ui.signIn('WRONGKEY');
  const refused = await waitFor('an error on the sign-in form', () => page.evaluate(() => {
    const el = document.querySelector('#sign-in [role="alert"]');
    return el && !el.hidden && el.textContent.trim() ? el.textContent.trim() : null;
  }));
  ok(`a wrong key is refused: "${refused}"`);
  check(await page.evaluate(() => sessionStorage.length === 0), 'a refused key is not kept');

  await ui.signIn(OPERATOR);
  await ui.view('Overview');
  await ui.find('Sign out').then((el) => check(el !== null, 'a Sign out button is shown'));
  const who = await page.evaluate(() => document.getElementById('who').textContent.replace(/\s+/g, ' '));
  check(who.includes('ops') && who.includes('operator'), 'the header shows the name and role', who);
  check(await page.evaluate(() => sessionStorage.length === 1), 'the key is kept in sessionStorage');
  check(await page.evaluate(() => document.cookie === ''), 'no cookie is set');
  const overviewText = await page.evaluate(() => document.getElementById('view').textContent);
  for (const part of ['Jobs by status', 'Queue by priority', 'Oldest queued', 'Callbacks', 'Throughput']) {
    check(overviewText.includes(part), `the overview shows "${part}"`);
  }
  const chart = await page.evaluate(() => {
    const svg = document.querySelector('svg.chart');
    return svg ? { lines: svg.querySelectorAll('polyline').length, text: svg.textContent } : null;
  });
  if (chart) {
    check(chart.lines === 2 && chart.text.includes('accepted') && chart.text.includes('completed'),
      'the rate chart has two lines and a legend', JSON.stringify(chart));
  } else {
    ok('no rate points yet: the chart says so');
  }
  await page.screenshot({ path: path.join(shots, 'overview.png'), fullPage: true });
  ok('screenshot overview.png');

  await ui.nav('Dead letters');
  check(page.url().endsWith('#/dead-letters'), 'the hash names the view', page.url());
  await ui.waitRow('dl-1');
  check(await ui.find('Redeliver all') !== null, 'an operator sees Redeliver all');
  await page.screenshot({ path: path.join(shots, 'dead-letters.png'), fullPage: true });
  ok('screenshot dead-letters.png');
  aAnswers = 200;
  ok('receiver A answers 200 from now on');
  await ui.click('Redeliver', { row: 'dl-1' });
  const redeliverQuestion = await ui.confirm();
  check(redeliverQuestion.includes('dl-1'), 'the dialog names the job');
  await waitFor('receiver A to get dl-1 and answer 200',
    () => A.posts('dl-1').some((r) => r.answered === 200), 15_000, 100);
  ok('receiver A got a POST with id dl-1 and answered 200');
  ok(`status message: "${await ui.statusMessage()}"`);
  await waitFor('dl-1 callback.state delivered', async () => (await poll('dl-1')).callback.state === 'delivered');
  ok('dl-1 callback.state is delivered');

  step('5. Jobs: filter, reload, cancel a queued job, job detail');
  await submit('busy-1');
  await submit('queued-1');
  await waitFor('busy-1 running', async () => (await poll('busy-1')).status === 'running', 10_000, 100);
  check((await poll('queued-1')).status === 'queued', 'queued-1 is queued behind busy-1');
  await ui.nav('Jobs');
  await ui.selectByLabel('Status', 'queued');
  await ui.stale();
  await ui.click('Apply');
  await waitFor('status=queued in the hash', () => page.url().includes('status=queued'));
  ok(`the filter is kept in the URL: ${page.url().slice(base.length)}`);
  await ui.view('Jobs');
  await page.reload({ waitUntil: 'load' });
  await ui.view('Jobs');
  const kept = await page.evaluate(() => document.querySelector('select[name="status"]').value);
  check(kept === 'queued', 'after a reload the console is still signed in with the filter kept', kept);
  await ui.waitRow('queued-1');
  check((await ui.rowTexts('busy-1')).length === 0, 'the running busy-1 is filtered out');
  await ui.click('Cancel', { row: 'queued-1' });
  await ui.confirm();
  await waitFor('queued-1 cancelled', async () => (await poll('queued-1')).status === 'cancelled', 5000);
  ok('GET /v1/inferences/queued-1 says cancelled');
  ok(`status message: "${await ui.statusMessage()}"`);
  await waitFor('queued-1 to leave the queued list', async () => (await ui.rowTexts('queued-1')).length === 0);
  ok('the list refreshed: queued-1 is no longer queued');

  await ui.nav('Jobs');
  await ui.waitRow('queued-1');
  await page.screenshot({ path: path.join(shots, 'jobs.png'), fullPage: true });
  ok('screenshot jobs.png');
  await ui.stale();
  await ui.click('dl-1', { tag: 'a' });
  await ui.view('Job');
  const attempts = await waitFor('the attempt table', () => page.evaluate(() => {
    const table = [...document.querySelectorAll('table')]
      .find((t) => t.caption && t.caption.textContent.trim() === 'Delivery attempts');
    if (!table) return null;
    return [...table.tBodies[0].rows].filter((tr) => !tr.classList.contains('empty'))
      .map((tr) => [...tr.cells].map((td) => td.textContent.trim()));
  }));
  log(`  attempts: ${JSON.stringify(attempts)}`);
  check(attempts.length >= 2, 'the attempt table shows at least 2 attempts', attempts.length);
  check(attempts.some((cells) => cells.some((c) => /\b500\b/.test(c))), 'one attempt got HTTP 500');
  check(attempts.some((cells) => cells.some((c) => /\b200\b/.test(c))), 'one attempt got HTTP 200');
  check(attempts.every((cells) => cells.some((c) => /\bv1\b/.test(c))), 'every attempt was signed (v1)');
  const detailText = await page.evaluate(() => document.getElementById('view').textContent);
  for (const part of ['Created', 'Started', 'Finished', 'Inference time', `${A.origin}/hook`, 'completed',
    'model sleep/1']) {
    check(detailText.includes(part), `the job detail shows "${part}"`);
  }
  await page.screenshot({ path: path.join(shots, 'job.png'), fullPage: true });
  ok('screenshot job.png');

  step('6. Endpoints: pause and resume a receiver; servers');
  await submit('p-1', { callback_url: `${B.origin}/hook` });
  await waitFor('receiver B to get p-1', () => B.posts('p-1').length > 0, 20_000, 100);
  await waitFor('p-1 callback.state delivered', async () => (await poll('p-1')).callback.state === 'delivered');
  ok('p-1 was delivered to B');
  await ui.nav('Endpoints');
  await ui.waitRow(B.origin);
  await ui.click('Pause', { row: B.origin });
  const pauseQuestion = await ui.confirm();
  check(pauseQuestion.includes(B.origin), 'the dialog names the origin');
  await waitFor(`a Resume button in the row of ${B.origin}`, () => ui.find('Resume', { row: B.origin }));
  ok('the row now offers Resume');
  await page.screenshot({ path: path.join(shots, 'endpoints.png'), fullPage: true });
  ok('screenshot endpoints.png');
  await submit('p-2', { callback_url: `${B.origin}/hook` });
  await waitFor('p-2 to succeed', async () => (await poll('p-2')).status === 'succeeded', 15_000, 100);
  await sleep(3000);
  check(B.posts('p-2').length === 0, 'B did not get p-2 while paused');
  const p2 = await poll('p-2');
  check(p2.callback.state === 'pending', 'p-2 callback.state is pending', p2.callback.state);
  await ui.click('Resume', { row: B.origin });
  await ui.confirm();
  const resumedAt = Date.now();
  // Held callbacks come back every --callback-pause-recheck (2 s here): the resume shows soon.
  await waitFor('receiver B to get p-2 after the resume', () => B.posts('p-2').length > 0, 15_000, 100);
  ok(`B got p-2 ${((Date.now() - resumedAt) / 1000).toFixed(1)} s after the resume`);
  await waitFor(`a Pause button in the row of ${B.origin}`, async () => {
    await ui.stale();
    await ui.click('Refresh');
    await ui.view('Endpoints');
    return ui.find('Pause', { row: B.origin });
  });
  ok('the row offers Pause again');

  await ui.nav('Servers');
  const servers = await page.evaluate(() => [...document.querySelectorAll('#view tbody tr')]
    .map((tr) => tr.textContent.replace(/\s+/g, ' ').trim()));
  log(`  servers: ${JSON.stringify(servers)}`);
  check(servers.filter((t) => t.includes('this server')).length === 1, 'one server is marked as this server');
  await page.screenshot({ path: path.join(shots, 'servers.png'), fullPage: true });
  ok('screenshot servers.png');

  step('6b. Models: a version loaded, canaried, promoted, and the old one unloaded');
  fs.mkdirSync(path.join(server.models, 'sleep', '2'), { recursive: true });
  fs.writeFileSync(path.join(server.models, 'sleep', '2', 'config.json'), '{"backend": "sleep", "seconds": 2}');
  const sleepModel = async () => {
    const r = await call('GET', '/v1/models/sleep', { key: OPERATOR });
    if (r.status !== 200) throw new Error(`GET /v1/models/sleep: HTTP ${r.status} ${r.text}`);
    return r.json;
  };
  const versionState = async (v) => ((await sleepModel()).versions.find((x) => x.version === v) || {}).state;
  const refreshModels = async () => {
    await ui.stale();
    await ui.click('Refresh');
    await ui.view('Models');
  };
  // Waits until the view, refreshed, shows `version` ready.
  const readyInView = (version) => waitFor(`version ${version} ready in the view`, async () => {
    await refreshModels();
    const rows = await ui.rowTexts(version);
    return rows.length && /ready/.test(rows[0]);
  });
  // Whether the server logged a drain with `queued` (model_draining).
  const drainedWith = (queued) => new RegExp(
    `"model_draining".*"queued":"${queued}"|"queued":"${queued}".*"model_draining"`).test(
    fs.readFileSync(server.logPath, 'utf8'));
  await ui.nav('Models');
  const [v1Row] = await ui.waitRow('1');
  check(/ready/.test(v1Row) && /default/.test(v1Row), 'version 1 is ready and the route\'s default', v1Row);
  check((await ui.count(['Unload']))['Unload'] === 0, 'the routed version offers no Unload');
  await page.type('form.load-form input[name="version"]', '2');
  await ui.click('Load version');
  const loadQuestion = await ui.confirm();
  check(loadQuestion.includes('version 2 of sleep'), 'the dialog names the version', loadQuestion);
  await waitFor('version 2 ready', async () => (await versionState('2')) === 'ready', 20_000);
  await readyInView('2');
  const before = (await sleepModel()).generation;
  await ui.selectByLabel('Canary version', '2');
  await ui.click('Set route');
  const routeQuestion = await ui.confirm();
  check(/10 % of new jobs to version 2/.test(routeQuestion), 'the dialog says the canary', routeQuestion);
  await waitFor('the canary in the API', async () => {
    const m = await sleepModel();
    return m.split.length === 1 && m.split[0].version === '2' && m.split[0].percent === 10 &&
      m.generation === before + 1;
  });
  ok('the route sends 10 % to version 2, one generation on');
  await waitFor('the canary in the view', async () => /10 %/.test((await ui.rowTexts('2'))[0] || ''));
  await ui.selectByLabel('Default version', '2');
  await ui.selectByLabel('Canary version', '');
  await ui.click('Set route');
  const promoteQuestion = await ui.confirm();
  check(/version 2 for every new job/.test(promoteQuestion), 'the dialog says the promotion', promoteQuestion);
  await waitFor('the promotion in the API', async () => {
    const m = await sleepModel();
    return m.default_version === '2' && m.split.length === 0;
  });
  ok('version 2 is the default');
  // Unloaded with its queued jobs sent to the route, loaded back, then unloaded with them run first.
  await ui.view('Models');
  await ui.click('Reroute', { row: '1', timeoutMs: 20_000 });
  const rerouteQuestion = await ui.confirm();
  check(rerouteQuestion.includes('Unload version 1 of sleep') && rerouteQuestion.includes('to the route'),
    'the dialog says where the queued jobs go', rerouteQuestion);
  await waitFor('version 1 unloaded', async () => (await versionState('1')) === 'unloaded', 60_000);
  check(drainedWith('reroute'), 'the server drained version 1 with queued=reroute');
  await refreshModels();
  await ui.click('Load', { row: '1' });
  check((await ui.confirm()).includes('version 1 of sleep'), 'the dialog names the version loaded back');
  await waitFor('version 1 ready again', async () => (await versionState('1')) === 'ready', 20_000);
  await readyInView('1');
  check((await ui.count(['Reroute']))['Reroute'] === 1, 'only the unrouted version offers Reroute');
  await ui.click('Unload', { row: '1' });
  const unloadQuestion = await ui.confirm();
  check(unloadQuestion.includes('Unload version 1 of sleep') && unloadQuestion.includes('run on it first'),
    'the dialog names what is unloaded', unloadQuestion);
  await waitFor('version 1 unloaded', async () => (await versionState('1')) === 'unloaded', 60_000);
  check(drainedWith('finish'), 'the server drained version 1 with queued=finish');
  ok('version 1 drained and was unloaded, once with its jobs rerouted and once with them run first');
  const logged = fs.readFileSync(server.logPath, 'utf8');
  for (const action of ['load_model_version', 'set_model_route', 'unload_model_version']) {
    check(new RegExp(`"operator_action".*"action":"${action}"|"action":"${action}".*"operator_action"`).test(logged),
      `the server logged ${action}`);
  }
  await refreshModels();
  await page.screenshot({ path: path.join(shots, 'models.png'), fullPage: true });
  ok('screenshot models.png');

  step('7. Redeliver all asks first; a viewer gets no action buttons');
  aAnswers = 500;
  await submit('dl-2', { callback_url: `${A.origin}/hook` });
  await waitFor('dl-2 callback.state failed', async () => (await poll('dl-2')).callback.state === 'failed', 20_000);
  ok('dl-2 is a dead letter');
  await ui.nav('Dead letters');
  await ui.waitRow('dl-2');
  await ui.click('Redeliver all');
  const allQuestion = await ui.confirm('Back');
  check(/Redeliver all 1 dead letter\b/.test(allQuestion), 'the dialog says how many will be redelivered (dry run)');
  await sleep(1000);
  check((await poll('dl-2')).callback.state === 'failed', 'Back redelivered nothing');
  // Four jobs of 2 s each keep the queue busy for the viewer's look at Jobs (about 8 s).
  for (const id of ['v-1', 'v-2', 'v-3', 'v-4']) await submit(id);

  await ui.click('Sign out');
  await page.waitForSelector('input[type="password"]', { visible: true });
  check(await page.evaluate(() => sessionStorage.length === 0), 'Sign out clears sessionStorage');
  await ui.signIn(ALICE);
  const tenantRefused = await waitFor('an error for a tenant key', () => page.evaluate(() => {
    const el = document.querySelector('#sign-in [role="alert"]');
    return el && !el.hidden && el.textContent.trim() ? el.textContent.trim() : null;
  }));
  ok(`an ordinary API key is refused on the form: "${tenantRefused}"`);
  await ui.signIn(VIEWER);
  const whoViewer = await waitFor('the header to show the viewer', () => page.evaluate(() => {
    const el = document.getElementById('who');
    return el && !el.hidden && el.textContent.includes('viewer') ? el.textContent.replace(/\s+/g, ' ') : null;
  }));
  check(whoViewer.includes('watch'), 'the header shows the viewer\'s name and role', whoViewer);
  await ui.view('Dead letters');
  ok('signing in again returns to the view in the URL');
  for (const [nav, rowId] of [['Jobs', 'v-4'], ['Dead letters', 'dl-2'], ['Endpoints', B.origin],
    ['Models', '2']]) {
    await ui.nav(nav);
    const [row] = await ui.waitRow(rowId);
    if (nav === 'Jobs') check(/queued|running/.test(row), 'v-4 is still queued or running (an operator would see Cancel)', row);
    const counts = await ui.count(ACTION_BUTTONS);
    check(Object.values(counts).every((n) => n === 0), `${nav}: no action buttons for a viewer`,
      JSON.stringify(counts));
  }
  const pause = await call('POST', '/v1/callback-endpoints/pause', { key: VIEWER, body: { origin: B.origin } });
  check(pause.status === 403, 'POST /v1/callback-endpoints/pause with the viewer key: 403', pause.status);
  const all = await call('POST', '/v1/console/dead-letters/redeliver', { key: VIEWER, body: { dry_run: false } });
  check(all.status === 403, 'POST /v1/console/dead-letters/redeliver with the viewer key: 403', all.status);
  check((await poll('dl-2')).callback.state === 'failed', 'the viewer changed nothing');

  step('8. Keys that are not console keys');
  const tenant = await call('GET', '/v1/console/session', { key: ALICE });
  check(tenant.status === 401 || tenant.status === 403, 'GET /v1/console/session with a tenant key: 401 or 403',
    tenant.status);
  const none = await call('GET', '/v1/console/overview');
  check(none.status === 401, 'GET /v1/console/overview without a key: 401', none.status);
  const dataRoute = await call('GET', '/v1/console/overview', { key: OPERATOR });
  check(/no-store/.test(dataRoute.headers.get('cache-control') || ''), 'console data is sent with Cache-Control: no-store',
    dataRoute.headers.get('cache-control'));

  step('Whole run');
  const origin = new URL(base).origin;
  const foreign = requests.filter((u) => !u.startsWith('data:') && new URL(u).origin !== origin);
  check(foreign.length === 0, `all ${requests.length} requests of the page went to ${origin}`, foreign.join(', '));
  check(pageErrors.length === 0, 'no script errors in the page', pageErrors.join(' | '));
  const cspErrors = consoleErrors.filter((t) => /Content Security Policy|Refused to/i.test(t));
  check(cspErrors.length === 0, 'nothing was refused by the Content-Security-Policy', cspErrors.join(' | '));
  log(`\nconsole_test: PASS (screenshots in ${shots})`);
}

const state = { server: null };

async function fail(err) {
  if (finished) return;
  log(`\nconsole_test: FAIL: ${err instanceof CheckFailed ? err.message : err.stack || err}`);
  if (state.server) {
    try {
      const text = fs.readFileSync(state.server.logPath, 'utf8').split('\n').slice(-40).join('\n');
      log(`--- the last lines of rebound-server's output:\n${text}`);
    } catch {
      // no log
    }
  }
  await finish(1);
}

process.on('unhandledRejection', (err) => fail(err));
main().then(() => finish(0), fail);
