// The TypeScript client (clients/typescript) against a real rebound-server and a real receiver
// on loopback: compiled with tsc, then submit, wait, run, cancel, batches, dead letters and
// redelivery, errors, retries through a proxy that answers 503 and one that drops the connection
// after the server accepted (never a second job), a wait that times out without cancelling, and
// verifyWebhook on the callbacks the server signed, checked against the official Standard
// Webhooks library (v1: both accept and refuse the same), and an Express receiver with the
// middleware.
//
//   node typescript_client.mjs REBOUND_SERVER NODE_TOOLS_DIR
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const [serverBin, tools] = process.argv.slice(2);
const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const SECRET = "whsec_" + Buffer.from("rebound typescript client key!!!").toString("base64");
const SIGNING_KEY = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
const PUBLIC_KEY = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
const API_KEY = "k-typescript";
const children = [];

function fail(message) {
  console.log("FAIL:", message);
  for (const c of children) c.kill("SIGKILL");
  process.exit(1);
}
const check = (ok, message) => ok || fail(message);
async function rejects(promise, predicate, what) {
  try {
    await promise;
  } catch (e) {
    if (predicate(e)) return e;
    fail(`${what}: rejected with ${e}`);
  }
  fail(`${what}: not rejected`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function waitFor(predicate, what, limitMs = 20000) {
  const deadline = Date.now() + limitMs;
  while (Date.now() < deadline) {
    if (await predicate()) return;
    await sleep(50);
  }
  fail(`timed out waiting for ${what}`);
}

// Compiled as a user would, into a folder of its own.
const out = mkdtempSync(path.join(os.tmpdir(), "rebound-ts-"));
process.on("exit", () => rmSync(out, { recursive: true, force: true }));
execFileSync(path.join(tools, "node_modules/.bin/tsc"),
             ["-p", path.join(root, "clients/typescript"), "--outDir", out,
              "--typeRoots", path.join(tools, "node_modules/@types"), "--types", "node"],
             { stdio: "inherit" });
const { Rebound, ReboundError, WaitTimeout, WebhookVerificationError, WebhookVerifier, verifyWebhook, expressWebhook } =
  await import(pathToFileURL(path.join(out, "index.js")).href);
const requireTool = createRequire(path.join(tools, "package.json"));
const { Webhook } = requireTool("standardwebhooks");
const express = requireTool("express");

// A rebound-server on a free loopback port with these arguments: its port once it listens.
function spawnServer(what, args) {
  return new Promise((resolve) => {
    const proc = spawn(serverBin, ["serve", "--host", "127.0.0.1", "--port", "0", "--store", "memory",
      "--api-key", "acme:" + API_KEY, "--log-level", "warn", ...args], { stdio: ["ignore", "pipe", "pipe"] });
    children.push(proc);
    let seen = "";
    proc.stdout.on("data", (chunk) => {
      seen += chunk;
      const m = /listening on 127\.0\.0\.1:(\d+)/.exec(seen);
      if (m) resolve(Number(m[1]));
    });
    proc.stderr.resume();
    proc.on("exit", (code) => fail(`rebound-server (${what}) ended: ${code}`));
  });
}

function startServer(model, ...extra) {
  return spawnServer(model, ["--model", model, "--allow-private-callbacks", "--signing-secret", SECRET,
    "--signing-key", SIGNING_KEY, "--max-tries", "1", ...extra]);
}

const calls = []; // { path, headers, body (Buffer) }
const receiver = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    calls.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks) });
    res.writeHead(req.url === "/fail" ? 500 : 200, { "Content-Length": "0" }).end();
  });
});
await new Promise((r) => receiver.listen(0, "127.0.0.1", r));
const hook = `http://127.0.0.1:${receiver.address().port}`;
const bodiesOf = (id) => calls.filter((c) => JSON.parse(c.body).id === id);

