"""Client and AsyncClient: one set of calls, written once.

Each call is a generator that yields what it needs done (an HTTP request, or a pause before a
retry) and gets the answer back; ``Client`` runs it with httpx's blocking client and ``AsyncClient``
with its asynchronous one, so both behave alike by construction (retries, deadlines, errors).
"""
from __future__ import annotations

import asyncio
import email.utils
import json
import math
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Generator, Iterator, List, Mapping, Optional, Sequence

import httpx

from ._types import Job, Submitted, WaitTimeout, error_from

# Statuses answered for what passes: a retry after a pause may be accepted.
_RETRIED_STATUSES = frozenset({429, 502, 503, 504})
# The most one Prefer: wait may ask for (the server's bound).
_MAX_WAIT_S = 60


@dataclass
class _Request:
    method: str
    path: str
    body: Any = None
    params: Optional[Dict[str, Any]] = None
    headers: Optional[Dict[str, str]] = None
    timeout: Optional[float] = None


@dataclass
class _Sleep:
    seconds: float


@dataclass
class _Answer:
    status: int
    headers: Mapping[str, str]
    body: Any  # the parsed JSON, or None


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _new_id() -> str:
    return uuid.uuid4().hex


class _Calls:
    """The calls, as generators; the transports are the subclasses'."""

    def __init__(self, base_url: str, api_key: Optional[str], timeout: float, max_retries: int,
                 max_retry_delay: float):
        if max_retries < 0:
            raise ValueError("max_retries must not be negative")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_retry_delay = max_retry_delay

    def _headers(self) -> Dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        return headers

    # One request, tried again on what passes (429, 502, 503, 504 and a lost connection) up to
    # max_retries times, after the server's Retry-After or an exponential pause with jitter, never
    # past `deadline` (time.monotonic()). Every call is safe to send again: a submission carries
    # its id, so a second one is answered as the same job.
    def _call(self, request: _Request, ok=(200,), deadline: Optional[float] = None):
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                answer = yield request
            except httpx.TransportError:
                if last:
                    raise
                pause = self._pause(attempt, None)
            else:
                if answer.status in ok:
                    return answer
                retry_after = _retry_after(answer.headers)
                if answer.status not in _RETRIED_STATUSES or last:
                    raise error_from(answer.status, answer.body, retry_after)
                pause = self._pause(attempt, retry_after)
            if deadline is not None and time.monotonic() + pause >= deadline:
                pause = max(0.0, deadline - time.monotonic())
            yield _Sleep(pause)
        raise AssertionError("unreachable")

    def _pause(self, attempt: int, retry_after: Optional[float]) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_delay)
        return random.uniform(0, min(self.max_retry_delay, 0.25 * 2 ** attempt))

    def _submit(self, input: Any, id: Optional[str], callback_url: Optional[str],
                model: Optional[str], version: Optional[str], priority: Optional[int],
                max_queue_seconds: Optional[float], webhook_events: Optional[Sequence[str]],
                traceparent: Optional[str]):
        body = self._job_body(input, id, callback_url, model, version, priority,
                              max_queue_seconds, webhook_events)
        headers = {"traceparent": traceparent} if traceparent else None
        yield from self._call(_Request("POST", "/v1/inferences", body, headers=headers),
                              ok=(202,))
        return Job(id=body["id"], status="queued", raw={"id": body["id"]})

    @staticmethod
    def _job_body(input, id, callback_url, model, version, priority, max_queue_seconds,
                  webhook_events) -> Dict[str, Any]:
        body: Dict[str, Any] = {"id": id or _new_id(), "input": input}
        for name, value in (("callback_url", callback_url), ("model", model),
                            ("version", version), ("priority", priority),
                            ("max_queue_seconds", max_queue_seconds)):
            if value is not None:
                body[name] = value
        if webhook_events is not None:
            body["webhook_events"] = list(webhook_events)
        return body

    def _submit_batch(self, jobs: Sequence[Mapping[str, Any]]):
        body = {"jobs": []}
        for job in jobs:
            job = dict(job)
            job.setdefault("id", _new_id())
            body["jobs"].append(job)
        answer = yield from self._call(_Request("POST", "/v1/inferences:batch", body))
        out: List[Submitted] = []
        for sent, result in zip(body["jobs"], answer.body["results"]):
            status = int(result.get("status", 0))
            error = None if status == 202 else error_from(status, result, None)
            out.append(Submitted(result.get("id", sent.get("id")), status, error))
        return out

    def _get(self, id: str, wait_s: int = 0, deadline: Optional[float] = None):
        headers = {"Prefer": "wait=%d" % wait_s} if wait_s > 0 else None
        timeout = self.timeout + wait_s if wait_s > 0 else None
        answer = yield from self._call(
            _Request("GET", "/v1/inferences/" + _path_part(id), headers=headers,
                     timeout=timeout),
            deadline=deadline)
        return Job.from_answer(answer.body)

    def _wait(self, id: str, timeout: float):
        if timeout < 0:
            raise ValueError("timeout must not be negative")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            # Long polls of whole seconds while a second or more is left; then plain polls.
            wait_s = min(_MAX_WAIT_S, int(math.floor(left))) if left >= 1 else 0
            job = yield from self._get(id, wait_s, deadline)
            if job.done:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(job, timeout)
            if wait_s == 0:
                yield _Sleep(min(left, 0.1))

    def _run(self, input: Any, timeout: float, **options):
        job = yield from self._submit(input, **options)
        return (yield from self._wait(job.id, timeout))

    def _cancel(self, id: str):
        answer = yield from self._call(_Request("DELETE", "/v1/inferences/" + _path_part(id)))
        return Job.from_answer(answer.body)

    def _redeliver(self, id: str):
        yield from self._call(
            _Request("POST", "/v1/inferences/" + _path_part(id) + "/redeliver"), ok=(202,))
        return (yield from self._get(id))

    def _dead_letter_page(self, limit: int, cursor: Optional[str]):
        params: Dict[str, Any] = {"callback_state": "failed", "limit": limit}
        if cursor:
            params["cursor"] = cursor
        answer = yield from self._call(_Request("GET", "/v1/inferences", params=params))
        jobs = [Job.from_answer(entry) for entry in answer.body.get("jobs", [])]
        return jobs, answer.body.get("next_cursor")

    def _webhook_keys(self, tenant: Optional[str]):
        params = {"tenant": tenant} if tenant else None
        answer = yield from self._call(_Request("GET", "/v1/webhook-keys", params=params))
        return list(answer.body.get("keys", []))

    def _webhook_secret(self):
        answer = yield from self._call(_Request("GET", "/v1/webhook-secret"))
        return answer.body["secret"]


