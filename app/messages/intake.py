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

import orjson
from fastapi import Header, Query
from pydantic import TypeAdapter
from starlette.routing import BaseRoute

from app.core.errors import invalid
from app.core.http import run_sized
from app.core.media import require_json_body
from app.core.settings import Settings
from app.core.storable import check_parsed, check_query, check_utf8
from app.engine.formats.storable import MAX_JSON_DEPTH, find_oversized
from app.history.schemas import FORMAT_DESCRIPTION, Format
from app.messages.schemas import AppendRequest

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


def oversized_arguments(
    messages: list[Any], fmt: str, settings: Settings
) -> tuple[str, str] | None:
    """The first OpenAI tool call whose ``arguments`` JSON holds an array or object
    of more than ``max_json_items`` items, or nests them more than ``MAX_JSON_DEPTH``
    deep, and why: the same bounds as for the body's own JSON (an Anthropic
    ``tool_use`` input is part of it), so that a tool call is refused alike in both
    formats, and its Anthropic view (the parsed arguments) can always be written.
    Only arguments that could break a bound are parsed: an array or object of
    ``max_items + 1`` items has ``max_items`` commas, and nesting takes brackets."""
    if fmt != "openai":
        return None
    max_items = settings.max_json_items
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            continue
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            arguments = fn.get("arguments") if isinstance(fn, dict) else None
            if not isinstance(arguments, str) or (
                arguments.count(",") < max_items
                and arguments.count("[") + arguments.count("{") <= MAX_JSON_DEPTH
            ):
                continue
            try:
                parsed = orjson.loads(arguments)
            except orjson.JSONDecodeError:
                continue  # the append's parse names it (app.messages.service)
            found = find_oversized(parsed, "", max_items)
            if found:
                where, reason = found
                inside = "" if where == "body" else f" at {where}"
                return (
                    f"messages[{i}].tool_calls[{j}].function.arguments",
                    f"its JSON{inside} {reason}",
                )
    return None


MESSAGE_CHECKS: tuple[MessageCheck, ...] = (oversized_arguments,)


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
