// @rebound/client: submit inference jobs to a rebound-server, wait for them, and verify the
// callbacks it sends. No runtime dependency: `fetch` and `AbortSignal` (Node 18 or later, or a
// browser), `node:crypto` for the verifier. See docs/clients.md in the rebound repository.

/** The states a job ends in. */
export const FINAL_STATUSES: ReadonlySet<string> = new Set([
  "succeeded",
  "failed",
  "expired",
  "cancelled",
]);

export type JobStatus = "queued" | "running" | "succeeded" | "failed" | "expired" | "cancelled";

/** A job as the server answered it (the poll answer of docs/http-api.md). */
export interface Job {
  id: string;
  status: JobStatus;
  result?: unknown;
  error?: { code: string; message: string };
  priority?: number;
  created_at?: string;
  started_at?: string;
  finished_at?: string;
  queue_position?: number;
  callback?: {
    url: string;
    state: "none" | "pending" | "delivered" | "failed";
    attempts?: number;
    last_error?: string;
    next_attempt_at?: string;
  };
  /** The model and version the job runs on, chosen when it was accepted (absent from a server
   * that names none). */
  model?: { name: string; version: string };
}

/** One version of a model (GET /v1/models). */
export interface ModelVersion {
  version: string;
  state: "loading" | "ready" | "failed" | "draining" | "unloaded";
  /** sha256:<hex> over the version's files; absent when the server does not say. */
  digest?: string;
  loaded_at?: string;
  /** The store's counts; absent while it cannot count. */
  queued?: number;
  running?: number;
  /** Why a `failed` version failed. */
  error?: { code: string; message: string };
}

/** A model the server serves (GET /v1/models), with its versions and its route. */
export interface Model {
  name: string;
  default_version: string;
  split: { version: string; percent: number }[];
  generation: number;
  versions: ModelVersion[];
}

function modelOf(status: number, body: any): Model {
  if (typeof body?.name !== "string" || typeof body?.default_version !== "string" || !Array.isArray(body?.versions) ||
      !Array.isArray(body?.split) || typeof body?.generation !== "number" ||
      !body.versions.every((v: any) => typeof v?.version === "string" && typeof v?.state === "string")) {
    throw invalid(status, "a model");
  }
  return body as Model;
}

/** One job of a batch as the server answered it: 202, or the refusal's status and error. */
export interface Submitted {
  id?: string;
  status: number;
  error?: ReboundError;
}

export interface SubmitOptions {
  /** Yours, so that a resubmission is the same job; a random one when absent. */
  id?: string;
  callbackUrl?: string;
  model?: string;
  version?: string;
  priority?: number;
  maxQueueSeconds?: number;
  webhookEvents?: Array<"started" | "completed">;
  traceparent?: string;
}

/** An error answer of the server: its HTTP status, code, message, field and Retry-After. */
export class ReboundError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly field?: string,
    readonly retryAfter?: number,
  ) {
    super(`${status} ${code}: ${message}`);
    this.name = "ReboundError";
  }
}

/**
 * The job was not final by the wait's deadline; it goes on (a wait never cancels it). `job` is its
 * last known state, or null when no poll was answered before the deadline (a hung server or
 * network): its state is then not known. `id` is the job's id either way.
 */
export class WaitTimeout extends Error {
  constructor(
    readonly id: string,
    readonly job: Job | null,
    readonly timeout: number,
  ) {
    super(job ? `job ${id} still ${job.status} after ${timeout} s` : `job ${id}: no answer within ${timeout} s`);
    this.name = "WaitTimeout";
  }
}

/** The callback is not one the server signed for you: answer it 4xx and do not act on it. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

export interface ReboundOptions {
  baseUrl: string;
  /** The `--api-key` to send (Authorization: Bearer). */
  apiKey?: string;
  /** Per request, in milliseconds (a long poll adds its wait). */
  timeoutMs?: number;
  /** How often a request is sent again after 429/502/503/504 or a lost connection. */
  maxRetries?: number;
  /** The longest pause before a retry, in milliseconds (a longer Retry-After is cut to it). */
  maxRetryDelayMs?: number;
  fetch?: typeof fetch;
}