def _path_part(id: str) -> str:
    if not id or "/" in id:
        raise ValueError("a job id is 1 to 128 characters of A-Z a-z 0-9 . _ : -")
    return id


def _answer_of(response: httpx.Response) -> _Answer:
    body = None
    if response.content:
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
    return _Answer(response.status_code, response.headers, body)


class Client(_Calls):
    """A blocking client of one rebound-server (or a load balancer in front of a fleet).

    ``api_key``: the ``--api-key`` to send (``Authorization: Bearer``). ``timeout``: seconds
    for each request (a long poll adds its wait). ``max_retries``: how often a request is sent
    again after ``429``/``502``/``503``/``504`` (after the server's ``Retry-After``, at most
    ``max_retry_delay`` seconds) or a lost connection. Submissions carry an id (yours, or a
    random one), so a retry never makes a second job. Thread-safe (httpx's client is); close
    it, or use it as a context manager.

    Example::

        with Client("http://127.0.0.1:8080") as c:
            job = c.run([5.1, 3.5, 1.4, 0.2], timeout=60)
            print(job.status, job.result)
    """

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 30.0,
                 max_retries: int = 5, max_retry_delay: float = 30.0,
                 http_client: Optional[httpx.Client] = None):
        super().__init__(base_url, api_key, timeout, max_retries, max_retry_delay)
        self._http = http_client or httpx.Client(timeout=timeout)
        self._own_http = http_client is None

    def close(self) -> None:
        if self._own_http:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _drive(self, call: Generator):
        step = next(call)
        while True:
            try:
                if isinstance(step, _Sleep):
                    time.sleep(step.seconds)
                    step = call.send(None)
                    continue
                try:
                    response = self._http.request(
                        step.method, self.base_url + step.path, json=step.body,
                        params=step.params, headers={**self._headers(), **(step.headers or {})},
                        timeout=step.timeout if step.timeout is not None else self.timeout)
                except httpx.TransportError as e:
                    step = call.throw(e)
                    continue
                step = call.send(_answer_of(response))
            except StopIteration as done:
                return done.value

    def submit(self, input: Any = None, *, id: Optional[str] = None,
               callback_url: Optional[str] = None, model: Optional[str] = None,
               version: Optional[str] = None, priority: Optional[int] = None,
               max_queue_seconds: Optional[float] = None,
               webhook_events: Optional[Sequence[str]] = None,
               traceparent: Optional[str] = None) -> Job:
        """Submits a job (``POST /v1/inferences``) and returns it as accepted (``status``
        ``queued``; poll or wait for more). ``id``: yours, so that a resubmission is the same
        job; a random one when None. Raises a ReboundError subclass when refused."""
        return self._drive(self._submit(input, id, callback_url, model, version, priority,
                                        max_queue_seconds, webhook_events, traceparent))

    def submit_batch(self, jobs: Sequence[Mapping[str, Any]]) -> List[Submitted]:
        """Submits up to 1,000 jobs at once (``POST /v1/inferences:batch``), each a dict of the
        submission's fields (an ``id`` is added where missing). One result per job, in order:
        each job is accepted or refused on its own."""
        return self._drive(self._submit_batch(jobs))

    def get(self, id: str) -> Job:
        """The job's state now (``GET /v1/inferences/{id}``); NotFound for an unknown id."""
        return self._drive(self._get(id))

    def wait(self, id: str, timeout: float = 600) -> Job:
        """Waits until the job is final, with long polls (``Prefer: wait``) that never pass
        ``timeout`` seconds; raises WaitTimeout after it (the job goes on)."""
        return self._drive(self._wait(id, timeout))

    def run(self, input: Any = None, *, timeout: float = 600, **options) -> Job:
        """Submits a job and waits for it (``submit``'s options, ``wait``'s timeout)."""
        return self._drive(self._run(input, timeout, **_submit_options(options)))

    def cancel(self, id: str) -> Job:
        """Cancels a job that is not final (``DELETE``); AlreadyFinished when it is."""
        return self._drive(self._cancel(id))

    def redeliver(self, id: str) -> Job:
        """Sends a given-up callback again (with a fresh attempt budget) and returns the job as
        polled right after; CallbackNotFailed when it was not given up."""
        return self._drive(self._redeliver(id))

    def dead_letters(self, page_size: int = 100) -> Iterator[Job]:
        """The caller's jobs whose callback was given up, newest first, page by page."""
        cursor = None
        while True:
            jobs, cursor = self._drive(self._dead_letter_page(page_size, cursor))
            yield from jobs
            if not cursor:
                return

    def webhook_keys(self, tenant: Optional[str] = None) -> List[str]:
        """The ``whpk_`` public keys that verify ``v1a`` callback signatures."""
        return self._drive(self._webhook_keys(tenant))

    def webhook_secret(self) -> str:
        """The ``whsec_`` secret the caller's callbacks are signed with (``v1``)."""
        return self._drive(self._webhook_secret())


