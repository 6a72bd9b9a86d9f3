"""Verifying the callbacks rebound-server sends (Standard Webhooks 1.0 signatures).

A callback carries ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` headers; the
signature is over ``"<id>.<timestamp>.<body>"`` with the body's raw bytes: ``v1,<base64>`` is an
HMAC-SHA256 with a ``whsec_`` secret, ``v1a,<base64>`` an Ed25519 signature that a ``whpk_``
public key verifies (``cryptography`` is needed for those).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import math
import re
import threading
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional


# Signatures read from one header at most: more is an attack on the verifier's CPU (each costs a
# MAC or an Ed25519 check over the whole body), not a rotation.
_MAX_SIGNATURES = 16


class WebhookVerificationError(ValueError):
    """The callback is not one the server signed for you (or not within the time tolerance):
    answer it 4xx and do not act on it."""


def _key_bytes(value: str, prefix: str) -> bytes:
    if not value.startswith(prefix):
        raise ValueError("a key must start with %r" % prefix)
    try:
        return base64.b64decode(value[len(prefix):], validate=True)
    except ValueError as e:
        raise ValueError("%s...: not base64" % prefix) from e


def _header(headers: Any, name: str) -> Optional[str]:
    # A dict-like of any case (Starlette's, httpx's, http.server's message), or a plain dict.
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    value = getter(name)
    if value is None and isinstance(headers, Mapping):
        for key, v in headers.items():
            if key.lower() == name:
                return v
    return value


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as e:
        raise ImportError("v1a (Ed25519) keys need the 'cryptography' package") from e
    return Ed25519PublicKey


class WebhookVerifier:
    """Checks a callback's signature and timestamp, from its headers and its body's raw bytes.

    ``secrets``: ``whsec_`` secrets (``v1``); several while one is rotated out. ``keys``:
    ``whpk_`` public keys (``v1a``). ``fetch_keys``: a function that returns the current public
    keys (``Client(...).webhook_keys``): asked when a ``v1a`` signature matches no key known
    (a key the server rotated in), at most once every ``refetch_interval`` seconds.
    ``tolerance``: how far the timestamp may be from now, in seconds (5 minutes, as the server's
    own verifier). ``fetch_keys`` runs under the verifier's lock and blocks the caller: give it a
    blocking call that answers soon (``Client(..., timeout=5, max_retries=1).webhook_keys``); in
    an asyncio server, fetch with AsyncClient elsewhere and build a new verifier. Thread-safe.

    Example (FastAPI; the body must be the raw bytes)::

        verifier = WebhookVerifier(secrets=["whsec_..."])

        @app.post("/hook")
        async def hook(request: Request):
            payload = verifier.verify(request.headers, await request.body())
    """

    def __init__(self, secrets: Iterable[str] = (), keys: Iterable[str] = (), *,
                 fetch_keys: Optional[Callable[[], List[str]]] = None,
                 tolerance: float = 300, refetch_interval: float = 10):
        if not (math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError("tolerance must be a finite number of seconds, not negative")
        self._secrets = [_key_bytes(s, "whsec_") for s in secrets]
        self._keys = [self._public_key(k) for k in keys]
        if fetch_keys is not None:
            _ed25519()  # fetched keys need it too: say so now, not at the first callback
        self._fetch_keys = fetch_keys
        self._tolerance = tolerance
        self._refetch_interval = refetch_interval
        self._fetched_at = float("-inf")
        self._lock = threading.Lock()
        if not self._secrets and not self._keys and fetch_keys is None:
            raise ValueError("a WebhookVerifier needs a secret, a public key or fetch_keys")

    @staticmethod
    def _public_key(value: str):
        raw = _key_bytes(value, "whpk_")
        return _ed25519().from_public_bytes(raw)

    def verify(self, headers: Any, body: bytes, *, now: Optional[float] = None) -> Any:
        """The callback's JSON payload when its signature and timestamp hold; raises
        WebhookVerificationError otherwise. ``body`` must be the bytes as received (a body
        parsed and serialised again does not verify)."""
        if isinstance(body, str):
            raise TypeError("verify needs the body's raw bytes, not text")
        msg_id = _header(headers, "webhook-id")
        stamp = _header(headers, "webhook-timestamp")
        signatures = _header(headers, "webhook-signature")
        if not msg_id or not stamp or not signatures:
            raise WebhookVerificationError("missing webhook-id, webhook-timestamp or "
                                           "webhook-signature")
        if not re.fullmatch(r"[0-9]{1,12}", stamp):
            raise WebhookVerificationError("webhook-timestamp is not a number of seconds")
        now = time.time() if now is None else now
        if abs(now - int(stamp)) > self._tolerance:
            raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
        entries = signatures.split(" ")
        if len(entries) > _MAX_SIGNATURES:
            raise WebhookVerificationError("more than %d signatures" % _MAX_SIGNATURES)
        v1, v1a = [], []
        for entry in entries:
            version, _, value = entry.partition(",")
            if version not in ("v1", "v1a") or not value:
                continue
            try:
                signature = base64.b64decode(value, validate=True)
            except ValueError:
                continue
            if version == "v1" and len(signature) == 32:
                v1.append(signature)
            elif version == "v1a" and len(signature) == 64:
                v1a.append(signature)
        signed = msg_id.encode() + b"." + stamp.encode() + b"." + bytes(body)
        if v1 and self._hmac_matches(signed, v1):
            return self._payload(body)
        # (v1a entries mean nothing to a verifier without public keys: a forger may add them.)
        if v1a and (self._keys or self._fetch_keys is not None):
            keys = self._keys
            if self._ed25519_matches(signed, v1a, keys) or self._refetched_match(
                    signed, v1a, keys):
                return self._payload(body)
        raise WebhookVerificationError("no signature matches")

    def _hmac_matches(self, signed: bytes, signatures: List[bytes]) -> bool:
        # One MAC per secret, however many signatures the header lists.
        for secret in self._secrets:
            mac = hmac.new(secret, signed, hashlib.sha256).digest()
            if any(hmac.compare_digest(mac, signature) for signature in signatures):
                return True
        return False

    @staticmethod
    def _ed25519_matches(signed: bytes, signatures: List[bytes], keys) -> bool:
        from cryptography.exceptions import InvalidSignature

        for key in keys:
            for signature in signatures:
                try:
                    key.verify(signature, signed)
                    return True
                except InvalidSignature:
                    continue
        return False

    def _refetched_match(self, signed: bytes, signatures: List[bytes], tried) -> bool:
        # Keys fetched again (at most every refetch_interval) when none of `tried` verifies: a
        # key the server rotated in. A verification that waited for another's fetch uses its keys.
        if self._fetch_keys is None:
            return False
        with self._lock:
            if self._keys is tried:
                if time.monotonic() - self._fetched_at < self._refetch_interval:
                    return False
                self._fetched_at = time.monotonic()
                try:
                    fetched = self._fetch_keys()
                    if inspect.isawaitable(fetched):
                        close = getattr(fetched, "close", None)
                        if close:
                            close()
                        raise TypeError("fetch_keys must answer the keys, not a coroutine: "
                                        "pass Client(...).webhook_keys, not AsyncClient's")
                    self._keys = [self._public_key(k) for k in fetched]
                except TypeError:
                    raise
                except Exception as e:
                    raise WebhookVerificationError("the public keys could not be fetched: %s" %
                                                   e) from e
            keys = self._keys
        return self._ed25519_matches(signed, signatures, keys)

    @staticmethod
    def _payload(body: bytes) -> Any:
        try:
            return json.loads(body)
        except ValueError as e:
            raise WebhookVerificationError("the body is not JSON") from e
