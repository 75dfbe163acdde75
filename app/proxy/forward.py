"""The proxy's line to the providers: one HTTP client per process, made at start-up,
and the headers that cross it.

The agent's own headers go upstream as it sent them: its credentials
(``Authorization``, ``x-api-key``), ``anthropic-version``, ``anthropic-beta``,
``OpenAI-Organization``, ``OpenAI-Project``, its user agent... They are held in memory
for the one call and never stored or logged. What does not cross: compactd's own
headers (``X-Compactd-Session``, ``X-Compactd-Key``), the hop-by-hop headers of one
connection, and the body's length and encoding (the body sent upstream is another).
The upstream's answer headers come back the same way; its request id as
``x-upstream-request-id`` (compactd's own ``X-Request-ID`` names the call here). A cookie
the upstream sets is neither passed back nor kept: the client is every agent's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Coroutine
from http.cookiejar import Cookie, CookieJar
from typing import Any

import httpx

from app.context.assembly import Contexts
from app.core.allowlist import Allowance
from app.core.outbound import guarded_client
from app.core.settings import Settings
from app.engine.proxy.wire import Wire

log = logging.getLogger("compactd.proxy")
# How long shutting down waits for replies still being stored.
DRAIN_SECONDS = 10.0

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = _HOP_BY_HOP | {
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "accept-encoding",  # the client here negotiates its own, and decodes
    "expect",
    "cookie",
    "x-request-id",
}
_NOT_RETURNED = _HOP_BY_HOP | {
    "content-length",
    "content-encoding",
    "date",
    "server",
    "set-cookie",
    "alt-svc",
    "x-request-id",
}


def upstream_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The agent's headers that go upstream (see the module's docstring)."""
    out = [("content-type", "application/json")]
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name in _NOT_FORWARDED or name.startswith("x-compactd-"):
            continue
        out.append((name, raw_value.decode("latin-1")))
    return out


def agent_headers(headers: httpx.Headers) -> dict[str, str]:
    """The upstream's answer headers that go back to the agent."""
    out: dict[str, str] = {}
    for name, value in headers.multi_items():
        lower = name.lower()
        if lower in ("x-request-id", "request-id"):
            out["x-upstream-request-id"] = value
        if lower not in _NOT_RETURNED:
            out[lower] = value
    return out


# What of a query's bytes goes upstream as it came: printable ASCII but "#" (which would
# end the query). The rest is percent-encoded, as a URL must carry it.
_QUERY_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "#")


def with_query(url: httpx.URL, query: bytes) -> httpx.URL:
    """The upstream URL with the agent's query string (``?beta=true``, Claude Code's;
    ``?api-version=...``, an Azure client's) after any the operator's URL has."""
    if not query:
        return url
    agent = urllib.parse.quote(query, safe=_QUERY_SAFE).encode("ascii")
    return url.copy_with(query=url.query + b"&" + agent if url.query else agent)


class _NoCookies(CookieJar):
    """A jar that keeps nothing: a cookie an upstream sets in its answer to one agent's
    call (a CDN's, say) never goes out with another agent's."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        pass

    def set_cookie(self, cookie: Cookie) -> None:
        pass


def upstream_url(api: Wire, settings: Settings) -> str:
    if api == "openai":
        return settings.proxy_openai_url.rstrip("/") + "/chat/completions"
    if api == "responses":
        return settings.proxy_openai_url.rstrip("/") + "/responses"
    return settings.proxy_anthropic_url.rstrip("/") + "/v1/messages"


class ProxyClient:
    """The process's HTTP client for proxied calls, made with the app at start-up (its
    TLS context is the process's, :mod:`app.core.tls`), so that no call pays for it.
    Timeouts suit model calls: a short connect, and reads as long as a model may stay
    silent (per read: a stream may go on for longer, as long as it keeps coming).

    It also holds the work a call leaves behind once its reply is delivered (storing
    the reply), so that shutting down waits for it, and the contexts calls sent."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        s = settings
        # The operator's upstreams are trusted by the outbound policy (app.core.outbound):
        # a private address is fine, a link-local or metadata one is not.
        self._client = guarded_client(
            trusted=True,
            allow=Allowance(),
            timeout=httpx.Timeout(
                s.proxy_timeout_seconds,
                connect=s.proxy_connect_timeout_seconds,
                pool=s.proxy_connect_timeout_seconds,
            ),
            # One connection per call in flight at most: each holds a request slot (a
            # tenant's share of them is bounded by app.core.limits' fair slots), so the
            # pool has no call waiting for a connection.
            max_connections=s.max_concurrent_requests,
            max_keepalive=32,
            follow_redirects=False,
            cookies=_NoCookies(),
        )
        # Parsed once: each call's request is built from them.
        self.urls: dict[Wire, httpx.URL] = {
            api: httpx.URL(upstream_url(api, settings))
            for api in ("openai", "anthropic", "responses")
        }
        self._pending: set[asyncio.Task[None]] = set()
        # The last context sent on each session lately called (app.context.assembly).
        self.contexts = Contexts()

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` on its own, whatever becomes of the request that started it."""
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    def get(self) -> httpx.AsyncClient:
        return self._client

    async def aclose(self) -> None:
        if self._pending:
            _, late = await asyncio.wait(set(self._pending), timeout=DRAIN_SECONDS)
            if late:
                log.warning("proxied replies left unstored at shutdown", extra={"count": len(late)})
                for task in late:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*late, return_exceptions=True)
        await self._client.aclose()