// A proxy: the first `busy` requests get 503 queue_full (Retry-After: 0); the first `drops`
// submissions are forwarded (the server takes them) and their connection closed unanswered (with
// `gateway`, answered 504 gateway_timeout instead, as nginx answers an upstream gone quiet).
function proxy(port, state) {
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      state.seen = (state.seen ?? 0) + 1;
      (state.requests ??= []).push({ method: req.method, url: req.url, ifMatch: req.headers["if-match"] });
      if (state.hang) return; // never answered
      if (state.html) {
        res.writeHead(200, { "Content-Type": "text/html" }).end("<html>Welcome to nginx!</html>");
        return;
      }
      if (state.busy > 0 && state.busyStatus === 502) { // a gateway that could not reach the server
        state.busy -= 1;
        res.writeHead(502, { "Content-Type": "application/json" })
          .end('{"error":{"code":"bad_gateway","message":"no upstream (the test proxy)"}}');
        return;
      }
      if (state.busy > 0) {
        state.busy -= 1;
        res.writeHead(503, { "Retry-After": "0", "Content-Type": "application/json" })
          .end('{"error":{"code":"queue_full","message":"busy (the test proxy)"}}');
        return;
      }
      const drop = req.method === (state.dropMethod ?? "POST") && state.drops > 0;
      if (drop) state.drops -= 1;
      const headers = { ...req.headers };
      delete headers.host;
      const upstream = http.request({ host: "127.0.0.1", port, method: req.method, path: req.url, headers },
        (answer) => {
          const body = [];
          answer.on("data", (c) => body.push(c));
          answer.on("end", () => {
            if (drop && state.gateway) {
              res.writeHead(504, { "Content-Type": "application/json" })
                .end('{"error":{"code":"gateway_timeout","message":"the upstream went quiet"}}');
              return;
            }
            if (drop) return req.socket.destroy();
            res.writeHead(answer.statusCode, answer.headers).end(Buffer.concat(body));
          });
        });
      upstream.end(Buffer.concat(chunks));
    });
  });
  return new Promise((r) => server.listen(0, "127.0.0.1", () => r(server.address().port)));
}

