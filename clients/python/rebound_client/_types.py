"""What the server answers, as Python values: jobs and errors."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

#: The states a job ends in.
FINAL_STATUSES = frozenset({"succeeded", "failed", "expired", "cancelled"})


@dataclass
class JobError:
    """Why a job failed: the model's code (``invalid_input``, ``model_error``, ``expired``,
    ``cancelled``, ...) and its message."""

    code: str
    message: str = ""


@dataclass
class Job:
    """A job as the server answered it (a poll, a wait, a cancellation, a dead-letter entry).

    ``status`` is one of ``queued``, ``running``, ``succeeded``, ``failed``, ``expired`` and
    ``cancelled``. ``callback`` is the callback's state as the server reports it (``url``,
    ``state``: ``none``, ``pending``, ``delivered`` or ``failed``, ``attempts``, ...), or None
    without one. ``model`` is ``{"name", "version"}``: the model and version the job runs on,
    chosen when it was accepted (None from a server that names none). ``raw`` is the whole
    answer."""

    id: str
    status: str
    result: Any = None
    error: Optional[JobError] = None
    priority: Optional[int] = None
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    queue_position: Optional[int] = None
    callback: Optional[Dict[str, Any]] = None
    model: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        """True once the job is final (it will not change again)."""
        return self.status in FINAL_STATUSES

    @classmethod
    def from_answer(cls, body: Dict[str, Any]) -> "Job":
        error = body.get("error")
        return cls(
            id=body["id"],
            status=body["status"],
            result=body.get("result"),
            error=JobError(error.get("code", ""), error.get("message", "")) if error else None,
            priority=body.get("priority"),
            created_at=body.get("created_at"),
            started_at=body.get("started_at"),
            finished_at=body.get("finished_at"),
            queue_position=body.get("queue_position"),
            callback=body.get("callback"),
            model=body.get("model"),
            raw=body,
        )


@dataclass
class ModelVersion:
    """One version of a model (``GET /v1/models``): ``state`` is ``loading``, ``ready``,
    ``failed``, ``draining`` or ``unloaded``; ``digest`` is ``sha256:<hex>`` over its files (None
    when the server does not say); ``queued`` and ``running`` are the store's counts (None while
    it cannot count); ``error`` says why a ``failed`` version failed."""

    version: str
    state: str
    digest: Optional[str] = None
    loaded_at: Optional[str] = None
    queued: Optional[int] = None
    running: Optional[int] = None
    error: Optional[JobError] = None

    @classmethod
    def from_answer(cls, body: Dict[str, Any]) -> "ModelVersion":
        if not isinstance(body.get("version"), str) or not isinstance(body.get("state"), str):
            raise TypeError("a model version without its version and state")
        error = body.get("error")
        return cls(version=body["version"], state=body["state"], digest=body.get("digest"),
                   loaded_at=body.get("loaded_at"), queued=body.get("queued"),
                   running=body.get("running"),
                   error=JobError(error.get("code", ""), error.get("message", ""))
                   if error else None)


@dataclass
class Model:
    """A model the server serves (``GET /v1/models``): its versions, the one a submission
    without ``version`` runs on (``default_version``), the versions that take a share of the
    traffic (``split``: ``{"version", "percent"}``) and the route's ``generation``. ``raw`` is
    the whole answer."""

    name: str
    default_version: str
    versions: List[ModelVersion]
    split: List[Dict[str, Any]] = field(default_factory=list)
    generation: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_answer(cls, body: Dict[str, Any]) -> "Model":
        if not isinstance(body.get("name"), str) or not isinstance(body.get("default_version"), str) \
                or not isinstance(body.get("versions"), list) \
                or not isinstance(body.get("split", []), list):
            raise TypeError("a model without its name, default version or versions")
        return cls(name=body["name"], default_version=body["default_version"],
                   versions=[ModelVersion.from_answer(v) for v in body["versions"]],
                   split=list(body.get("split") or []), generation=body.get("generation"),
                   raw=body)


@dataclass
class Submitted:
    """One job of a batch, as the server answered it: ``status`` 202 (accepted, ``error`` None)
    or the status of the refusal, with its ``error`` (a ReboundError, not raised)."""

    id: Optional[str]
    status: int
    error: Optional["ReboundError"] = None

    @property
    def accepted(self) -> bool:
        return self.status == 202


class ReboundError(Exception):
    """An error answer of the server: its HTTP ``status``, its ``code`` (``queue_full``,
    ``id_conflict``, ...), ``message``, the ``field`` at fault when one is, and ``retry_after``
    (seconds) when the server said when to try again."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


class BadRequest(ReboundError):
    """400: the request could not be read (``invalid_json``, ``bad_request``, ...)."""


class Unauthorized(ReboundError):
    """401: no API key, or a wrong one."""


class Forbidden(ReboundError):
    """403: the key may not do this (a viewer's key, a tenant's key on an operator route)."""


class NotFound(ReboundError):
    """404: no such job (or another tenant's)."""


class Conflict(ReboundError):
    """409: the request conflicts with the job's state."""


class IdConflict(Conflict):
    """409 ``id_conflict``: the id was submitted before with another request."""


class AlreadyFinished(Conflict):
    """409 ``already_finished``: a cancellation of a job that is final."""


class CallbackNotFailed(Conflict):
    """409 ``callback_not_failed``: a redelivery of a callback that was not given up."""


class PreconditionFailed(ReboundError):
    """412 ``route_changed``: ``if_generation`` names a route someone changed since."""


class InvalidField(ReboundError):
    """422: a missing or wrong field (``field`` names it), or an input the model refuses."""


class TooManyRequests(ReboundError):
    """429: the caller's share of the queue (``tenant_quota``) or its rate (``tenant_rate``)."""


class ServiceUnavailable(ReboundError):
    """503: the server cannot take it now (``not_ready``, ``shutting_down``,
    ``store_unavailable``, ``server_busy``, ``too_many_waiters``)."""


class QueueFull(ServiceUnavailable):
    """503 ``queue_full``: the queue holds all it may; try again after ``retry_after``."""


class WaitTimeout(TimeoutError):
    """The job was not final by the wait's deadline. The job goes on (a wait never cancels it):
    ``job`` is its last known state, or None when no poll was answered before the deadline (a
    hung server or network): its state is then not known. ``id`` is the job's id either way."""

    def __init__(self, id: str, job: Optional[Job], timeout: float):
        if job is None:
            super().__init__(f"job {id}: no answer within {timeout:g} s")
        else:
            super().__init__(f"job {id} still {job.status} after {timeout:g} s")
        self.id = id
        self.job = job
        self.timeout = timeout


_BY_CODE = {
    "id_conflict": IdConflict,
    "already_finished": AlreadyFinished,
    "callback_not_failed": CallbackNotFailed,
    "queue_full": QueueFull,
}
_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    422: InvalidField,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def error_from(status: int, body: Any, retry_after: Optional[float]) -> ReboundError:
    """The exception for an error answer (its JSON body already parsed, or None)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": "http_%d" % status, "message": "HTTP %d" % status}
    code = str(error.get("code", ""))
    kind = _BY_CODE.get(code) or _BY_STATUS.get(status, ReboundError)
    return kind(status, code, str(error.get("message", "")), error.get("field"), retry_after)
