// The Postgres job queues' side of bench/postgres_peers.py: N no-op jobs through graphile-worker or
// pg-boss on a given database, each optionally POSTing {"id", "result"} to a receiver, timed from
// the first insert to the moment the database holds every job as completed.
//
//   node bench.mjs --system graphile-worker|pg-boss --connection postgres://... --jobs 10000
//                  [--callback-url http://127.0.0.1:PORT/v1/results] [--timeout 300]
//
// Tuned as their documents advise for throughput: graphile-worker with a local queue of 500 jobs
// fetched at once and completions batched (completeJobBatchDelay 0), 64 jobs at once; pg-boss with
// 8 work loops fetching 500 jobs a poll (batchSize), polling every half second (its shortest).
//
// The handshake with the caller, one JSON line each way on stdout and stdin, keeps Node's start,
// the schema's installation and the connections out of the measured window: it prints
// {"ready": ...} once the queue runs, waits for a "go" line, inserts in chunks of 1,000, and prints
// {"jobs", "completed", "seconds", ...} once the database counts every job completed
// (graphile-worker deletes a completed job; pg-boss marks it `completed`), polled every 20 ms. It
// then waits for stdin to close (the caller reads Postgres's CPU meanwhile) before it stops.
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import readline from 'node:readline';
import { parseArgs } from 'node:util';
import pg from 'pg';

const { values: opts } = parseArgs({
  options: {
    system: { type: 'string' },
    connection: { type: 'string' },
    jobs: { type: 'string', default: '10000' },
    'callback-url': { type: 'string' },
    timeout: { type: 'string', default: '300' },
  },
});
if (!opts.connection || !['graphile-worker', 'pg-boss'].includes(opts.system)) {
  console.error('bench.mjs: --system graphile-worker|pg-boss and --connection are required');
  process.exit(2);
}
const jobs = Number(opts.jobs);
const callbackUrl = opts['callback-url'];
const version = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url), 'utf8')).version;

const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
// POSTs the body; resolves on a 2xx, rejects otherwise (the job then fails, as a callback would).
function post(url, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      method: 'POST',
      agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) },
    }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode >= 200 && res.statusCode < 300
        ? resolve() : reject(new Error(`receiver answered ${res.statusCode}`))));
      res.on('error', reject);
    });
    req.setTimeout(10_000, () => req.destroy(new Error('callback timed out')));
    req.on('error', reject);
    req.end(data);
  });
}
// The echo model's no-op, and its callback when there is a receiver.
async function handle(id, input) {
  const result = input ?? null;
  if (callbackUrl) await post(callbackUrl, { id, result });
  return result;
}

let firstError = null;
let handled = 0;
let stop;
let insert;
let completedCount;
let versions;

if (opts.system === 'graphile-worker') {
  const { run, makeWorkerUtils, Logger } = await import('graphile-worker');
  // Its log lines would share stdout with the handshake: errors only, to stderr.
  const logger = new Logger(() => (level, message) => {
    if (level === 'error') console.error(message);
  });
  const runner = await run({
    connectionString: opts.connection,
    concurrency: 64,
    noHandleSignals: true,
    pollInterval: 100,
    preset: { worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
    logger,
    taskList: {
      noop: async (payload) => {
        await handle(payload.id, payload.input);
        ++handled;
      },
    },
  });
  runner.events.on('job:error', ({ error }) => { firstError ??= String(error?.message ?? error); });
  const utils = await makeWorkerUtils({ connectionString: opts.connection, logger });
  insert = (batch) => utils.addJobs(batch.map((id) => ({ identifier: 'noop', payload: { id } })));
  completedCount = async (client) =>
    jobs - Number((await client.query('select count(*) as n from graphile_worker._private_jobs')).rows[0].n);
  stop = async () => { await utils.release(); await runner.stop(); };
  versions = { 'graphile-worker': version('graphile-worker') };
} else {
  const { default: PgBoss } = await import('pg-boss');
  const boss = new PgBoss({ connectionString: opts.connection, max: 20 });
  boss.on('error', (e) => { firstError ??= String(e?.message ?? e); });
  await boss.start();
  await boss.createQueue('bench');
  for (let loop = 0; loop < 8; ++loop) {
    await boss.work('bench', { batchSize: 500, pollingIntervalSeconds: 0.5 }, async (batch) => {
      await Promise.all(batch.map((job) => handle(job.data.id, job.data.input)));
      handled += batch.length;
    });
  }
  insert = (batch) => boss.insert(batch.map((id) => ({ name: 'bench', data: { id } })));
  completedCount = async (client) =>
    Number((await client.query(
      "select count(*) as n from pgboss.job where name = 'bench' and state = 'completed'")).rows[0].n);
  stop = async () => { await boss.stop({ graceful: false, wait: true }); };
  versions = { 'pg-boss': version('pg-boss') };
}

const counter = new pg.Client({ connectionString: opts.connection });
await counter.connect();
const input = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
console.log(JSON.stringify({ ready: true, ...versions, node: process.version }));
const go = await input.next();
if (go.done) process.exit(1);

const started = performance.now();
for (let first = 0; first < jobs; first += 1000) {
  const batch = [];
  for (let i = first; i < Math.min(jobs, first + 1000); ++i) batch.push(`job-${i}`);
  await insert(batch);
}
const submitted = performance.now();
const deadline = started + Number(opts.timeout) * 1000;
let completed = 0;
while ((completed = await completedCount(counter)) < jobs && performance.now() < deadline) {
  await new Promise((resolve) => setTimeout(resolve, 20));
}
const ended = performance.now();
console.log(JSON.stringify({
  jobs, completed, handled, timed_out: completed < jobs, seconds: (ended - started) / 1000,
  submit_seconds: (submitted - started) / 1000, first_error: firstError,
}));
for await (const _ of input) { /* until the caller closes stdin */ }
await counter.end();
await stop();
process.exit(0);