async function acceptedTotal(port) {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` } });
  return Number(/^rebound_jobs_accepted_total (\d+)/m.exec(await res.text())[1]);
}

const echoPort = await startServer("echo");
const slowPort = await startServer("sleep:2", "--workers", "1");
const r = new Rebound({ baseUrl: `http://127.0.0.1:${echoPort}`, apiKey: API_KEY });

// Submit and wait; run; the poll answer.
const job = await r.submit({ x: 1 }, { id: "t-1", callbackUrl: hook + "/ok" });
check(job.id === "t-1" && job.status === "queued", `submit answered ${JSON.stringify(job)}`);
const done = await r.wait("t-1", { timeout: 10 });
check(done.status === "succeeded" && done.result.x === 1, `wait answered ${JSON.stringify(done)}`);
const ran = await r.run([5.1, 3.5], { timeout: 10 });
check(ran.status === "succeeded" && ran.result[1] === 3.5 && /^[0-9a-f-]{36}$/.test(ran.id), `run: ${JSON.stringify(ran)}`);
check((await r.get("t-1")).callback.url === hook + "/ok", "the poll answer's callback");

// Errors.
const conflict = await rejects(r.submit({ x: 2 }, { id: "t-1" }), (e) => e instanceof ReboundError, "a conflict");
check(conflict.status === 409 && conflict.code === "id_conflict", `conflict: ${conflict}`);
check((await r.submit({ x: 1 }, { id: "t-1", callbackUrl: hook + "/ok" })).id === "t-1", "an identical resubmission");
check((await rejects(r.get("nope"), (e) => e instanceof ReboundError, "get")).code === "not_found", "not_found");
check((await rejects(r.submit(1, { priority: 42 }), (e) => e instanceof ReboundError, "a bad field")).field === "priority", "invalid_field");
check((await rejects(r.cancel("t-1"), (e) => e instanceof ReboundError, "cancel")).code === "already_finished", "already_finished");
for (const bad of ["../metrics", "victim#x", "victim?y", "victim%32", ".", "..", ""]) {
  await rejects(r.get(bad), (e) => e instanceof TypeError, `the id ${bad}`);
  await rejects(r.cancel(bad), (e) => e instanceof TypeError, `cancel ${bad}`);
}
const wrong = new Rebound({ baseUrl: `http://127.0.0.1:${echoPort}`, apiKey: "wrong", maxRetries: 0 });
check((await rejects(wrong.get("t-1"), (e) => e instanceof ReboundError, "a wrong key")).status === 401, "unauthorized");

// Batches.
const results = await r.submitBatch([{ id: "tb-1", input: 1 }, { id: "tb-2", input: 2, priority: 42 }, { input: 3 }]);
check(results.map((x) => x.status).join() === "202,422,202", `batch: ${JSON.stringify(results)}`);
check(results[1].error.field === "priority", "a batch refusal's field");

// Dead letters and redelivery.
for (let n = 0; n < 3; ++n) await r.submit(n, { id: `tdl-${n}`, callbackUrl: hook + "/fail" });
const letters = async () => { const ids = []; for await (const j of r.deadLetters({ pageSize: 2 })) ids.push(j.id); return ids.sort(); };
await waitFor(async () => (await letters()).length === 3, "three dead letters");
check((await letters()).join() === "tdl-0,tdl-1,tdl-2", "dead letters");
const again = await r.redeliver("tdl-1");
check(again.callback.attempts >= 1, `redeliver: ${JSON.stringify(again.callback)}`);
await waitFor(() => bodiesOf("tdl-1").length === 2, "the redelivered callback");

// Verifying the callbacks the server signed, beside the official library.
const { headers, body } = bodiesOf("t-1")[0];
const official = new Webhook(SECRET);
const payload = await verifyWebhook({ secrets: [SECRET] }, headers, body);
check(JSON.stringify(payload) === JSON.stringify(official.verify(body, headers)), "v1: ours and the official library agree");
check((await verifyWebhook({ keys: await r.webhookKeys() }, headers, body)).id === "t-1", "v1a with the served key");
check((await r.webhookKeys()).join() === PUBLIC_KEY, "the webhook keys");
check((await r.webhookSecret()) === SECRET, "the webhook secret");

// The models the server serves: its --model as a repository of one model.
const models = await r.models();
check(models.length === 1 && models[0].name === "echo" && models[0].default_version === "1" &&
      /^sha256:[0-9a-f]{64}$/.test(models[0].versions[0]?.digest ?? "") && models[0].versions[0].state === "ready",
      `models: ${JSON.stringify(models)}`);
check((await r.model("echo")).versions[0].digest === models[0].versions[0].digest, "one model, by name");
check((await rejects(r.model("resnet"), (e) => e instanceof ReboundError, "an unknown model")).code === "model_not_found",
      "model_not_found");
check(/model name/.test((await rejects(r.model("../v1/inferences"), (e) => e instanceof TypeError, "a model name that is a path")).message),
      "a model name that is a path");
// Every job says the model and version it runs on; a submission may name them.
await r.submit(2, { id: "t-pinned", model: "echo", version: "1" });
const pinned = await r.wait("t-pinned", { timeout: 10 });
check(pinned.model?.name === "echo" && pinned.model?.version === "1", `a pinned job's model: ${JSON.stringify(pinned.model)}`);
check((await rejects(r.submit(3, { id: "t-resnet", model: "resnet" }), (e) => e instanceof ReboundError, "a job for an unknown model")).code === "model_not_found",
      "a job for an unknown model");
const forged = {
  "a changed body": [headers, Buffer.from(body.toString().replace("t-1", "t-2"))],
  "a changed id": [{ ...headers, "webhook-id": "msg_other" }, body],
  "an old timestamp": [{ ...headers, "webhook-timestamp": String(Math.floor(Date.now() / 1000) - 600) }, body],
  "no signature": [{ ...headers, "webhook-signature": undefined }, body],
};
for (const [name, [h, b]] of Object.entries(forged)) {
  await rejects(verifyWebhook({ secrets: [SECRET], keys: [PUBLIC_KEY] }, h, b), (e) => e instanceof WebhookVerificationError, name);
  let officialRefused = false;
  try { official.verify(b, h); } catch { officialRefused = true; }
  check(officialRefused, `the official library accepted ${name}`);
}
await rejects(verifyWebhook({ secrets: ["whsec_" + Buffer.from("another").toString("base64")] }, headers, body),
  (e) => e instanceof WebhookVerificationError, "another secret");
// A mistyped secret or key is refused where it is given, not read as a shorter key that
// verifies nothing.
for (const bad of ["whsec_" + SECRET.slice(6, 20) + "*" + SECRET.slice(21), "whsec_", "whsec_abc"]) {
  let refused = false;
  try { new WebhookVerifier({ secrets: [bad] }); } catch (e) { refused = e instanceof TypeError; }
  check(refused, `the secret ${bad} was accepted`);
  await rejects(verifyWebhook({ secrets: [bad] }, headers, body), (e) => e instanceof TypeError, `verifyWebhook with ${bad}`);
}
{
  let refused = false;
  try { new WebhookVerifier({ keys: [PUBLIC_KEY.replace(/.$/, "!")] }); } catch (e) { refused = e instanceof TypeError; }
  check(refused, "a mistyped public key was accepted");
}
let fetches = 0;
const lazy = new WebhookVerifier({ fetchKeys: () => { fetches += 1; return r.webhookKeys(); } });
check((await lazy.verify(headers, body)).id === "t-1" && fetches === 1, "an unknown key is fetched, once");
const forgedV1a = { ...headers, "webhook-signature": "v1a," + Buffer.alloc(64).toString("base64") };
for (let i = 0; i < 3; ++i) {
  await rejects(lazy.verify(forgedV1a, body), (e) => e instanceof WebhookVerificationError, "a forged v1a signature");
}
check(fetches === 1, `forged signatures made the verifier fetch keys ${fetches} times`);
await rejects(verifyWebhook({ secrets: [SECRET], now: Date.now() / 1000 + 600 }, headers, body),
  (e) => e instanceof WebhookVerificationError, "ten minutes late");
check((await verifyWebhook({ secrets: [SECRET], now: Date.now() / 1000 + 200 }, headers, body)).id === "t-1", "within the tolerance");
await rejects(verifyWebhook({ secrets: [SECRET] }, { ...headers, "webhook-signature": Array(500).fill("v1,AAAA").join(" ") }, body),
  (e) => e instanceof WebhookVerificationError, "500 signatures");
for (const stamp of ["\u00b2", "1".padEnd(400, "0"), "+" + headers["webhook-timestamp"]]) {
  await rejects(verifyWebhook({ secrets: [SECRET] }, { ...headers, "webhook-timestamp": stamp }, body),
    (e) => e instanceof WebhookVerificationError, `the timestamp ${stamp.slice(0, 12)}`);
}

// An Express receiver with the middleware: the server's callback reaches the route verified; a
// forged one is answered 400 before it; behind express.json() the middleware fails loudly.
const app = express();
const viaExpress = [];
const loud = [];
app.post("/hook", expressWebhook({ secrets: [SECRET] }), (req, res) => {
  viaExpress.push(req.webhook);
  res.sendStatus(204);
});
app.post("/parsed", express.json(), expressWebhook({ secrets: [SECRET] }), (req, res) => res.sendStatus(204));
app.use((err, req, res, next) => {
  loud.push(String(err.message));
  res.status(500).end();
});
const expressServer = await new Promise((resolve) => { const s = app.listen(0, "127.0.0.1", () => resolve(s)); });
const expressUrl = `http://127.0.0.1:${expressServer.address().port}`;
await r.submit({ via: "express" }, { id: "te-1", callbackUrl: expressUrl + "/hook" });
await waitFor(() => viaExpress.some((p) => p.id === "te-1"), "the Express route's payload");
check(viaExpress.find((p) => p.id === "te-1").result.via === "express", "the verified payload");
await waitFor(async () => (await r.get("te-1")).callback.state === "delivered", "delivered to Express");
const forgedHeaders = Object.fromEntries(Object.entries(headers).filter(([k]) => k.startsWith("webhook-")));
const forgedAnswer = await fetch(expressUrl + "/hook", { method: "POST", body: body.toString().replace("t-1", "t-9"),
  headers: { ...forgedHeaders, "content-type": "application/json" } });
check(forgedAnswer.status === 400 && !viaExpress.some((p) => p.id === "t-9"), `a forged callback to Express: ${forgedAnswer.status}`);
const parsedAnswer = await fetch(expressUrl + "/parsed", { method: "POST", body, headers: { ...forgedHeaders, "content-type": "application/json" } });
check(parsedAnswer.status === 500 && loud.some((m) => m.includes("express.json()")), `behind express.json(): ${parsedAnswer.status} ${loud}`);
expressServer.close();

// Retries: 503 with Retry-After, and a submission taken whose answer was lost: one job each.
const busy = { busy: 3 };
const busyPort = await proxy(echoPort, busy);
let before = await acceptedTotal(echoPort);
const through = await new Rebound({ baseUrl: `http://127.0.0.1:${busyPort}`, apiKey: API_KEY }).run("through", { timeout: 10 });
check(through.result === "through" && busy.seen >= 4, `through a busy proxy (${busy.seen} requests)`);
check(await acceptedTotal(echoPort) === before + 1, "one job through the busy proxy");
busy.busy = 10;
const full = await rejects(new Rebound({ baseUrl: `http://127.0.0.1:${busyPort}`, apiKey: API_KEY, maxRetries: 2 }).submit(1),
  (e) => e instanceof ReboundError, "past the retries");
check(full.code === "queue_full" && full.retryAfter === 0, `past the retries: ${full}`);
const htmlClient = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(echoPort, { html: true })}`, apiKey: API_KEY });
for (const [name, call] of Object.entries({ get: () => htmlClient.get("t-1"), keys: () => htmlClient.webhookKeys(),
  secret: () => htmlClient.webhookSecret(), batch: () => htmlClient.submitBatch([{ input: 1 }]),
  letters: async () => { for await (const _ of htmlClient.deadLetters()) { /* none */ } } })) {
  const e = await rejects(call(), (x) => x instanceof ReboundError, `${name} through an HTML page`);
  check(e.code === "invalid_response", `${name} through an HTML page: ${e.code}`);
}
const hung = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(echoPort, { hang: true })}`, apiKey: API_KEY });
let hungAt = Date.now();
const hungWait = await rejects(hung.wait("t-1", { timeout: 2 }), (e) => e instanceof WaitTimeout, "a wait on a hung server");
// No poll was answered: the job's state is not known, and the error does not make one up.
check(hungWait.id === "t-1" && hungWait.job === null, `a hung wait's WaitTimeout: ${hungWait.id} ${JSON.stringify(hungWait.job)}`);
check(Date.now() - hungAt < 3000, `a 2 s wait on a hung server took ${Date.now() - hungAt} ms`);
const dropPort = await proxy(echoPort, { drops: 1 });
before = await acceptedTotal(echoPort);
const viaDrop = new Rebound({ baseUrl: `http://127.0.0.1:${dropPort}`, apiKey: API_KEY });
const dropped = await viaDrop.submit("once");
check((await viaDrop.wait(dropped.id, { timeout: 10 })).result === "once", "the dropped submission's job");
check(await acceptedTotal(echoPort) === before + 1, "a retried submission made one job");

