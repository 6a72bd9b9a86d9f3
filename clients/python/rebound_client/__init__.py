"""rebound_client: submit inference jobs to a rebound-server, wait for them, and verify the
callbacks it sends. See docs/clients.md in the rebound repository."""
from ._client import AsyncClient, Client
from ._types import (AlreadyFinished, BadRequest, CallbackNotFailed, Conflict, FINAL_STATUSES,
                     Forbidden, IdConflict, InvalidField, Job, JobError, Model, ModelVersion,
                     NotFound, PreconditionFailed, QueueFull,
                     ReboundError, ServiceUnavailable, Submitted, TooManyRequests, Unauthorized,
                     WaitTimeout)
from .webhooks import WebhookVerificationError, WebhookVerifier

__all__ = [
    "AlreadyFinished", "AsyncClient", "BadRequest", "CallbackNotFailed", "Client", "Conflict",
    "FINAL_STATUSES", "Forbidden", "IdConflict", "InvalidField", "Job", "JobError", "Model",
    "ModelVersion", "NotFound", "PreconditionFailed",
    "QueueFull", "ReboundError", "ServiceUnavailable", "Submitted", "TooManyRequests",
    "Unauthorized", "WaitTimeout", "WebhookVerificationError", "WebhookVerifier",
]
__version__ = "0.1.0"
