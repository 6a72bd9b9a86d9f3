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
import re
import time
import uuid
from dataclasses import dataclass
from typing import (Any, Dict, Generator, Iterator, List, Literal, Mapping, Optional, Sequence,
                    Union)

import httpx

from ._types import Job, Model, ReboundError, Submitted, WaitTimeout, error_from

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
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    if re.fullmatch(r"[0-9]{1,10}", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _new_id() -> str:
    return uuid.uuid4().hex


_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _path_part(id: str) -> str:
    # A job id as the server takes it; anything else ('#', '?', '%', '/', '..') would name
    # another route or another job once in a URL.
    if not isinstance(id, str) or not _ID.fullmatch(id) or id in (".", ".."):
        raise ValueError("a job id is 1 to 128 characters of A-Z a-z 0-9 . _ : -, not %r" % (id,))
    return id


_MODEL = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def _model_part(name: str) -> str:
    # A model name as the server takes it (never '.', '..', '/', '%').
    if not isinstance(name, str) or not _MODEL.fullmatch(name):
        raise ValueError("a model name is 1 to 64 characters of a-z 0-9 . _ -, the first a letter "
                         "or a digit, not %r" % (name,))
    return name


_VERSION = re.compile(r"[1-9][0-9]{0,17}")
# A route's split: versions to percents, or the route's own list of {"version", "percent"}.
Split = Union[Mapping[str, int], Mapping[int, int], Sequence[Mapping[str, Any]]]


def _version_part(version: Any) -> str:
    # A version as the server takes it: a positive whole number, no leading zero.
    text = str(version) if isinstance(version, int) and not isinstance(version, bool) else version
    if not isinstance(text, str) or not _VERSION.fullmatch(text):
        raise ValueError("a version is a positive whole number without leading zeros (at most 18 "
                         "digits), not %r" % (version,))
    return text


def _percent(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100:
        raise ValueError("a split's percent is a whole number from 1 to 100, not %r" % (value,))
    return value


def _route_body(default_version: Any, split: Any) -> Dict[str, Any]:
    # The split in its order (the server deals the percents out in it): a mapping of versions to
    # percents, or the route's own list of {"version", "percent"} (Model.split as read).
    if split is None:
        pairs: List[Any] = []
    elif isinstance(split, Mapping):
        pairs = list(split.items())
    elif isinstance(split, Sequence) and not isinstance(split, (str, bytes)):
        pairs = []
        for entry in split:
            if not isinstance(entry, Mapping) or set(entry) != {"version", "percent"}:
                raise ValueError("a split entry is {'version': ..., 'percent': ...}, not %r"
                                 % (entry,))
            pairs.append((entry["version"], entry["percent"]))
    else:
        raise ValueError("split maps versions to percents ({'3': 10}), or lists them "
                         "([{'version': '3', 'percent': 10}]), not %r" % (split,))
    return {"default_version": _version_part(default_version),
            "split": [{"version": _version_part(v), "percent": _percent(p)} for v, p in pairs]}


class _DeadlinePassed(Exception):
    """A call with a deadline could not be answered before it (a wait ends in WaitTimeout)."""


def _invalid(answer: "_Answer", what: str) -> ReboundError:
    return ReboundError(answer.status, "invalid_response", "the answer is not " + what)


def _object(answer: "_Answer", what: str) -> Dict[str, Any]:
    if not isinstance(answer.body, dict):
        raise _invalid(answer, what)
    return answer.body


def _job(answer: "_Answer", body: Any = None) -> Job:
    body = answer.body if body is None else body
    if not (isinstance(body, dict) and isinstance(body.get("id"), str)
            and isinstance(body.get("status"), str)
            and (body.get("error") is None or isinstance(body.get("error"), dict))):
        raise _invalid(answer, "a job")
    return Job.from_answer(body)


class _Calls:
    """The calls, as generators; the transports are the subclasses'."""

    def __init__(self, base_url: str, api_key: Optional[str], timeout: float, max_retries: int,
                 max_retry_delay: float):
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError("max_retries must be a whole number, not negative")
        for name, value in (("timeout", timeout), ("max_retry_delay", max_retry_delay)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(name + " must be a finite number of seconds, not negative")
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

    def _request_of(self, step: "_Request") -> Dict[str, Any]:
        """httpx's request arguments for one step (both transports send the same)."""
        return dict(method=step.method, url=self.base_url + step.path, json=step.body,
                    params=step.params, headers={**self._headers(), **(step.headers or {})},
                    timeout=step.timeout if step.timeout is not None else self.timeout)

    # One request (`make(left)` builds it, given the seconds left before `deadline`, or None),
    # tried again on what passes (429, 502, 503, 504 and a lost connection) up to max_retries
    # times, after the server's Retry-After or an exponential pause with jitter. With a deadline
    # (time.monotonic()) no request outlives it and no retry starts after it: _DeadlinePassed.
    # A submission is safe to send again (its id makes a second one the same job); a call that is
    # not (cancel, redeliver) names in `resent_ok` the refusals that, after a lost connection,
    # mean its first send did the work: those answers are returned, not raised. A gateway's 502
    # or 504 counts as a lost connection there (the server may have acted before it went quiet).
    # `degrade(error)`, when given, is told each refusal first; True: the caller's `make` now
    # builds another request (a long poll refused 503 too_many_waiters becomes a plain poll),
    # sent at once.
    def _call(self, make, ok=(200,), deadline: Optional[float] = None, resent_ok=(),
              degrade=None):
        lost = False
        attempt = 0  # tries that count against max_retries (a degraded one does not)
        while True:
            last = attempt == self.max_retries
            degraded = False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise _DeadlinePassed()
            request = make(left)
            if left is not None:
                request.timeout = min(request.timeout or self.timeout, max(left, 0.001))
            try:
                answer = yield request
            except httpx.TransportError as e:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _DeadlinePassed()
                if last:
                    raise
                # (A connection never made sent nothing.)
                lost = lost or not isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                pause = self._pause(attempt, None)
            else:
                if answer.status in ok:
                    return answer
                retry_after = _retry_after(answer.headers)
                error = error_from(answer.status, answer.body, retry_after)
                if lost and error.code in resent_ok:
                    return answer
                lost = lost or answer.status in (502, 504)
                degraded = degrade is not None and degrade(error)
                if not degraded and (answer.status not in _RETRIED_STATUSES or last):
                    raise error
                pause = 0.0 if degraded else self._pause(attempt, retry_after)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            yield _Sleep(pause)
            attempt += 0 if degraded else 1

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
        yield from self._call(lambda left: _Request("POST", "/v1/inferences", body,
                                                    headers=headers), ok=(202,))
        return Job(id=body["id"], status="queued", raw={"id": body["id"]})

    @staticmethod
    def _job_body(input, id, callback_url, model, version, priority, max_queue_seconds,
                  webhook_events) -> Dict[str, Any]:
        # (An id given as "" is sent as such, and refused: never replaced by a random one, which
        # would make every resubmission a new job.)
        body: Dict[str, Any] = {"id": id if id is not None else _new_id(), "input": input}
        for name, value in (("callback_url", callback_url), ("model", model),
                            ("version", version), ("priority", priority),
                            ("max_queue_seconds", max_queue_seconds)):
            if value is not None:
                body[name] = value
        if webhook_events is not None:
            body["webhook_events"] = list(webhook_events)
        return body

    def _submit_batch(self, jobs: Sequence[Mapping[str, Any]]):
        body: Dict[str, Any] = {"jobs": []}
        for job in jobs:
            job = dict(job)
            if job.get("id") is None:
                job["id"] = _new_id()
            body["jobs"].append(job)
        answer = yield from self._call(lambda left: _Request("POST", "/v1/inferences:batch", body))
        results = _object(answer, "a batch's results").get("results")
        if not isinstance(results, list) or len(results) != len(body["jobs"]) or not all(
                isinstance(r, dict) and isinstance(r.get("status"), int) for r in results):
            raise _invalid(answer, "one result per job")
        out: List[Submitted] = []
        for sent, result in zip(body["jobs"], results):
            status = result["status"]
            error = None if status == 202 else error_from(status, result, None)
            out.append(Submitted(result.get("id", sent.get("id")), status, error))
        return out

    def _get(self, id: str, wait_s: int = 0, deadline: Optional[float] = None):
        path = "/v1/inferences/" + _path_part(id)
        plain = False  # the server has as many waiters as it takes: poll without waiting

        def make(left):
            # A long poll asks for whole seconds, never more than is left.
            w = wait_s if left is None else min(wait_s, int(math.floor(left)))
            if w <= 0 or plain:
                return _Request("GET", path)
            return _Request("GET", path, headers={"Prefer": "wait=%d" % w},
                            timeout=self.timeout + w)

        def degrade(error):
            nonlocal plain
            if plain or wait_s <= 0 or error.code != "too_many_waiters":
                return False
            plain = True
            return True

        answer = yield from self._call(make, deadline=deadline, degrade=degrade)
        return _job(answer)

    def _wait(self, id: str, timeout: float):
        if not (math.isfinite(timeout) and timeout >= 0):
            raise ValueError("timeout must be a finite number of seconds, not negative")
        _path_part(id)
        deadline = time.monotonic() + timeout
        job = None  # (until a poll is answered)
        early = 0  # long polls answered well before their time, in a row
        while True:
            left = deadline - time.monotonic()
            # Long polls of whole seconds while a second or more is left; then plain polls.
            wait_s = min(_MAX_WAIT_S, int(math.floor(left))) if left >= 1 else 0
            asked = time.monotonic()
            try:
                job = yield from self._get(id, wait_s, deadline)
            except _DeadlinePassed:
                raise WaitTimeout(id, job, timeout) from None
            if job.done:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(id, job, timeout)
            # A poll that came back at once (plain, or a long poll that something in between did
            # not honour) is followed by a pause, growing, so that a wait never spins.
            took = time.monotonic() - asked
            early = early + 1 if took < max(0.05, wait_s / 2) else 0
            if early:
                yield _Sleep(min(left, 0.1 * 2 ** min(early - 1, 4)))

    def _run(self, input: Any, timeout: float, **options):
        job = yield from self._submit(input, **options)
        return (yield from self._wait(job.id, timeout))

    def _cancel(self, id: str):
        path = "/v1/inferences/" + _path_part(id)
        answer = yield from self._call(lambda left: _Request("DELETE", path),
                                       resent_ok=("already_finished",))
        if answer.status != 200:  # the first DELETE cancelled it, if the job says so
            job = yield from self._get(id)
            if job.status == "cancelled":
                return job
            raise error_from(answer.status, answer.body, _retry_after(answer.headers))
        return _job(answer)

    def _redeliver(self, id: str):
        path = "/v1/inferences/" + _path_part(id) + "/redeliver"
        yield from self._call(lambda left: _Request("POST", path), ok=(202,),
                              resent_ok=("callback_not_failed",))
        return (yield from self._get(id))

    def _dead_letter_page(self, limit: int, cursor: Optional[str]):
        params: Dict[str, Any] = {"callback_state": "failed", "limit": limit}
        if cursor:
            params["cursor"] = cursor
        answer = yield from self._call(
            lambda left: _Request("GET", "/v1/inferences", params=params))
        page = _object(answer, "a page")
        entries, cursor = page.get("jobs"), page.get("next_cursor")
        if not isinstance(entries, list) or not (cursor is None or isinstance(cursor, str)):
            raise _invalid(answer, "a page")
        return [_job(answer, entry) for entry in entries], cursor

    def _webhook_keys(self, tenant: Optional[str]):
        params = {"tenant": tenant} if tenant else None
        answer = yield from self._call(
            lambda left: _Request("GET", "/v1/webhook-keys", params=params))
        keys = _object(answer, "a list of keys").get("keys")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _invalid(answer, "a list of keys")
        return keys

    def _models(self):
        answer = yield from self._call(lambda left: _Request("GET", "/v1/models"))
        models = _object(answer, "a list of models").get("models")
        if not isinstance(models, list):
            raise _invalid(answer, "a list of models")
        try:
            return [Model.from_answer(m) for m in models]
        except (KeyError, TypeError, AttributeError):
            raise _invalid(answer, "a list of models") from None

    def _model(self, name: str):
        answer = yield from self._call(
            lambda left: _Request("GET", "/v1/models/" + _model_part(name)))
        try:
            return Model.from_answer(_object(answer, "a model"))
        except (KeyError, TypeError, AttributeError):
            raise _invalid(answer, "a model") from None

    def _changed_model(self, method: str, path: str, ok, body: Any = None,
                       params: Optional[Dict[str, Any]] = None,
                       headers: Optional[Dict[str, str]] = None):
        answer = yield from self._call(
            lambda left: _Request(method, path, body, params=params, headers=headers), ok=ok)
        try:
            return Model.from_answer(_object(answer, "a model"))
        except (KeyError, TypeError, AttributeError):
            raise _invalid(answer, "a model") from None

    # (A load of a version ready already answers 200, so sending one again is safe; so is an
    # unload. A route sent again after a lost answer with if_generation is refused 412 when the
    # first send did it: the model is then read, and answered when it is that route, one
    # generation on.)
    def _load_version(self, name: str, version: Any):
        path = "/v1/models/%s/versions/%s" % (_model_part(name), _version_part(version))
        return (yield from self._changed_model("PUT", path, (200, 202)))

    def _unload_version(self, name: str, version: Any, queued: str):
        if queued not in ("finish", "reroute"):
            raise ValueError("queued is 'finish' or 'reroute', not %r" % (queued,))
        path = "/v1/models/%s/versions/%s" % (_model_part(name), _version_part(version))
        return (yield from self._changed_model("DELETE", path, (202,), params={"queued": queued}))

    def _set_route(self, name: str, default_version: Any, split: Any,
                   if_generation: Optional[int]):
        body = _route_body(default_version, split)
        headers = None
        if if_generation is not None:
            if not isinstance(if_generation, int) or isinstance(if_generation, bool) \
                    or not 1 <= if_generation < 2 ** 64:
                raise ValueError("if_generation is a generation (a positive whole number), not %r"
                                 % (if_generation,))
            headers = {"If-Match": '"%d"' % if_generation}
        path = "/v1/models/%s/route" % _model_part(name)
        answer = yield from self._call(
            lambda left: _Request("PUT", path, body, headers=headers), ok=(200,),
            resent_ok=("route_changed",) if if_generation is not None else ())
        if answer.status != 200:
            # Sent again after a lost answer, and refused: done by the first send when the
            # model has this route now, one generation on; else someone else's change came first.
            now = yield from self._model(name)
            if now.generation == if_generation + 1 and now.default_version == \
                    body["default_version"] and now.split == body["split"]:
                return now
            raise error_from(answer.status, answer.body, None)
        try:
            return Model.from_answer(_object(answer, "a model"))
        except (KeyError, TypeError, AttributeError):
            raise _invalid(answer, "a model") from None

    def _webhook_secret(self):
        answer = yield from self._call(lambda left: _Request("GET", "/v1/webhook-secret"))
        secret = _object(answer, "a secret").get("secret")
        if not isinstance(secret, str):
            raise _invalid(answer, "a secret")
        return secret


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
                    response = self._http.request(**self._request_of(step))
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

    def models(self) -> List[Model]:
        """The models the server serves, each with its versions."""
        return self._drive(self._models())

    def model(self, name: str) -> Model:
        """One model; NotFound (code ``model_not_found``) when the server has none of that
        name."""
        return self._drive(self._model(name))

    def load_version(self, name: str, version: Union[str, int]) -> Model:
        """Loads a version of the server's model repository in the background (operator key):
        the model, the version ``loading`` (or ``ready``); ``model(name)`` tells when it is
        ready or ``failed``. With a store servers share, every server loads it."""
        return self._drive(self._load_version(name, version))

    def unload_version(self, name: str, version: Union[str, int], *,
                       queued: Literal["finish", "reroute"] = "finish") -> Model:
        """Unloads a version no route names (operator key): it takes no new job and drains;
        its jobs not started run on it first (``queued="finish"``) or go to the version the
        route chooses for each (``queued="reroute"``). The model, the version ``draining`` or
        ``unloaded``; Conflict (``version_in_route``) while a route names it."""
        return self._drive(self._unload_version(name, version, queued))

    def set_route(self, name: str, default_version: Union[str, int], *,
                  split: Optional[Split] = None,
                  if_generation: Optional[int] = None) -> Model:
        """Where the model's new jobs go (operator key): ``default_version``, and ``split``
        versions with their percent of them, in order (a canary: ``{"2": 10}``, or the route's
        own ``[{"version": "2", "percent": 10}]``). With ``if_generation`` (``Model.generation``
        as read) the change applies only if nobody changed the route since, else
        PreconditionFailed (``route_changed``). The model with its new generation."""
        return self._drive(self._set_route(name, default_version, split, if_generation))

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
                    response = await self._http.request(**self._request_of(step))
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

    async def models(self) -> List[Model]:
        return await self._drive(self._models())

    async def model(self, name: str) -> Model:
        return await self._drive(self._model(name))

    async def load_version(self, name: str, version: Union[str, int]) -> Model:
        return await self._drive(self._load_version(name, version))

    async def unload_version(self, name: str, version: Union[str, int], *,
                             queued: Literal["finish", "reroute"] = "finish") -> Model:
        return await self._drive(self._unload_version(name, version, queued))

    async def set_route(self, name: str, default_version: Union[str, int], *,
                        split: Optional[Split] = None,
                        if_generation: Optional[int] = None) -> Model:
        return await self._drive(self._set_route(name, default_version, split, if_generation))

    async def webhook_secret(self) -> str:
        return await self._drive(self._webhook_secret())


_SUBMIT_OPTIONS = ("id", "callback_url", "model", "version", "priority", "max_queue_seconds",
                   "webhook_events", "traceparent")


def _submit_options(options: Dict[str, Any]) -> Dict[str, Any]:
    unknown = set(options) - set(_SUBMIT_OPTIONS)
    if unknown:
        raise TypeError("unknown option(s): " + ", ".join(sorted(unknown)))
    return {name: options.get(name) for name in _SUBMIT_OPTIONS}