const RETRIED = new Set([429, 502, 503, 504]);
const MAX_WAIT_S = 60; // the most one Prefer: wait may ask for (the server's bound)
const ID = /^[A-Za-z0-9._:-]{1,128}$/;

interface Answer {
  status: number;
  headers: Headers;
  body: any;
}

function retryAfterOf(headers: Headers): number | undefined {
  const value = headers.get("retry-after")?.trim();
  if (!value) return undefined;
  if (/^\d{1,10}$/.test(value)) return Number(value);
  const when = Date.parse(value);
  return Number.isNaN(when) ? undefined : Math.max(0, (when - Date.now()) / 1000);
}

function errorOf(status: number, body: any, retryAfter?: number): ReboundError {
  const e = body && typeof body === "object" ? body.error : undefined;
  if (!e || typeof e !== "object") {
    return new ReboundError(status, `http_${status}`, `HTTP ${status}`, undefined, retryAfter);
  }
  return new ReboundError(
    status,
    String(e.code ?? ""),
    String(e.message ?? ""),
    typeof e.field === "string" ? e.field : undefined,
    retryAfter,
  );
}

const invalid = (status: number, what: string) =>
  new ReboundError(status, "invalid_response", `the answer is not ${what}`);

function jobOf(status: number, body: any): Job {
  if (!body || typeof body !== "object" || typeof body.id !== "string" ||
      typeof body.status !== "string" || (body.error != null && typeof body.error !== "object")) {
    throw invalid(status, "a job");
  }
  return body as Job;
}

function pathPart(id: string): string {
  // Anything else ('#', '?', '%', '/', '..') would name another route or job once in a URL.
  if (typeof id !== "string" || !ID.test(id) || id === "." || id === "..") {
    throw new TypeError("a job id is 1 to 128 characters of A-Z a-z 0-9 . _ : -");
  }
  return id;
}

const MODEL = /^[a-z0-9][a-z0-9._-]{0,63}$/;

function modelPart(name: string): string {
  // A model name as the server takes it (never '.', '..', '/', '%').
  if (typeof name !== "string" || !MODEL.test(name)) {
    throw new TypeError("a model name is 1 to 64 characters of a-z 0-9 . _ -, the first a letter or a digit");
  }
  return name;
}

const VERSION = /^[1-9][0-9]{0,17}$/;

function versionPart(version: string | number): string {
  // A version as the server takes it: a positive whole number, no leading zero.
  const text = typeof version === "number" && Number.isSafeInteger(version) ? String(version) : version;
  if (typeof text !== "string" || !VERSION.test(text)) {
    throw new TypeError("a version is a positive whole number without leading zeros (at most 18 digits)");
  }
  return text;
}

/** Where a model's new jobs go (setRoute). */
export interface RouteOptions {
  /** Versions with their percent of the new jobs (a canary), in order (the server deals the
   * percents out in it): `[{ version: "2", percent: 10 }]`, as Model.split reads. */
  split?: Array<{ version: string | number; percent: number }>;
  /** The route's generation as read (Model.generation): the change applies only if nobody changed
   * the route since, else a ReboundError 412 route_changed. */
  ifGeneration?: number;
}

// A call with a deadline that could not be answered before it (a wait ends in WaitTimeout).
class DeadlinePassed extends Error {}

