"""The agent's request as the pipeline takes it: the session it names, its body read
by its wire's adapter, the overhead its prompt and tools count, and the 400s that say,
in the request's own terms, what is wrong with it."""

from __future__ import annotations

import re

import orjson

from app.core.errors import BadRequest, UnprocessableContent
from app.engine.accounting.tokens import EncodingName
from app.engine.model import InvalidMessage
from app.engine.proxy.wire import ProxyRequest, Wire, overhead_tokens
from app.engine.proxy.wires import WIRES
from app.sessions.schemas import SESSION_ID_PATTERN

SESSION_HEADER = "x-compactd-session"
_PATH_HEAD = re.compile(r"^messages\[(\d+)\]")

# Overheads counted lately, by the system prompt and tools they count: an agent sends the
# same ones call after call, and a long system prompt takes a millisecond to tokenize.
_OVERHEADS: dict[bytes, int] = {}
_OVERHEADS_KEPT = 256


def overhead(request: ProxyRequest, encoding: EncodingName) -> int:
    """The tokens the request's system prompt and tools count (remembered lately)."""
    key = orjson.dumps(
        [
            request.wire,
            encoding,
            request.system,
            request.body.get("tools"),
            request.body.get("instructions") if request.responses else None,
        ]
    )
    found = _OVERHEADS.pop(key, None)
    if found is None:
        found = overhead_tokens(request, encoding)
        if len(_OVERHEADS) >= _OVERHEADS_KEPT:
            del _OVERHEADS[next(iter(_OVERHEADS))]
    _OVERHEADS[key] = found  # the newest last
    return found


def session_id_of(header: str | None) -> str:
    """The X-Compactd-Session header's session id, or the 400 that says what is wrong."""
    if not header:
        raise BadRequest(
            "the X-Compactd-Session header is missing: name the session this call "
            "belongs to (any id of 1-128 letters, digits and . _ : -; created on first use)",
            errors=[{"field": "X-Compactd-Session", "detail": "missing"}],
        )
    if not re.fullmatch(SESSION_ID_PATTERN, header):
        raise BadRequest(
            f"X-Compactd-Session {header[:200]!r} is not a session id: 1-128 letters, "
            "digits and . _ : -, starting with a letter or digit",
            errors=[{"field": "X-Compactd-Session", "detail": "not a session id"}],
        )
    return header


def read_body(api: Wire, body: bytes) -> ProxyRequest:
    """The agent's request, or the 400 that says why it is not one."""
    try:
        # Here, not in a worker thread: orjson holds the GIL for the whole parse, so a
        # thread does not let the loop run meanwhile, and takes longer (a 1.5 MB
        # history: 9 ms here, 12 to 16 ms through a thread, measured).
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(
            f"the body is not valid JSON ({exc})",
            errors=[{"field": "body", "detail": str(exc)}],
        ) from None
    try:
        return WIRES[api].read(parsed)
    except InvalidMessage as exc:
        raise BadRequest(
            f"{exc.path}: {exc.detail}", errors=[{"field": exc.path, "detail": exc.detail}]
        ) from None


def shift(path: str, by: int, field: str = "messages") -> str:
    """A path of a sub-list's message (``messages[2].content``) as the request's own
    (``field``: the body's list of them, ``input`` for a Responses request)."""
    found = _PATH_HEAD.match(path)
    if found is None:
        return path
    return f"{field}[{int(found.group(1)) + by}]" + path[found.end() :]


def shifted(exc: UnprocessableContent, by: int, field: str = "messages") -> BadRequest:
    """An append's 422 as the provider's 400, its message paths as the request's own."""
    errors = exc.extensions.get("errors")
    if not isinstance(errors, list):
        return BadRequest(exc.detail)
    fixed = [{**e, "field": shift(str(e.get("field", "")), by, field)} for e in errors]
    detail = "; ".join(f"{e['field']}: {e['detail']}" for e in fixed)
    return BadRequest(detail, errors=fixed)


def invalid(exc: InvalidMessage) -> BadRequest:
    """A message the store refuses: a 400, as the provider would answer it."""
    return bad(exc.path, exc.detail)


def bad(field: str, detail: str) -> BadRequest:
    return BadRequest(f"{field}: {detail}", errors=[{"field": field, "detail": detail}])