// A wait that times out within its deadline; the job goes on.
const slow = new Rebound({ baseUrl: `http://127.0.0.1:${slowPort}`, apiKey: API_KEY });
await slow.submit(null, { id: "ts-1" });
const started = Date.now();
const timedOut = await rejects(slow.wait("ts-1", { timeout: 1.5 }), (e) => e instanceof WaitTimeout, "a short wait");
const took = (Date.now() - started) / 1000;
check(took >= 1.5 && took < 3.0, `the wait took ${took} s for 1.5 s`);
check(timedOut.id === "ts-1" && timedOut.job?.id === "ts-1" && !["succeeded", "failed"].includes(timedOut.job.status), "WaitTimeout's job");
check((await slow.wait("ts-1", { timeout: 10 })).status === "succeeded", "the timed-out job went on");
await slow.submit(null, { id: "ts-2" });
await slow.submit(null, { id: "ts-3" });
const cancelled = await slow.cancel("ts-3");
check(cancelled.status === "cancelled" && cancelled.error.code === "cancelled", `cancel: ${JSON.stringify(cancelled)}`);
// A cancellation the server did, whose answer was lost: the retry's already_finished is it.
await slow.submit(null, { id: "ts-4" });
const viaLostCancel = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(slowPort, { drops: 1, dropMethod: "DELETE" })}`, apiKey: API_KEY });
check((await viaLostCancel.cancel("ts-4")).status === "cancelled", "a cancel whose answer was lost");
// The same behind a gateway that answered 504 after the server took the DELETE.
await slow.submit(null, { id: "ts-5" });
const viaGateway = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(slowPort, { drops: 1, dropMethod: "DELETE", gateway: true })}`, apiKey: API_KEY });
const gatewayCancel = await viaGateway.cancel("ts-5").catch((e) => e);
check(gatewayCancel.status === "cancelled", `a cancel answered 504 by a gateway: ${gatewayCancel}`);
// A 502 from a gateway that never reached the server, on a job that ended by itself: the retry's
// already_finished is the job's own end, thrown, not a cancellation.
const viaBadGateway = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(echoPort, { busy: 1, busyStatus: 502 })}`, apiKey: API_KEY });
check((await rejects(viaBadGateway.cancel("t-1"), (e) => e instanceof ReboundError, "cancel after a 502")).code === "already_finished",
  "a cancel of a finished job after a 502");

// A server with as many waiters as it takes: wait() polls without waiting instead of failing.
const fullPort = await startServer("sleep:2", "--workers", "1", "--max-waiters", "1");
const crowded = new Rebound({ baseUrl: `http://127.0.0.1:${fullPort}`, apiKey: API_KEY, maxRetries: 1 });
await crowded.submit(null, { id: "w-1" });
await crowded.submit(null, { id: "w-2" });
const poll = (id, wait) => fetch(`http://127.0.0.1:${fullPort}/v1/inferences/${id}`, {
  headers: { Authorization: `Bearer ${API_KEY}`, Prefer: `wait=${wait}` } }).then((res) => res.text());