// A random id: WebCrypto's where there is one (browsers, Node 19+), else node:crypto's.
async function newId(): Promise<string> {
  const web = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (web?.randomUUID) return web.randomUUID();
  return (await import("node:crypto")).randomUUID();
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A client of one rebound-server (or a load balancer in front of a fleet). Submissions carry an
 * id (yours, or a random one), so a retry after 429/502/503/504 or a dropped connection is
 * answered as the same job and never makes a second one.
 *
 *   const r = new Rebound({ baseUrl: "http://127.0.0.1:8080", apiKey });
 *   const job = await r.run([5.1, 3.5, 1.4, 0.2], { timeout: 60 });
 */
export class Rebound {
  private readonly baseUrl: string;
  private readonly fetch: typeof fetch;
  private readonly timeoutMs: number;
  private readonly maxRetries: number;
  private readonly maxRetryDelayMs: number;

  constructor(private readonly options: ReboundOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.maxRetries = options.maxRetries ?? 5;
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 30_000;
    if (this.maxRetries < 0) throw new RangeError("maxRetries must not be negative");
  }

  // One request, sent again on what passes (429/502/503/504, a failed fetch). With a deadline
  // (Date.now() ms) no request outlives it and no retry starts after it (DeadlinePassed); a long
  // poll's `waitS` is cut to what is left at each try. A submission is safe to send again (its id
  // makes a second one the same job); a call that is not (cancel, redeliver) names in `resentOk`
  // the refusals that, after a failed fetch or a gateway's 502/504, mean its first send did the
  // work: returned, not thrown. A long poll refused 503 too_many_waiters is sent again at once as
  // a plain poll.
  private async call(
    method: string,
    path: string,
    init: { body?: unknown; headers?: Record<string, string>; waitS?: number; deadline?: number;
            resentOk?: string[] },
    ok: number[] = [200],
  ): Promise<Answer> {
    const base: Record<string, string> = { Accept: "application/json", ...init.headers };
    if (this.options.apiKey) base.Authorization = `Bearer ${this.options.apiKey}`;
    if (init.body !== undefined) base["Content-Type"] = "application/json";
    let lost = false;
    let plain = false; // the server has as many waiters as it takes: poll without waiting
    // (`attempt` counts the tries against maxRetries: the plain poll after a refused long poll
    // does not count.)
    for (let attempt = 0; ; ) {
      const last = attempt >= this.maxRetries;
      let degraded = false;
      const left = init.deadline === undefined ? undefined : init.deadline - Date.now();
      if (left !== undefined && left <= 0) throw new DeadlinePassed();
      const waitS = plain ? 0 : Math.min(init.waitS ?? 0, left === undefined ? Infinity : Math.floor(left / 1000));
      const headers = waitS > 0 ? { ...base, Prefer: `wait=${waitS}` } : base;
      const timeoutMs = Math.min(this.timeoutMs + waitS * 1000, left ?? Infinity);
      let pause: number;
      try {
        const response = await this.fetch(this.baseUrl + path, {
          method,
          headers,
          body: init.body === undefined ? undefined : JSON.stringify(init.body),
          signal: AbortSignal.timeout(Math.max(1, Math.ceil(timeoutMs))),
        });
        const text = await response.text();
        let body: any = undefined;
        try {
          body = text ? JSON.parse(text) : undefined;
        } catch {
          body = undefined;
        }
        if (ok.includes(response.status)) return { status: response.status, headers: response.headers, body };
        const retryAfter = retryAfterOf(response.headers);
        const error = errorOf(response.status, body, retryAfter);
        if (lost && init.resentOk?.includes(error.code)) {
          return { status: response.status, headers: response.headers, body };
        }
        // A gateway's 502 or 504: the server may have acted on the request before it went quiet.
        if (response.status === 502 || response.status === 504) lost = true;
        // A long poll refused for want of room among the waiters is sent again at once, plain.
        degraded = waitS > 0 && error.code === "too_many_waiters";
        if (!degraded && (!RETRIED.has(response.status) || last)) throw error;
        if (degraded) plain = true;
        pause = degraded ? 0
              : retryAfter !== undefined ? Math.min(retryAfter * 1000, this.maxRetryDelayMs)
                                         : this.backoff(attempt);
      } catch (e) {
        if (e instanceof ReboundError) throw e;
        // fetch failed (connection refused or dropped, a timeout): the request may have been
        // taken; see `resentOk`.
        if (init.deadline !== undefined && Date.now() >= init.deadline) throw new DeadlinePassed();
        if (last) throw e;
        // (A connection refused sent nothing.)
        if ((e as { cause?: { code?: string } })?.cause?.code !== "ECONNREFUSED") lost = true;
        pause = this.backoff(attempt);
      }
      if (init.deadline !== undefined) pause = Math.min(pause, Math.max(0, init.deadline - Date.now()));
      await sleep(pause);
      if (!degraded) ++attempt;
    }
  }

  private backoff(attempt: number): number {
    return Math.random() * Math.min(this.maxRetryDelayMs, 250 * 2 ** attempt);
  }

  private static async body(input: unknown, o: SubmitOptions): Promise<Record<string, unknown>> {
    const body: Record<string, unknown> = { id: o.id ?? (await newId()), input: input ?? null };
    if (o.callbackUrl !== undefined) body.callback_url = o.callbackUrl;
    if (o.model !== undefined) body.model = o.model;
    if (o.version !== undefined) body.version = o.version;
    if (o.priority !== undefined) body.priority = o.priority;
    if (o.maxQueueSeconds !== undefined) body.max_queue_seconds = o.maxQueueSeconds;
    if (o.webhookEvents !== undefined) body.webhook_events = o.webhookEvents;
    return body;
  }

  /** Submits a job (POST /v1/inferences); answers it as accepted (status "queued"). */
  async submit(input?: unknown, options: SubmitOptions = {}): Promise<Job> {
    const body = await Rebound.body(input, options);
    const headers = options.traceparent ? { traceparent: options.traceparent } : undefined;
    await this.call("POST", "/v1/inferences", { body, headers }, [202]);
    return { id: body.id as string, status: "queued" };
  }

  /** Up to 1,000 jobs at once; one result per job, in order, each accepted or refused alone. */
  async submitBatch(jobs: Array<{ input?: unknown } & SubmitOptions>): Promise<Submitted[]> {
    const bodies = await Promise.all(jobs.map((j) => Rebound.body(j.input, j)));
    const answer = await this.call("POST", "/v1/inferences:batch", { body: { jobs: bodies } });
    const results: any[] = Array.isArray(answer.body?.results) ? answer.body.results : [];
    if (results.length !== bodies.length ||
        !results.every((r) => r && typeof r === "object" && Number.isInteger(r.status))) {
      throw invalid(answer.status, "one result per job");
    }
    return results.map((r, i) => ({
      id: typeof r.id === "string" ? r.id : (bodies[i].id as string),
      status: Number(r.status),
      error: Number(r.status) === 202 ? undefined : errorOf(Number(r.status), r),
    }));
  }

  /** The job now (GET /v1/inferences/{id}). */
  async get(id: string): Promise<Job> {
    const answer = await this.call("GET", `/v1/inferences/${pathPart(id)}`, {});
    return jobOf(answer.status, answer.body);
  }

  /**
   * Waits until the job is final, with long polls (Prefer: wait) that never pass `timeout`
   * seconds; rejects with WaitTimeout after it (the job goes on).
   */
  async wait(id: string, options: { timeout?: number } = {}): Promise<Job> {
    const timeout = options.timeout ?? 600;
    if (!Number.isFinite(timeout) || timeout < 0) throw new RangeError("timeout must be a finite number of seconds, not negative");
    const path = `/v1/inferences/${pathPart(id)}`;
    const deadline = Date.now() + timeout * 1000;
    let job: Job | null = null; // (until a poll is answered)
    let early = 0; // polls answered at once, in a row
    for (;;) {
      const left = (deadline - Date.now()) / 1000;
      // Long polls of whole seconds while a second or more is left; then plain polls.
      const waitS = left >= 1 ? Math.min(MAX_WAIT_S, Math.floor(left)) : 0;
      const asked = Date.now();
      try {
        job = jobOf(200, (await this.call("GET", path, { waitS, deadline })).body);
      } catch (e) {
        if (e instanceof DeadlinePassed) throw new WaitTimeout(id, job, timeout);
        throw e;
      }
      if (FINAL_STATUSES.has(job.status)) return job;
      const rest = deadline - Date.now();
      if (rest <= 0) throw new WaitTimeout(id, job, timeout);
      // A poll that came back at once (plain, or a long poll something in between did not
      // honour) is followed by a growing pause, so that a wait never spins.
      early = Date.now() - asked < Math.max(50, waitS * 500) ? early + 1 : 0;
      if (early) await sleep(Math.min(rest, 100 * 2 ** Math.min(early - 1, 4)));
    }
  }

  /** Submits a job and waits for it. */
  async run(input?: unknown, options: SubmitOptions & { timeout?: number } = {}): Promise<Job> {
    const job = await this.submit(input, options);
    return this.wait(job.id, { timeout: options.timeout });
  }

  /** Cancels a job that is not final; a 409 already_finished ReboundError when it is. */
  async cancel(id: string): Promise<Job> {
    const answer = await this.call("DELETE", `/v1/inferences/${pathPart(id)}`, { resentOk: ["already_finished"] });
    if (answer.status === 200) return jobOf(answer.status, answer.body);
    // 409 after a lost answer: the first DELETE cancelled it, if the job says so.
    const job = await this.get(id);
    if (job.status === "cancelled") return job;
    throw errorOf(answer.status, answer.body, retryAfterOf(answer.headers));
  }

  /** Sends a given-up callback again, then answers the job as polled. */
  async redeliver(id: string): Promise<Job> {
    await this.call("POST", `/v1/inferences/${pathPart(id)}/redeliver`, { resentOk: ["callback_not_failed"] }, [202]);
    return this.get(id);
  }

  /** The caller's jobs whose callback was given up, newest first, page by page. */
  async *deadLetters(options: { pageSize?: number } = {}): AsyncGenerator<Job> {
    let cursor: string | null = null;
    do {
      const query = new URLSearchParams({
        callback_state: "failed",
        limit: String(options.pageSize ?? 100),
      });
      if (cursor) query.set("cursor", cursor);
      const answer = await this.call("GET", `/v1/inferences?${query}`, {});
      const next = answer.body?.next_cursor;
      if (!Array.isArray(answer.body?.jobs) || !(next === null || typeof next === "string")) {
        throw invalid(answer.status, "a page");
      }
      for (const j of answer.body.jobs) yield jobOf(answer.status, j);
      cursor = next;
    } while (cursor);
  }

  /** The whpk_ public keys that verify v1a callback signatures. */
  async webhookKeys(tenant?: string): Promise<string[]> {
    const query = tenant ? `?${new URLSearchParams({ tenant })}` : "";
    const answer = await this.call("GET", `/v1/webhook-keys${query}`, {});
    const keys = answer.body?.keys;
    if (!Array.isArray(keys) || !keys.every((k) => typeof k === "string")) throw invalid(answer.status, "a list of keys");
    return keys;
  }

  /** The models the server serves, each with its versions. */
  async models(): Promise<Model[]> {
    const answer = await this.call("GET", "/v1/models", {});
    if (!Array.isArray(answer.body?.models)) throw invalid(answer.status, "a list of models");
    return answer.body.models.map((m: any) => modelOf(answer.status, m));
  }

  /** One model; a ReboundError with code model_not_found when the server has none of that name. */
  async model(name: string): Promise<Model> {
    const answer = await this.call("GET", `/v1/models/${modelPart(name)}`, {});
    return modelOf(answer.status, answer.body);
  }

  /** Loads a version of the server's model repository in the background (operator key): the model,
   * the version `loading` (or `ready`); model(name) tells when it is ready or failed. With a store
   * servers share, every server loads it. */
  async loadVersion(name: string, version: string | number): Promise<Model> {
    const answer = await this.call("PUT", `/v1/models/${modelPart(name)}/versions/${versionPart(version)}`, {},
      [200, 202]);
    return modelOf(answer.status, answer.body);
  }

  /** Unloads a version no route names (operator key): it takes no new job and drains; its jobs not
   * started run on it first (`finish`, the default) or go to the version the route chooses for
   * each (`reroute`). A ReboundError 409 version_in_route while a route names it. */
  async unloadVersion(name: string, version: string | number,
                      options: { queued?: "finish" | "reroute" } = {}): Promise<Model> {
    const queued = options.queued ?? "finish";
    if (queued !== "finish" && queued !== "reroute") throw new TypeError("queued is 'finish' or 'reroute'");
    const answer = await this.call("DELETE",
      `/v1/models/${modelPart(name)}/versions/${versionPart(version)}?queued=${queued}`, {}, [202]);
    return modelOf(answer.status, answer.body);
  }

  /** Where the model's new jobs go (operator key): the default version, and split versions with
   * their percent. The model with its new generation. */
  async setRoute(name: string, defaultVersion: string | number, options: RouteOptions = {}): Promise<Model> {
    const split = options.split ?? [];
    if (!Array.isArray(split)) throw new TypeError("split lists { version, percent } in order");
    const body = {
      default_version: versionPart(defaultVersion),
      split: split.map((s) => {
        if (!Number.isInteger(s?.percent) || s.percent < 1 || s.percent > 100) {
          throw new TypeError("a split's percent is a whole number from 1 to 100");
        }
        return { version: versionPart(s.version), percent: s.percent };
      }),
    };
    const headers: Record<string, string> = {};
    const ifGeneration = options.ifGeneration;
    if (ifGeneration !== undefined) {
      if (!Number.isSafeInteger(ifGeneration) || ifGeneration < 1) {
        throw new TypeError("ifGeneration is a generation (a positive whole number)");
      }
      headers["If-Match"] = `"${ifGeneration}"`;
    }
    const path = `/v1/models/${modelPart(name)}/route`;
    const answer = await this.call("PUT", path, { body, headers, resentOk: ifGeneration === undefined ? [] : ["route_changed"] });
    if (answer.status === 200) return modelOf(answer.status, answer.body);
    // Sent again after a lost answer, and refused: done by the first send when the model has this
    // route now, one generation on; else someone else's change came first.
    const now = await this.model(name);
    if (now.generation === (ifGeneration ?? 0) + 1 && now.default_version === body.default_version &&
        JSON.stringify(now.split.map((s) => [s.version, s.percent])) ===
          JSON.stringify(body.split.map((s) => [s.version, s.percent]))) {
      return now;
    }
    throw errorOf(answer.status, answer.body, undefined);
  }

  /** The whsec_ secret the caller's callbacks are signed with (v1). */
  async webhookSecret(): Promise<string> {
    const answer = await this.call("GET", "/v1/webhook-secret", {});
    if (typeof answer.body?.secret !== "string") throw invalid(answer.status, "a secret");
    return answer.body.secret;
  }
}

export interface VerifyOptions {
  /** whsec_ secrets (v1); several while one is rotated out. */
  secrets?: string[];
  /** whpk_ Ed25519 public keys (v1a). */
  keys?: string[];
  /** How far the timestamp may be from now, in seconds (300). */
  tolerance?: number;
  /** Now, in seconds since the epoch (for tests). */
  now?: number;
}

function keyBytes(value: string, prefix: string): Buffer {
  if (!value.startsWith(prefix)) throw new TypeError(`a key must start with ${prefix}`);
  const text = value.slice(prefix.length);
  // Buffer.from skips what is not base64: a mistyped key would verify nothing, silently.
  if (!text || text.length % 4 !== 0 || !/^[A-Za-z0-9+/]+={0,2}$/.test(text)) {
    throw new TypeError(`${prefix}...: not base64`);
  }
  return Buffer.from(text, "base64");
}

function headerOf(headers: Headers | Record<string, string | string[] | undefined>, name: string) {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name) return Array.isArray(v) ? v.join(" ") : v;
  }
  return undefined;
}

