"""A FastAPI dependency that hands a route the verified payload of a rebound callback.

    from fastapi import Depends, FastAPI
    from rebound_client import WebhookVerifier
    from rebound_client.fastapi import verified_callback

    app = FastAPI()
    callback = verified_callback(WebhookVerifier(secrets=["whsec_..."]))

    @app.post("/hook")
    async def hook(payload: dict = Depends(callback)):
        ...  # payload["id"], payload["status"], payload.get("result")

A callback that does not verify is answered 400 before the route runs (so rebound-server counts
the attempt as failed, and a forger learns nothing else). The body is read as the raw bytes the
signature covers. Needs FastAPI (Starlette); imported only by this module.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from fastapi import HTTPException, Request

from .webhooks import WebhookVerificationError, WebhookVerifier


def verified_callback(verifier: WebhookVerifier) -> Callable[[Request], Awaitable[Any]]:
    """A dependency (``Depends(verified_callback(verifier))``) answering the callback's payload,
    or raising HTTPException(400) when it does not verify."""

    async def dependency(request: Request) -> Any:
        body = await request.body()
        try:
            return verifier.verify(request.headers, body)
        except WebhookVerificationError as e:
            raise HTTPException(status_code=400, detail="invalid webhook: %s" % e) from None

    return dependency
