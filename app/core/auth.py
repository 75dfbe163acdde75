"""Who a request acts for: API keys on ``/v1``, and the rule for running without them.

Every ``/v1`` request must carry ``Authorization: Bearer <key>`` once any key exists
(revoked keys count, so revoking the last key locks everyone out rather than
opening the service). With no key at all the service is open and every request
acts for the default tenant; ``compactd serve`` allows that only on a loopback
address, unless told ``--insecure-no-auth``.

Verified keys are cached for ``auth_cache_seconds``, so a revocation (made by the
CLI, in another process) takes effect within that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core import metrics
from app.core.database import driver_connection, unavailable, unavailable_cause
from app.core.errors import ProblemError, ServiceUnavailable, Unauthorized
from app.core.http import problem_response
from app.keys import repository, tokens
from app.keys.repository import KeyRow
from app.sessions.models import DEFAULT_TENANT

log = logging.getLogger("compactd.auth")

_CACHE_LIMIT = 10_000
_LOOKUPS = 4
# Compared against when the key id is unknown, so a miss costs what a hit costs.
_DUMMY = tokens.digest("000000000000", "x" * 43)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def open_bind_refusal(host: str, keys_exist: bool, insecure: bool) -> str | None:
    """Why ``serve`` must not start, or None. Open (no keys) is for loopback only."""
    if keys_exist or insecure or is_loopback(host):
        return None
    return (
        f"refusing to serve on {host} without API keys: anyone who can reach it could read "
        "and change every session. Create a key first (`compactd keys create --tenant NAME`), "
        "bind to 127.0.0.1, or pass --insecure-no-auth (COMPACTD_INSECURE_NO_AUTH=true) "
        "if something in front of compactd authenticates clients."
    )


class KeyStore:
    """Looks up keys by id, with a short cache; knows whether auth is required."""

    def __init__(self, engine: AsyncEngine, cache_seconds: float) -> None:
        self.engine = engine
        self.cache_seconds = cache_seconds
        # Keys found, and ids found to be no key, apart: a flood of forged ids that
        # fills (and so empties) the second leaves the first alone.
        self._keys: dict[str, tuple[float, KeyRow]] = {}
        self._unknown: dict[str, float] = {}
        # Ids not known to be keys are looked up a few at a time: a flood of forged
        # keys cannot take every pooled connection from the requests that carry real
        # ones, and real keys are read again without waiting behind them.
        self._lookups = asyncio.Semaphore(_LOOKUPS)
        # One read per id at a time, shared by the requests that need it: the key is
        # checked before a request is admitted (see app.core.limits), so a burst of one
        # key's requests must not turn into a burst of reads.
        self._reads: dict[str, asyncio.Future[KeyRow | None]] = {}
        self._required = False
        self._required_checked = -float("inf")

    async def required(self) -> bool:
        """Once a key exists, for good; until then re-checked every cache period."""
        now = time.monotonic()
        if self._required or now - self._required_checked < self.cache_seconds:
            return self._required
        async with driver_connection(self.engine) as driver:
            self._required = await repository.any_exist(driver)
        self._required_checked = now
        return self._required

    async def _row(self, key_id: str) -> KeyRow | None:
        """The key's row, or None; both answers are kept for the cache period (a key
        cannot be presented before it is created: its id is random)."""
        now = time.monotonic()
        known = self._keys.get(key_id)
        if known and now - known[0] < self.cache_seconds:
            return known[1]
        if known is None and now - self._unknown.get(key_id, -float("inf")) < self.cache_seconds:
            return None
        read = self._reads.get(key_id)
        if read is None:
            read = self._reads[key_id] = asyncio.ensure_future(
                self._read(key_id, known is not None)
            )
            read.add_done_callback(lambda _: self._reads.pop(key_id, None))
        # Shielded: one request that gives up does not cancel the read for the others.
        return await asyncio.shield(read)

    async def _read(self, key_id: str, known: bool) -> KeyRow | None:
        async with contextlib.AsyncExitStack() as stack:
            if not known:
                await stack.enter_async_context(self._lookups)
            driver = await stack.enter_async_context(driver_connection(self.engine))
            row = await repository.get(driver, key_id)
        now = time.monotonic()
        if row is None:
            if len(self._unknown) >= _CACHE_LIMIT:
                self._unknown.clear()
            self._unknown[key_id] = now
            self._keys.pop(key_id, None)
        else:
            if len(self._keys) >= _CACHE_LIMIT:
                self._keys.clear()
            self._keys[key_id] = (now, row)
        return row

    async def tenant(self, authorization: str | None) -> str:
        """The tenant this request acts for, or :class:`Unauthorized`."""
        if authorization is None:
            if not await self.required():
                return DEFAULT_TENANT
            raise _unauthorized("missing Authorization header: send `Bearer <API key>`", "missing")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("the Authorization header must be `Bearer <API key>`", "scheme")
        parsed = tokens.parse(token.strip())
        if parsed is None:
            raise _unauthorized("the API key is malformed", "malformed", invalid=True)
        key_id, secret = parsed
        row = await self._row(key_id)
        if row is None:
            tokens.matches(_DUMMY, key_id, secret)
            raise _unauthorized("the API key is not valid", "unknown", invalid=True, key_id=key_id)
        if not tokens.matches(row.secret_sha256, key_id, secret):
            raise _unauthorized(
                "the API key is not valid", "wrong_secret", invalid=True, key_id=key_id
            )
        if row.revoked_at is not None:
            raise _unauthorized(
                "the API key has been revoked", "revoked", invalid=True, key_id=key_id
            )
        return row.tenant_id


class _AuthFailed(Unauthorized):
    def __init__(
        self, detail: str, reason: str, key_id: str | None, headers: dict[str, str]
    ) -> None:
        super().__init__(detail, headers=headers)
        self.reason = reason
        self.key_id = key_id


def _unauthorized(
    detail: str, reason: str, *, invalid: bool = False, key_id: str | None = None
) -> _AuthFailed:
    challenge = 'Bearer realm="compactd"' + (', error="invalid_token"' if invalid else "")
    return _AuthFailed(detail, reason, key_id, {"WWW-Authenticate": challenge})


class AuthMiddleware:
    """Resolves the tenant of every ``/v1`` request before its body is read and before
    it is admitted to the limits (:mod:`app.core.limits`), and puts it in
    ``scope["state"]["tenant"]`` (see :mod:`app.core.tenancy`). A request without a
    valid key is answered 401 here, holding no place a tenant's request could use."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        store: KeyStore = scope["app"].state.keys
        authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        try:
            tenant = await store.tenant(authorization)
        except _AuthFailed as failed:
            metrics.AUTH_FAILURES.labels(failed.reason).inc()
            # Never the key itself: its public id at most.
            log.warning(
                "authentication failed",
                extra={"reason": failed.detail, "key_id": failed.key_id, "path": scope["path"]},
            )
            await _send_problem(failed, scope, receive, send)
            return
        except ServiceUnavailable as exc:
            await _send_problem(exc, scope, receive, send)
            return
        except Exception as exc:
            if unavailable_cause(exc) is None:
                raise  # a bug: the server error handler answers 500
            log.warning("database unavailable during authentication: %s", type(exc).__name__)
            await _send_problem(unavailable(), scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


async def _send_problem(error: ProblemError, scope: Scope, receive: Receive, send: Send) -> None:
    await problem_response(error, scope["path"])(scope, receive, send)


def document_bearer_auth(spec: dict[str, Any]) -> None:
    """Declare the Bearer scheme and the 401 on every ``/v1`` operation."""
    components = spec.setdefault("components", {})
    components.setdefault("securitySchemes", {})["apiKey"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key from `compactd keys create --tenant NAME` "
        "(`cpd_<id>_<secret>`). Not needed while no key exists (open mode, loopback only).",
    }
    for path, item in spec.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for operation in item.values():
            operation["security"] = [{"apiKey": []}, {}]
            operation.setdefault("responses", {})["401"] = {
                "description": "No API key, or one that is unknown, malformed or revoked.",
                "content": {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                },
                "headers": {
                    "WWW-Authenticate": {
                        "description": "The Bearer challenge.",
                        "schema": {"type": "string"},
                    }
                },
            }