/**
 * Checks a callback's signature and timestamp from its headers and its body's raw bytes, and
 * answers its JSON payload; rejects with WebhookVerificationError otherwise. The body must be
 * the bytes as received (with Express: `express.raw({ type: "application/json" })`, not
 * `express.json()`, whose re-serialised body does not verify).
 */
export async function verifyWebhook(
  options: VerifyOptions,
  headers: Headers | Record<string, string | string[] | undefined>,
  rawBody: Uint8Array | Buffer,
): Promise<unknown> {
  if (typeof rawBody === "string") throw new TypeError("verifyWebhook needs the raw bytes, not text");
  const crypto = await import("node:crypto");
  const id = headerOf(headers, "webhook-id");
  const stamp = headerOf(headers, "webhook-timestamp");
  const signatures = headerOf(headers, "webhook-signature");
  if (!id || !stamp || !signatures) {
    throw new WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature");
  }
  if (!/^\d{1,12}$/.test(stamp)) throw new WebhookVerificationError("webhook-timestamp is not a number of seconds");
  const tolerance = options.tolerance ?? 300;
  if (!Number.isFinite(tolerance) || tolerance < 0) throw new RangeError("tolerance must be a finite number of seconds");
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - Number(stamp)) > tolerance) {
    throw new WebhookVerificationError("webhook-timestamp is outside the tolerance");
  }
  const entries = signatures.split(" ");
  // More is an attack on the verifier's CPU (each costs a check over the whole body).
  if (entries.length > 16) throw new WebhookVerificationError("more than 16 signatures");
  const signed = Buffer.concat([Buffer.from(`${id}.${stamp}.`), Buffer.from(rawBody)]);
  const secrets = (options.secrets ?? []).map((s) => keyBytes(s, "whsec_"));
  // Ed25519 public keys as SPKI DER: the fixed prefix, then the 32 raw bytes.
  const spki = Buffer.from("302a300506032b6570032100", "hex");
  const keys = (options.keys ?? []).map((k) =>
    crypto.createPublicKey({ key: Buffer.concat([spki, keyBytes(k, "whpk_")]), format: "der", type: "spki" }),
  );
  const v1: Buffer[] = [];
  const v1a: Buffer[] = [];
  for (const entry of entries) {
    const comma = entry.indexOf(",");
    if (comma < 0) continue;
    const version = entry.slice(0, comma);
    const signature = Buffer.from(entry.slice(comma + 1), "base64");
    if (version === "v1" && signature.length === 32) v1.push(signature);
    if (version === "v1a" && signature.length === 64) v1a.push(signature);
  }
  for (const secret of v1.length ? secrets : []) {
    // One MAC per secret, however many signatures the header lists.
    const mac = crypto.createHmac("sha256", secret).update(signed).digest();
    if (v1.some((signature) => crypto.timingSafeEqual(mac, signature))) return parse(rawBody);
  }
  for (const key of v1a.length ? keys : []) {
    if (v1a.some((signature) => crypto.verify(null, signed, key, signature))) return parse(rawBody);
  }
  throw new WebhookVerificationError("no signature matches");
}

