"""Each route's request, built once for both clients: a :class:`Call` says what to send
and how to read the answer, and :class:`~compactd_client.Compactd` and
:class:`~compactd_client.AsyncCompactd` only send it (with their retries).

A builder takes every argument of its public method, with no defaults, so that mypy
refuses a public method that forgets to pass one on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import httpx

from compactd_client import types as t

T = TypeVar("T")


class SupportsModelDump(Protocol):
    """A provider SDK's pydantic object, such as ``response.usage``."""

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


def as_dict(value: Mapping[str, Any] | SupportsModelDump | object) -> dict[str, Any]:
    """The object's fields as the SDK returns them, untouched: a Mapping (a dict), a
    pydantic object (the OpenAI and Anthropic SDKs'), anything dict-like (``keys()`` and
    ``[]``), a dataclass, or a plain object with attributes (``SimpleNamespace``, other
    SDKs' usage classes). Nested objects (``prompt_tokens_details``) are read the same
    way. Anything else is a :class:`TypeError` that names what was given."""
    fields = _fields(value)
    if fields is None:
        raise TypeError(
            f"usage must be a mapping or an object with fields (such as the SDK's "
            f"response.usage), not {type(value).__name__}"
        )
    return fields


def _fields(value: object) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        dumped = model_dump(mode="json")
        if isinstance(dumped, Mapping):
            return dict(dumped)
    keys, getitem = getattr(value, "keys", None), getattr(value, "__getitem__", None)
    if callable(keys) and callable(getitem):
        return {str(k): _plain(getitem(k)) for k in keys()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return {k: _plain(v) for k, v in attributes.items() if not k.startswith("_")}
    return None


def _plain(value: Any) -> Any:
    """A field's value as JSON can carry it (a nested usage object becomes a dict)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    fields = _fields(value)
    return value if fields is None else fields


def drop_none(**fields: Any) -> dict[str, Any]:
    """The fields that were given (None means "not given": the server's default)."""
    return {name: value for name, value in fields.items() if value is not None}


def path(template: str, *ids: str) -> str:
    """``template`` with each ``{}`` replaced by an id, quoted so that it stays one segment."""
    return template.format(*(quote(str(i), safe="") for i in ids))


def json_answer(response: httpx.Response) -> Any:
    """The answer's JSON, trusted to be the route's typed dict (as the API documents)."""
    return response.json()


def text_answer(response: httpx.Response) -> str:
    return response.text


def no_answer(response: httpx.Response) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One logical call: sent once, and again by each retry with the same headers
    (so the same ``Idempotency-Key``)."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    idempotency_key: str | None = None  # the caller's; a POST without one gets a new one
    if_match: int | str | None = None
    wait: float | None = None  # seconds the server may hold the answer
    headers: Mapping[str, str] | None = None  # more headers (they win over the usual ones)
    decode: Callable[[httpx.Response], T] = json_answer


# Ops


def healthz() -> Call[t.Health]:
    return Call("GET", "/healthz")


def readyz() -> Call[t.Readiness]:
    return Call("GET", "/readyz")


def metrics() -> Call[str]:
    return Call("GET", "/metrics", decode=text_answer)


# Sessions


def create_session(
    model: str,
    *,
    id: str | None,
    context_window: int | None,
    max_output_tokens: int | None,
    input_limit: int | None,
    config: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
    parent_id: str | None = None,
) -> Call[t.Session]:
    body = drop_none(
        model=model,
        id=id,
        context_window=context_window,
        max_output_tokens=max_output_tokens,
        input_limit=input_limit,
        config=config,
        metadata=metadata,
        parent_id=parent_id,
    )
    return Call("POST", "/v1/sessions", json=body, idempotency_key=idempotency_key)


def list_sessions(
    *,
    limit: int | None,
    cursor: str | None,
    metadata: Mapping[str, str] | None,
    parent_id: str | None = None,
) -> Call[t.SessionPage]:
    params = drop_none(
        limit=limit,
        cursor=cursor,
        metadata=[f"{k}={v}" for k, v in metadata.items()] if metadata else None,
        parent_id=parent_id,
    )
    return Call("GET", "/v1/sessions", params=params)


def get_session(session_id: str) -> Call[t.Session]:
    return Call("GET", path("/v1/sessions/{}", session_id))


def update_session(
    session_id: str, changes: t.SessionChanges, *, if_match: int | str | None
) -> Call[t.Session]:
    return Call("PATCH", path("/v1/sessions/{}", session_id), json=changes, if_match=if_match)


def delete_session(session_id: str, *, if_match: int | str | None) -> Call[None]:
    return Call("DELETE", path("/v1/sessions/{}", session_id), if_match=if_match, decode=no_answer)


# History


def append_messages(
    session_id: str,
    messages: Sequence[t.Message],
    *,
    format: t.Format | None,
    system: str | Sequence[Mapping[str, Any]] | None,
    tools: Sequence[Mapping[str, Any]] | None,
    idempotency_key: str | None,
    if_match: int | str | None,
) -> Call[t.AppendResult]:
    body = drop_none(messages=list(messages), format=format, system=system, tools=tools)
    return Call(
        "POST",
        path("/v1/sessions/{}/messages", session_id),
        json=body,
        idempotency_key=idempotency_key,
        if_match=if_match,
    )


def list_messages(
    session_id: str, *, after_seq: int | None, limit: int | None, format: t.Format | None
) -> Call[t.HistoryPage]:
    params = drop_none(after_seq=after_seq, limit=limit, format=format)
    return Call("GET", path("/v1/sessions/{}/messages", session_id), params=params)


def get_context(session_id: str, *, format: t.Format | None) -> Call[t.Context]:
    params = drop_none(format=format)
    return Call("GET", path("/v1/sessions/{}/context", session_id), params=params)


# Budget


def get_overflow(session_id: str) -> Call[t.Verdict]:
    return Call("GET", path("/v1/sessions/{}/overflow", session_id))


def get_usage() -> Call[t.TenantUsage]:
    return Call("GET", "/v1/usage")


def report_usage(
    session_id: str,
    usage: Mapping[str, Any] | SupportsModelDump | object,
    *,
    finish_reason: str | None,
    context_version: int | None,
    tools: Sequence[Mapping[str, Any]] | None,
    tools_tokens: int | None,
    format: t.Format | None,
    idempotency_key: str | None,
) -> Call[t.UsageResult]:
    body = as_dict(usage) | drop_none(
        finish_reason=finish_reason,
        context_version=context_version,
        tools=tools,
        tools_tokens=tools_tokens,
    )
    return Call(
        "POST",
        path("/v1/sessions/{}/usage", session_id),
        params=drop_none(format=format),
        json=body,
        idempotency_key=idempotency_key,
    )


def prune(
    session_id: str,
    *,
    dry_run: bool | None,
    protect_tokens: int | None,
    minimum_tokens: int | None,
    protect_turns: int | None,
    idempotency_key: str | None,
) -> Call[t.PruneResult]:
    body = drop_none(
        dry_run=dry_run,
        protect_tokens=protect_tokens,
        minimum_tokens=minimum_tokens,
        protect_turns=protect_turns,
    )
    return Call(
        "POST",
        path("/v1/sessions/{}/prune", session_id),
        json=body,
        idempotency_key=idempotency_key,
    )


def report_provider_error(
    session_id: str,
    message: str,
    *,
    status: int | None,
    context_version: int | None,
    idempotency_key: str | None,
) -> Call[t.ProviderErrorVerdict]:
    body = drop_none(message=message, status=status, context_version=context_version)
    return Call(
        "POST",
        path("/v1/sessions/{}/overflow-errors", session_id),
        json=body,
        idempotency_key=idempotency_key,
    )


# Compactions


def request_compaction(
    session_id: str,
    *,
    instructions: str | None,
    strategy: t.Strategy | None,
    summarizer: t.Summarizer | None,
    model: str | None,
    wait: float | None,
    idempotency_key: str | None,
) -> Call[t.Compaction]:
    body = drop_none(
        instructions=instructions,
        strategy=strategy,
        summarizer=summarizer,
        model=model,
        wait=wait,
    )
    return Call(
        "POST",
        path("/v1/sessions/{}/compactions", session_id),
        json=body,
        idempotency_key=idempotency_key,
        wait=wait,
    )


def list_compactions(
    session_id: str, *, limit: int | None, cursor: str | None
) -> Call[t.CompactionPage]:
    params = drop_none(limit=limit, cursor=cursor)
    return Call("GET", path("/v1/sessions/{}/compactions", session_id), params=params)


def get_compaction(session_id: str, compaction_id: str) -> Call[t.Compaction]:
    return Call("GET", path("/v1/sessions/{}/compactions/{}", session_id, compaction_id))


def cancel_compaction(
    session_id: str, compaction_id: str, *, idempotency_key: str | None
) -> Call[t.Compaction]:
    return Call(
        "POST",
        path("/v1/sessions/{}/compactions/{}/cancel", session_id, compaction_id),
        idempotency_key=idempotency_key,
    )


def compaction_source(
    session_id: str,
    compaction_id: str,
    *,
    after_seq: int | None,
    limit: int | None,
    format: t.Format | None,
) -> Call[t.SourcePage]:
    params = drop_none(after_seq=after_seq, limit=limit, format=format)
    return Call(
        "GET",
        path("/v1/sessions/{}/compactions/{}/source", session_id, compaction_id),
        params=params,
    )


# Tree


def get_tree(session_id: str, *, limit: int | None, cursor: str | None) -> Call[t.TreePage]:
    params = drop_none(limit=limit, cursor=cursor)
    return Call("GET", path("/v1/sessions/{}/tree", session_id), params=params)


def navigate(
    session_id: str,
    *,
    entry_id: str | None,
    seq: int | None,
    summarize: bool | None,
    instructions: str | None,
    idempotency_key: str | None,
    if_match: int | str | None,
) -> Call[t.NavigateResult]:
    body = drop_none(entry_id=entry_id, seq=seq, summarize=summarize, instructions=instructions)
    return Call(
        "POST",
        path("/v1/sessions/{}/navigate", session_id),
        json=body,
        idempotency_key=idempotency_key,
        if_match=if_match,
    )


def fork(
    session_id: str,
    *,
    at_seq: int | None,
    id: str | None,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
) -> Call[t.Session]:
    body = drop_none(at_seq=at_seq, id=id, metadata=metadata)
    return Call(
        "POST",
        path("/v1/sessions/{}/fork", session_id),
        json=body,
        idempotency_key=idempotency_key,
    )


# Recall


def search(
    session_id: str,
    q: str,
    *,
    role: Sequence[t.Role] | None,
    tool: Sequence[str] | None,
    kind: Sequence[t.EntryKind] | None,
    from_seq: int | None,
    to_seq: int | None,
    compaction: str | None,
    limit: int | None,
    cursor: str | None,
) -> Call[t.SearchPage]:
    params = drop_none(
        q=q,
        role=list(role) if role else None,
        tool=list(tool) if tool else None,
        kind=list(kind) if kind else None,
        from_seq=from_seq,
        to_seq=to_seq,
        compaction=compaction,
        limit=limit,
        cursor=cursor,
    )
    return Call("GET", path("/v1/sessions/{}/search", session_id), params=params)


def get_tools(*, format: t.Format | None) -> Call[t.ToolDefinitions]:
    return Call("GET", "/v1/tools", params=drop_none(format=format))


def run_tool_call(
    session_id: str,
    tool_call: Mapping[str, Any] | SupportsModelDump,
    *,
    max_tokens: int | None,
) -> Call[t.ToolCallResult]:
    body = {"tool_call": as_dict(tool_call)} | drop_none(max_tokens=max_tokens)
    return Call("POST", path("/v1/sessions/{}/tool-calls", session_id), json=body)


# Events: a stream's request (its body is read by compactd_client._events, not decoded).


def session_events(session_id: str, *, after: str | None) -> Call[None]:
    return Call(
        "GET",
        path("/v1/sessions/{}/events", session_id),
        params=drop_none(after=after),
        decode=no_answer,
    )


def tenant_events(*, types: Sequence[str] | None, after: str | None) -> Call[None]:
    params = drop_none(type=list(types) if types else None, after=after)
    return Call("GET", "/v1/events", params=params, decode=no_answer)


# Webhooks


def create_webhook(
    url: str,
    *,
    types: Sequence[str] | None,
    session_id: str | None,
    hook: bool,
    timeout_seconds: float | None,
    description: str | None,
    idempotency_key: str | None,
) -> Call[t.WebhookCreated]:
    body = drop_none(
        url=url,
        types=list(types) if types is not None else None,
        session_id=session_id,
        hook=hook,
        timeout_seconds=timeout_seconds,
        description=description,
    )
    return Call("POST", "/v1/webhooks", json=body, idempotency_key=idempotency_key)


def list_webhooks() -> Call[t.WebhookList]:
    return Call("GET", "/v1/webhooks")


def get_webhook(webhook_id: str) -> Call[t.Webhook]:
    return Call("GET", path("/v1/webhooks/{}", webhook_id))


def update_webhook(webhook_id: str, *, enabled: bool) -> Call[t.Webhook]:
    return Call("PATCH", path("/v1/webhooks/{}", webhook_id), json={"enabled": enabled})


def delete_webhook(webhook_id: str) -> Call[None]:
    return Call("DELETE", path("/v1/webhooks/{}", webhook_id), decode=no_answer)


def test_webhook(webhook_id: str, *, idempotency_key: str | None) -> Call[t.Delivery]:
    return Call("POST", path("/v1/webhooks/{}/test", webhook_id), idempotency_key=idempotency_key)


def list_deliveries(
    webhook_id: str, *, limit: int | None, cursor: str | None
) -> Call[t.DeliveryPage]:
    params = drop_none(limit=limit, cursor=cursor)
    return Call("GET", path("/v1/webhooks/{}/deliveries", webhook_id), params=params)