class AsyncClient(_Calls):
    """The same calls as Client, for asyncio (``await c.submit(...)``; ``dead_letters`` is an
    async iterator). Close it with ``await c.aclose()`` or ``async with``."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 30.0,
                 max_retries: int = 5, max_retry_delay: float = 30.0,
                 http_client: Optional[httpx.AsyncClient] = None):
        super().__init__(base_url, api_key, timeout, max_retries, max_retry_delay)
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._own_http = http_client is None

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _drive(self, call: Generator):
        step = next(call)
        while True:
            try:
                if isinstance(step, _Sleep):
                    await asyncio.sleep(step.seconds)
                    step = call.send(None)
                    continue
                try:
                    response = await self._http.request(
                        step.method, self.base_url + step.path, json=step.body,
                        params=step.params, headers={**self._headers(), **(step.headers or {})},
                        timeout=step.timeout if step.timeout is not None else self.timeout)
                except httpx.TransportError as e:
                    step = call.throw(e)
                    continue
                step = call.send(_answer_of(response))
            except StopIteration as done:
                return done.value

    async def submit(self, input: Any = None, *, id: Optional[str] = None,
                     callback_url: Optional[str] = None, model: Optional[str] = None,
                     version: Optional[str] = None, priority: Optional[int] = None,
                     max_queue_seconds: Optional[float] = None,
                     webhook_events: Optional[Sequence[str]] = None,
                     traceparent: Optional[str] = None) -> Job:
        return await self._drive(self._submit(input, id, callback_url, model, version, priority,
                                              max_queue_seconds, webhook_events, traceparent))

    async def submit_batch(self, jobs: Sequence[Mapping[str, Any]]) -> List[Submitted]:
        return await self._drive(self._submit_batch(jobs))

    async def get(self, id: str) -> Job:
        return await self._drive(self._get(id))

    async def wait(self, id: str, timeout: float = 600) -> Job:
        return await self._drive(self._wait(id, timeout))

    async def run(self, input: Any = None, *, timeout: float = 600, **options) -> Job:
        return await self._drive(self._run(input, timeout, **_submit_options(options)))

    async def cancel(self, id: str) -> Job:
        return await self._drive(self._cancel(id))

    async def redeliver(self, id: str) -> Job:
        return await self._drive(self._redeliver(id))

    async def dead_letters(self, page_size: int = 100):
        cursor = None
        while True:
            jobs, cursor = await self._drive(self._dead_letter_page(page_size, cursor))
            for job in jobs:
                yield job
            if not cursor:
                return

    async def webhook_keys(self, tenant: Optional[str] = None) -> List[str]:
        return await self._drive(self._webhook_keys(tenant))

    async def webhook_secret(self) -> str:
        return await self._drive(self._webhook_secret())


_SUBMIT_OPTIONS = ("id", "callback_url", "model", "version", "priority", "max_queue_seconds",
                   "webhook_events", "traceparent")


def _submit_options(options: Dict[str, Any]) -> Dict[str, Any]:
    unknown = set(options) - set(_SUBMIT_OPTIONS)
    if unknown:
        raise TypeError("unknown option(s): " + ", ".join(sorted(unknown)))
    return {name: options.get(name) for name in _SUBMIT_OPTIONS}