/**
 * verifyWebhook with keys fetched when a v1a signature matches none known (a key the server
 * rotated in), at most once every `refetchIntervalMs` (10 s), so that forged signatures cannot
 * make it hammer the server. `fetchKeys` is typically `() => rebound.webhookKeys()`; a fetch that
 * fails rejects the verification with a WebhookVerificationError.
 */
export class WebhookVerifier {
  private keys: string[];
  private fetchedAt = -Infinity;
  private fetching?: Promise<string[]>;

  constructor(
    private readonly options: VerifyOptions & {
      fetchKeys?: () => Promise<string[]>;
      refetchIntervalMs?: number;
    },
  ) {
    this.keys = [...(options.keys ?? [])];
    if (!options.secrets?.length && !this.keys.length && !options.fetchKeys) {
      throw new TypeError("a WebhookVerifier needs a secret, a public key or fetchKeys");
    }
    // A key that cannot be read fails here, not as every callback refused.
    for (const s of options.secrets ?? []) keyBytes(s, "whsec_");
    for (const k of this.keys) {
      if (keyBytes(k, "whpk_").length !== 32) throw new TypeError("whpk_...: not a 32-byte Ed25519 key");
    }
  }

  async verify(headers: Headers | Record<string, string | string[] | undefined>, rawBody: Uint8Array | Buffer): Promise<unknown> {
    const tried = this.keys;
    try {
      return await verifyWebhook({ ...this.options, keys: tried }, headers, rawBody);
    } catch (e) {
      if (!(e instanceof WebhookVerificationError) || !this.options.fetchKeys ||
          e.message !== "no signature matches" || !/(^| )v1a,/.test(headerOf(headers, "webhook-signature") ?? "")) {
        throw e;
      }
    }
    if (this.keys === tried) {
      // One fetch at a time; those that waited for it use its keys.
      if (!this.fetching) {
        if (Date.now() - this.fetchedAt < (this.options.refetchIntervalMs ?? 10_000)) {
          throw new WebhookVerificationError("no signature matches");
        }
        this.fetchedAt = Date.now();
        this.fetching = this.options.fetchKeys!().finally(() => { this.fetching = undefined; });
      }
      try {
        this.keys = [...(await this.fetching)];
      } catch (e) {
        throw new WebhookVerificationError(`the public keys could not be fetched: ${e}`);
      }
    }
    return verifyWebhook({ ...this.options, keys: this.keys }, headers, rawBody);
  }
}