const holder = (async () => { // the one waiter's place, taken until w-2 ends (about 4 s)
  while (!(await poll("w-2", 20)).includes('"status":"succeeded"')) await sleep(50);
})();
await waitFor(async () => (await poll("w-1", 1)).includes("too_many_waiters"), "the waiter's place taken");
const fullWait = await crowded.wait("w-1", { timeout: 10 }).catch((e) => e);
check(fullWait.status === "succeeded", `a wait on a server full of waiters: ${fullWait}`);
await holder;

// Changing the models (an operator key): a version shipped, loaded, canaried, promoted, the old
// one unloaded with its queued jobs rerouted; the refusals.
const OPS_KEY = "ops-typescript";
const repository = mkdtempSync(path.join(os.tmpdir(), "rebound-ts-models-"));
const addVersion = (v) => {
  mkdirSync(path.join(repository, "echo", v), { recursive: true });
  writeFileSync(path.join(repository, "echo", v, "config.json"), '{"backend": "echo"}');
};
addVersion("1");
const modelsPort = await spawnServer("repository", ["--model-repository", repository, "--operator-key", "ops:" + OPS_KEY]);
const ops = new Rebound({ baseUrl: `http://127.0.0.1:${modelsPort}`, apiKey: OPS_KEY });
const tenantOfModels = new Rebound({ baseUrl: `http://127.0.0.1:${modelsPort}`, apiKey: API_KEY });
const stateOf = async (v) => ((await ops.model("echo")).versions.find((x) => x.version === v) || {}).state;
const until = async (what, probe) => {
  for (const deadline = Date.now() + 20000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 50))) {
    if (await probe()) return;
  }
  fail(`timed out waiting for ${what}`);
};
addVersion("2");
const loaded = await ops.loadVersion("echo", 2);
check(loaded.name === "echo" && ["loading", "ready"].includes(loaded.versions.find((v) => v.version === "2").state),
  `loadVersion answered ${JSON.stringify(loaded)}`);
