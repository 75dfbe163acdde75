"""Who a request acts for: API keys on ``/v1`` and ``/proxy``, and the rule for running
without them.

Every ``/v1`` request must carry ``Authorization: Bearer <key>`` while any key exists,
and every ``/proxy`` request ``X-Compactd-Key: <key>`` (its Authorization is the
provider's, passed upstream); ``/mcp`` takes either. Revoked keys count, so revoking the
last key locks everyone out rather than opening the service; deleting every key (``compactd keys
delete``) opens it again, within the cache period. With no key at all the service is open
and every request acts for the default tenant; ``compactd serve`` allows that only on
a loopback address, unless told ``--insecure-no-auth``.

The keys are known from one read of the whole key table (it is small), kept for
``auth_cache_seconds``: a revocation (made by the CLI, in another process) takes effect
within that time. A key id not in it is refused without a database read; it makes the
table be read again at most once a second (``MISS_REFRESH_SECONDS``), so a key created
since is accepted within a second. A flood of forged keys thus costs the database one
read a second, and a real key's first use never waits behind theirs.
"""

from __future__ import annotations

import asyncio
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
from app.core.tenancy import DEFAULT_TENANT
from app.keys import repository, tokens
from app.keys.repository import KeyRow

log = logging.getLogger("compactd.auth")

# An id that is no known key reads the key table again at most this often (or every
# auth_cache_seconds, if shorter): a key created meanwhile is accepted within it.
MISS_REFRESH_SECONDS = 1.0
# Compared against when the key id is unknown, so a miss costs what a hit costs.
_DUMMY = tokens.digest("000000000000", "x" * 43)
# The proxy's base URLs, whose HEAD (an agent's reachability check: Claude Code's on its
# ANTHROPIC_BASE_URL) is answered with no key: an empty 200 that tells nothing.
OPEN_PROXY_BASES = frozenset(
    {"/proxy/anthropic", "/proxy/anthropic/", "/proxy/openai/v1", "/proxy/openai/v1/"}
)


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
    """Knows the keys, from one read of the key table kept for a short time; knows
    whether auth is required (see the module's docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        cache_seconds: float,
        *,
        miss_refresh_seconds: float = MISS_REFRESH_SECONDS,
    ) -> None:
        self.engine = engine
        self.cache_seconds = cache_seconds
        self.miss_refresh_seconds = min(cache_seconds, miss_refresh_seconds)
        # Every key by id (revoked ones too), as the last read of the table found them.
        self._keys: dict[str, KeyRow] = {}
        self._read_at = -float("inf")  # when that read started
        # The read in progress, shared by every request that needs a newer table: the
        # key is checked before a request is admitted (see app.core.limits), so a burst
        # of requests must not turn into a burst of reads.
        self._reading: asyncio.Future[None] | None = None
        self.reads = 0  # reads of the key table made so far
        self._required = False
        self._required_checked = -float("inf")

    async def required(self) -> bool:
        """Whether any key exists, re-checked every cache period (or known from the
        last read of the table): keys deleted since open the service again."""
        now = time.monotonic()
        if now - self._required_checked < self.cache_seconds:
            return self._required
        async with driver_connection(self.engine) as driver:
            self._required = await repository.any_exist(driver)
        self._required_checked = now
        return self._required

    async def _row(self, key_id: str) -> KeyRow | None:
        """The key's row, or None. A known key's row is at most ``cache_seconds`` old
        (a revocation shows within it); an unknown id reads the table again only if it
        was read ``miss_refresh_seconds`` ago or more, else it is refused from memory
        (a key cannot be presented before it is created: its id is random)."""
        if key_id in self._keys:
            await self._fresh(self.cache_seconds)
        else:
            await self._fresh(self.miss_refresh_seconds)
        return self._keys.get(key_id)

    async def _fresh(self, max_age: float) -> None:
        """Make the keys in hand at most ``max_age`` seconds old, or wait for the read
        in progress if there is one (it is shared, so at most one runs at a time)."""
        if time.monotonic() - self._read_at < max_age:
            return
        reading = self._reading
        if reading is None:
            reading = self._reading = asyncio.ensure_future(self._read())
            reading.add_done_callback(self._read_done)
        # Shielded: one request that gives up does not cancel the read for the others.
        await asyncio.shield(reading)

    async def _read(self) -> None:
        started = time.monotonic()
        async with driver_connection(self.engine) as driver:
            rows = await repository.list_keys(driver)
        self.reads += 1
        self._keys = {row.id: row for row in rows}
        self._read_at = started
        self._required = bool(rows)
        self._required_checked = started

    def _read_done(self, reading: asyncio.Future[None]) -> None:
        self._reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved: the requests that waited have it

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
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith("/v1/"):
            header = b"authorization"
        elif path == "/mcp" or path.startswith("/mcp/"):
            # The MCP server (app.mcp) takes the key as the API does, or in the proxy's
            # header: some MCP clients keep Authorization for an OAuth flow of their own.
            header = _mcp_key_header(scope["headers"])
        elif scope["method"] == "HEAD" and path in OPEN_PROXY_BASES:
            await self.app(scope, receive, send)
            return
        elif path.startswith("/proxy/"):
            # The proxy's Authorization (or x-api-key) is the provider's: compactd's key
            # comes in a header of its own, as the bare key or `Bearer <key>`.
            header = b"x-compactd-key"
        else:
            await self.app(scope, receive, send)
            return
        store: KeyStore = scope["app"].state.keys
        authorization = None
        for name, value in scope["headers"]:
            if name == header:
                authorization = value.decode("latin-1")
                break
        if header == b"x-compactd-key" and authorization is not None:
            key = authorization.strip()
            authorization = key if key.lower().startswith("bearer ") else f"Bearer {key}"
        try:
            tenant = await store.tenant(authorization)
        except _AuthFailed as failed:
            if header == b"x-compactd-key" and failed.reason == "missing":
                failed = _unauthorized(
                    "missing X-Compactd-Key header: this service has API keys; send one in "
                    "X-Compactd-Key (Authorization is the provider's key, passed upstream)",
                    "missing",
                )
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
            if (cause := unavailable_cause(exc)) is None:
                raise  # a bug: the server error handler answers 500
            log.warning("database unavailable during authentication: %s", type(exc).__name__)
            await _send_problem(unavailable(cause), scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


def _mcp_key_header(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``X-Compactd-Key`` when the request has one, else ``Authorization``."""
    return next((name for name, _ in headers if name == b"x-compactd-key"), b"authorization")


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