function parse(rawBody: Uint8Array): unknown {
  try {
    return JSON.parse(Buffer.from(rawBody).toString("utf8"));
  } catch {
    throw new WebhookVerificationError("the body is not JSON");
  }
}

// The few parts of Express's request and response the middleware uses (no dependency on Express).
interface ExpressRequest {
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  _body?: boolean; // set by Express's body parsers once they consumed the stream
  webhook?: unknown;
  on(event: "data", listener: (chunk: Buffer) => void): unknown;
  on(event: "end" | "error", listener: (e?: unknown) => void): unknown;
}
interface ExpressResponse {
  status(code: number): { json(body: unknown): unknown };
}

/** The largest callback body the middleware reads (the server's limit for a result is lower). */
const MAX_CALLBACK_BYTES = 8 << 20;

/**
 * Express middleware that verifies a rebound callback and sets `req.webhook` to its payload;
 * answers 400 when it does not verify. It reads the raw body itself, or takes the Buffer of
 * `express.raw({ type: "application/json" })`; after `express.json()` (whose re-serialised body
 * cannot verify) it fails loudly, with an error naming the fix, instead of refusing every
 * callback.
 *
 *   app.post("/hook", expressWebhook({ secrets: [secret] }), (req, res) => {
 *     const payload = req.webhook; ...
 *     res.sendStatus(204);
 *   });
 */