await until("version 2 ready", async () => (await stateOf("2")) === "ready");
const canary = await ops.setRoute("echo", 1, { split: [{ version: 2, percent: 10 }], ifGeneration: loaded.generation });
check(canary.default_version === "1" && canary.split.length === 1 && canary.split[0].version === "2" &&
  canary.split[0].percent === 10 && canary.generation === loaded.generation + 1, `setRoute answered ${JSON.stringify(canary)}`);
const stale = await rejects(ops.setRoute("echo", "2", { ifGeneration: loaded.generation }),
  (e) => e instanceof ReboundError, "a route set on a stale generation");
check(stale.status === 412 && stale.code === "route_changed", `a stale generation: ${stale.message}`);
// Promoted through a proxy that drops the answer: the resend is refused 412, and the client finds
// its own change in the model (one generation on, this route) and answers it.
const lostRoute = { drops: 1, dropMethod: "PUT" };
const viaLostRoute = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(modelsPort, lostRoute)}`, apiKey: OPS_KEY });
const promoted = await viaLostRoute.setRoute("echo", "2", { ifGeneration: canary.generation });
check(promoted.default_version === "2" && promoted.split.length === 0 && promoted.generation === canary.generation + 1,
  `promoted though the answer was lost: ${JSON.stringify(promoted)}`);
check(lostRoute.requests.filter((r) => r.method === "PUT").length === 2 &&
  lostRoute.requests.every((r) => r.method !== "PUT" || r.ifMatch === `"${canary.generation}"`), "sent twice, with If-Match");
check((await tenantOfModels.run({ v: 2 }, { timeout: 10 })).model.version === "2", "a new job runs on the promoted version");
check((await rejects(ops.unloadVersion("echo", "2"), (e) => e instanceof ReboundError, "an unload of the routed version"))
  .code === "version_in_route", "the routed version stays");
const recorded = {};
const viaRecorder = new Rebound({ baseUrl: `http://127.0.0.1:${await proxy(modelsPort, recorded)}`, apiKey: OPS_KEY });
const unloaded = await viaRecorder.unloadVersion("echo", 1, { queued: "reroute" });
check(recorded.requests.some((r) => r.method === "DELETE" && r.url === "/v1/models/echo/versions/1?queued=reroute"),
  `the unload's request: ${JSON.stringify(recorded.requests)}`);
