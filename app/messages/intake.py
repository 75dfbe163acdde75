"""One reading of an append: its body, query, headers and the settings that bound them.

An append comes in three ways: the FastAPI route, the route's fast path (its plain form,
app.core.direct) and the proxy, which stores a call's new messages. Each check lives here
once and every way runs it:

- the route: FastAPI reads the parameters this module declares (:data:`AppendFormat`,
  :data:`IdempotencyKey`), app.main runs the app-wide checks (app.core.storable) and the
  route's dependency :func:`check_batch`;
- the fast path: :func:`read_append`, the same checks in the same order on the raw
  request; one that refuses sends the request on to the route, which answers it;
- the proxy: :func:`refused_messages`, the checks of the messages themselves (its body
  holds a whole history, so the whole-body and batch bounds are not its).

A check of a stored message is one row of :data:`MESSAGE_CHECKS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header, Query
from pydantic import TypeAdapter
from starlette.routing import BaseRoute

from app.core.errors import invalid
from app.core.http import run_sized
from app.core.media import require_json_body
from app.core.settings import Settings
from app.core.storable import check_parsed, check_query, check_utf8
from app.history.schemas import FORMAT_DESCRIPTION, Format
from app.messages.schemas import AppendRequest
from app.messages.service import oversized_arguments

AppendFormat = Annotated[
    Format | None,
    Query(
        description=FORMAT_DESCRIPTION + " On an append, the body's `format` says the "
        "same (openai when neither does); given both, they must agree."
    ),
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        description="A retry with the same key returns the first response.",
    ),
]
_FORMAT: TypeAdapter[Format | None] = TypeAdapter(AppendFormat)
_IDEMPOTENCY_KEY: TypeAdapter[str | None] = TypeAdapter(IdempotencyKey)


@dataclass(frozen=True, slots=True)
class AppendCall:
    """An append as read: what the service stores, and how the client asked."""

    body: AppendRequest
    query_format: Format | None  # the ``?format=`` (the service checks it agrees)
    idempotency_key: str | None
    if_match: str | None
    body_bytes: int  # the request's size: whether parsing it is worth a thread


# A check of a batch's messages (in format ``fmt``, as the store takes them): the first
# refused message's field and why, or None.
MessageCheck = Callable[[list[Any], str, Settings], tuple[str, str] | None]


def _tool_arguments_in_bounds(
    messages: list[Any], fmt: str, settings: Settings
) -> tuple[str, str] | None:
    """An OpenAI tool call's ``arguments`` (JSON kept as text) within the body's own
    bounds (an Anthropic ``tool_use`` input is part of the body, walked with it)."""
    if fmt != "openai":
        return None
    return oversized_arguments(messages, settings.max_json_items)


MESSAGE_CHECKS: tuple[MessageCheck, ...] = (_tool_arguments_in_bounds,)


def refused_messages(messages: list[Any], fmt: str, settings: Settings) -> tuple[str, str] | None:
    """The first refusal of :data:`MESSAGE_CHECKS` for ``messages`` (paths
    ``messages[i]...`` of this list), or None."""
    for check in MESSAGE_CHECKS:
        found = check(messages, fmt, settings)
        if found:
            return found
    return None


def check_batch_size(count: int, max_messages: int) -> None:
    if count > max_messages:
        raise invalid("messages", f"holds {count:,} messages; at most {max_messages:,} per append")


async def check_batch(parsed: Any, query_format: str | None, size: int, settings: Settings) -> None:
    """Before the body is validated (``parsed``: its JSON, of ``size`` bytes): at most
    ``max_batch_messages`` messages, and none that :func:`refused_messages` refuses
    (the body's own arrays and objects are app.core.storable's)."""
    messages = parsed.get("messages") if isinstance(parsed, dict) else None
    if not isinstance(messages, list):
        return  # the body validation names it
    check_batch_size(len(messages), settings.max_batch_messages)
    fmt = query_format or parsed.get("format", "openai")
    if not isinstance(fmt, str):
        return  # the body validation names it
    found = await run_sized(size, refused_messages, messages, fmt, settings)
    if found:
        raise invalid(*found)


async def read_append(
    raw: bytes,
    *,
    route: BaseRoute,
    content_type: str | None,
    query_format: str | None,
    idempotency_key: str | None,
    if_match: str | None,
    settings: Settings,
) -> AppendCall:
    """The append a request to ``route`` (the append's) makes, checked as the route checks
    it, in its order: a :class:`~app.core.errors.ProblemError` for a refusal of the app's
    checks or this module's, a ``ValueError`` (the model's ``ValidationError`` is one) or
    a ``RecursionError`` for a body FastAPI's validation refuses. For a request with no
    query parameter but ``format`` and each header at most once, the forms FastAPI reads
    as given."""
    check_query([] if query_format is None else [("format", query_format)], idempotency_key)
    require_json_body(route, content_type, raw)
    check_utf8(raw)
    parsed = json.loads(raw)  # as FastAPI parses it (the stdlib's json)
    await check_parsed(parsed, len(raw), settings.max_json_items)
    await check_batch(parsed, query_format, len(raw), settings)
    return AppendCall(
        body=AppendRequest.model_validate(parsed),
        query_format=_FORMAT.validate_python(query_format),
        idempotency_key=_IDEMPOTENCY_KEY.validate_python(idempotency_key),
        if_match=if_match,
        body_bytes=len(raw),
    )