export function expressWebhook(options: VerifyOptions) {
  return (req: ExpressRequest, res: ExpressResponse, next: (error?: unknown) => void): void => {
    const verify = (raw: Buffer) => {
      verifyWebhook(options, req.headers, raw).then(
        (payload) => {
          req.webhook = payload;
          next();
        },
        (e) => {
          if (!(e instanceof WebhookVerificationError)) return next(e);
          res.status(400).json({ error: { code: "invalid_webhook", message: e.message } });
        },
      );
    };
    if (Buffer.isBuffer(req.body)) return verify(req.body);
    if (req._body) {
      return next(new Error(
        "expressWebhook: the body was parsed already (express.json()?): a parsed body cannot be " +
        "verified. Mount expressWebhook before any body parser, or use " +
        "express.raw({ type: \"application/json\" }) on this route."));
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let failed = false;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size <= MAX_CALLBACK_BYTES) chunks.push(chunk);
    });
    req.on("error", (e) => {
      failed = true;
      next(e);
    });
    req.on("end", () => {
      if (failed) return;
      if (size > MAX_CALLBACK_BYTES) {
        res.status(400).json({ error: { code: "invalid_webhook", message: "the body is too large" } });
        return;
      }
      verify(Buffer.concat(chunks));
    });
  };
}
