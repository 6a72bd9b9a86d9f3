// BullMQ's side of bench/redis_peers.py: N no-op jobs through one Queue and one Worker on a given
// Redis, each optionally POSTing {"id", "result"} to a receiver, timed from the first add to the
// last job completed.
//
//   node bench.mjs --redis-port 6379 --jobs 10000 [--concurrency 64] [--chunk 1000]
//                  [--callback-url http://127.0.0.1:PORT/v1/results] [--timeout 300]
//
// The handshake with the caller, one JSON line each way on stdout and stdin, keeps Node's start,
// the module loading and the connections out of the measured window: it prints {"ready": ...} once
// the Queue and the Worker are connected, waits for a "go" line, submits with Queue.addBulk in
// chunks, and prints {"jobs", "completed", "failed", "seconds", ...} when every job has completed
// or failed. It then waits for stdin to close (the caller reads Redis's counters meanwhile) before
// it closes its connections and exits. Completed jobs are kept, as BullMQ does by default.
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import readline from 'node:readline';
import { parseArgs } from 'node:util';
import { Queue, Worker } from 'bullmq';

const { values: opts } = parseArgs({
  options: {
    'redis-port': { type: 'string' },
    jobs: { type: 'string', default: '10000' },
    concurrency: { type: 'string', default: '64' },
    chunk: { type: 'string', default: '1000' },
    'callback-url': { type: 'string' },
    timeout: { type: 'string', default: '300' },
    queue: { type: 'string', default: 'bench' },
  },
});
if (!opts['redis-port']) {
  console.error('bench.mjs: --redis-port is required');
  process.exit(2);
}
const jobs = Number(opts.jobs);
const concurrency = Number(opts.concurrency);
const chunk = Number(opts.chunk);
const callbackUrl = opts['callback-url'];
const bullmqVersion = JSON.parse(
  readFileSync(new URL('./node_modules/bullmq/package.json', import.meta.url), 'utf8')).version;

const connection = { host: '127.0.0.1', port: Number(opts['redis-port']) };

// One kept-alive connection per job in flight, as rebound keeps its callback connections open.
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });

// POSTs the body; resolves on a 2xx, rejects otherwise (the job then fails, as a callback would).
function post(url, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(url, {
      method: 'POST',
      agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) },
    }, (res) => {
      res.resume();  // read the answer to the end, so that the connection is reused
      res.on('end', () => {
        if (res.statusCode >= 200 && res.statusCode < 300) resolve();
        else reject(new Error(`receiver answered ${res.statusCode}`));
      });
      res.on('error', reject);
    });
    req.setTimeout(10_000, () => req.destroy(new Error('callback timed out')));  // rebound's default
    req.on('error', reject);
    req.end(data);
  });
}

// The echo model's no-op: the job's input back as its result (null: the jobs carry none).
const processor = callbackUrl
  ? async (job) => {
    const result = job.data.input ?? null;
    await post(callbackUrl, { id: job.data.id, result });
    return result;
  }
  : async (job) => job.data.input ?? null;

let completed = 0;
let failed = 0;
let firstError = null;
let started = 0;
let ended = 0;
let allDone;
const finished = new Promise((resolve) => { allDone = resolve; });
function settled() {
  if (completed + failed === jobs) {
    ended = performance.now();
    allDone();
  }
}

const queue = new Queue(opts.queue, { connection });
const worker = new Worker(opts.queue, processor, { connection, concurrency });
worker.on('completed', () => { ++completed; settled(); });
worker.on('failed', (_job, err) => {
  ++failed;
  firstError ??= String(err?.message ?? err);
  settled();
});
worker.on('error', (err) => { firstError ??= String(err?.message ?? err); });

await queue.waitUntilReady();
await worker.waitUntilReady();

const input = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
console.log(JSON.stringify({ ready: true, bullmq: bullmqVersion, node: process.version }));
const go = await input.next();
if (go.done) process.exit(1);  // the caller went away

started = performance.now();
for (let first = 0; first < jobs; first += chunk) {
  const batch = [];
  for (let i = first; i < Math.min(jobs, first + chunk); ++i)
    batch.push({ name: 'noop', data: { id: `job-${i}` } });
  await queue.addBulk(batch);
}
const submitted = performance.now();

const timeoutMs = Number(opts.timeout) * 1000;
const timedOut = await Promise.race([
  finished.then(() => false),
  new Promise((resolve) => setTimeout(resolve, timeoutMs, true).unref()),
]);
console.log(JSON.stringify({
  jobs,
  completed,
  failed,
  timed_out: timedOut,
  seconds: ((timedOut ? performance.now() : ended) - started) / 1000,
  submit_seconds: (submitted - started) / 1000,
  first_error: firstError,
  bullmq: bullmqVersion,
  node: process.version,
}));

for (;;) {  // until stdin closes
  const line = await input.next();
  if (line.done) break;
}
await worker.close(timedOut);  // forced only when jobs are still in flight
await queue.close();
agent.destroy();
process.exit(timedOut || failed > 0 ? 1 : 0);