check(["draining", "unloaded"].includes(unloaded.versions.find((v) => v.version === "1").state), "unloadVersion answered");
await until("version 1 unloaded", async () => (await stateOf("1")) === "unloaded");
check((await rejects(tenantOfModels.loadVersion("echo", 1), (e) => e instanceof ReboundError, "a tenant's load"))
  .status === 403, "a tenant's key may not load");
for (const [name, call] of [["a version with a leading zero", () => ops.loadVersion("echo", "02")],
  ["a path as a name", () => ops.loadVersion("../x", 1)],
  ["an unknown queued", () => ops.unloadVersion("echo", 1, { queued: "later" })],
  ["generation 0", () => ops.setRoute("echo", 2, { ifGeneration: 0 })],
  ["a version of 1e21", () => ops.loadVersion("echo", 1e21)],
  ["a version of 2.5", () => ops.loadVersion("echo", 2.5)],
  ["a percent of 2.5", () => ops.setRoute("echo", 2, { split: [{ version: 1, percent: 2.5 }] })],
  ["a percent of NaN", () => ops.setRoute("echo", 2, { split: [{ version: 1, percent: NaN }] })]]) {
  await rejects(call(), (e) => e instanceof TypeError, name);
}
rmSync(repository, { recursive: true, force: true });

for (const c of children) {
  c.removeAllListeners("exit");
  c.kill("SIGTERM");
}
receiver.close();
console.log("typescript client: ok");
process.exit(0);
