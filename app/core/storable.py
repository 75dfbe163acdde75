"""The app-wide refusal of what cannot be stored: a request's query values, its
Idempotency-Key and its JSON body (app.engine.formats.storable says what and why).

app.main runs these for every FastAPI route that takes input; a fast route
(app.core.direct) reads its request through the same functions, so a refusal made here
is made on both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.core.errors import BadRequest, invalid
from app.core.http import run_sized
from app.engine.formats.storable import find_unstorable


def check_query(query: Iterable[tuple[str, str]], idempotency_key: str | None) -> None:
    """A 422 naming the first query parameter whose value cannot be stored, or an
    Idempotency-Key holding a NUL."""
    for name, value in query:
        found = find_unstorable(value, name)
        if found:
            raise invalid(*found)
    if idempotency_key is not None and "\x00" in idempotency_key:
        raise invalid("Idempotency-Key", "contains a NUL character, which cannot be stored")


def check_utf8(body: bytes) -> None:
    """A 400 naming the first byte of a body that is not UTF-8."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"the body is not valid UTF-8 (byte {exc.start} is {body[exc.start : exc.start + 1]!r})",
            errors=[{"field": "body", "detail": "invalid UTF-8"}],
        ) from None


async def check_parsed(parsed: Any, size: int, max_items: int) -> None:
    """A 422 naming the first value of a parsed body (of ``size`` bytes) that cannot be
    stored, or its first array or object over ``max_items`` items (before the body's
    validation walks them: a million bad items once took minutes to answer)."""
    found = await run_sized(size, find_unstorable, parsed, "", max_items)
    if found:
        raise invalid(*found)
