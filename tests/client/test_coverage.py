"""The client cannot fall behind the API: every operation of the OpenAPI document (the
committed one and the app's own) has a method in both clients, and every parameter and
top-level body field of that operation is a parameter of the method."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, get_args, get_type_hints, is_typeddict

import pytest
from compactd_client import AsyncCompactd, AsyncEventStream, Compactd, EventStream
from compactd_client.types import SessionChanges

from app.cli import _openapi_document

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"

# Each operation, and the client method that covers it. The proxy's operations are
# called by the provider SDKs, pointed at the URL this helper gives them.
COVERED: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "healthz",
    ("GET", "/readyz"): "readyz",
    ("GET", "/metrics"): "metrics",
    ("POST", "/v1/sessions"): "create_session",
    ("GET", "/v1/sessions"): "list_sessions",
    ("GET", "/v1/sessions/{session_id}"): "get_session",
    ("PATCH", "/v1/sessions/{session_id}"): "update_session",
    ("DELETE", "/v1/sessions/{session_id}"): "delete_session",
    ("POST", "/v1/sessions/{session_id}/messages"): "append_messages",
    ("GET", "/v1/sessions/{session_id}/messages"): "list_messages",
    ("GET", "/v1/sessions/{session_id}/context"): "get_context",
    ("GET", "/v1/sessions/{session_id}/overflow"): "get_overflow",
    ("GET", "/v1/usage"): "get_usage",
    ("POST", "/v1/sessions/{session_id}/usage"): "report_usage",
    ("POST", "/v1/sessions/{session_id}/prune"): "prune",
    ("POST", "/v1/sessions/{session_id}/overflow-errors"): "report_provider_error",
    ("POST", "/v1/sessions/{session_id}/compactions"): "request_compaction",
    ("GET", "/v1/sessions/{session_id}/compactions"): "list_compactions",
    ("GET", "/v1/sessions/{session_id}/compactions/{compaction_id}"): "get_compaction",
    ("POST", "/v1/sessions/{session_id}/compactions/{compaction_id}/cancel"): "cancel_compaction",
    ("GET", "/v1/sessions/{session_id}/compactions/{compaction_id}/source"): "compaction_source",
    ("GET", "/v1/sessions/{session_id}/tree"): "get_tree",
    ("POST", "/v1/sessions/{session_id}/navigate"): "navigate",
    ("POST", "/v1/sessions/{session_id}/fork"): "fork",
    ("GET", "/v1/sessions/{session_id}/search"): "search",
    ("GET", "/v1/tools"): "get_tools",
    ("POST", "/v1/sessions/{session_id}/tool-calls"): "run_tool_call",
    ("GET", "/v1/sessions/{session_id}/events"): "events",
    ("GET", "/v1/events"): "tenant_events",
    ("POST", "/v1/webhooks"): "create_webhook",
    ("GET", "/v1/webhooks"): "list_webhooks",
    ("GET", "/v1/webhooks/{webhook_id}"): "get_webhook",
    ("PATCH", "/v1/webhooks/{webhook_id}"): "update_webhook",
    ("DELETE", "/v1/webhooks/{webhook_id}"): "delete_webhook",
    ("POST", "/v1/webhooks/{webhook_id}/test"): "test_webhook",
    ("GET", "/v1/webhooks/{webhook_id}/deliveries"): "list_deliveries",
    ("POST", "/proxy/openai/v1/chat/completions"): "proxy_base_url",
    ("POST", "/proxy/anthropic/v1/messages"): "proxy_base_url",
    ("POST", "/proxy/openai/v1/responses"): "proxy_base_url",
    ("POST", "/proxy/openai/v1/responses/compact"): "proxy_base_url",
    # The reachability checks agents make on their base URL.
    ("HEAD", "/proxy/anthropic"): "proxy_base_url",
    ("HEAD", "/proxy/openai/v1"): "proxy_base_url",
}
PROXY = {op for op, name in COVERED.items() if name == "proxy_base_url"}

# Where an operation's fields go other than as the method's parameters of the same name.
HEADERS = {
    "idempotency-key": "idempotency_key",
    "if-match": "if_match",
    "last-event-id": "last_event_id",
}
# A repeatable query parameter, named in the plural.
RENAMED = {("tenant_events", "type"): "types"}
BODY_IN: dict[str, set[str]] = {
    # PATCH takes the changes as a dict: the keys present change.
    "update_session": set(get_type_hints(SessionChanges)),
}
# The body is a provider's usage object (or compactd's own figures) passed as it is.
BODY_AS_IS = {"report_usage": "usage"}
# Event streams: an iterator of events in the sync client, an async one in the other.
STREAMS = {"events", "tenant_events"}


def spec_of(source: str) -> dict[str, Any]:
    if source == "committed":
        doc: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    else:
        doc = json.loads(_openapi_document())
    return doc


def operations(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), route): op
        for route, item in spec["paths"].items()
        for method, op in item.items()
    }


def body_fields(spec: dict[str, Any], schema: dict[str, Any]) -> set[str]:
    """The top-level properties of a body schema, through $ref and unions."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return body_fields(spec, spec["components"]["schemas"][name])
    fields = set(schema.get("properties", {}))
    for key in ("anyOf", "oneOf", "allOf"):
        for part in schema.get(key, []):
            fields |= body_fields(spec, part)
    return fields


@pytest.mark.parametrize("source", ["committed", "app"])
def test_every_operation_has_a_client_method(source: str) -> None:
    missing = sorted(set(operations(spec_of(source))) - set(COVERED))
    assert not missing, (
        f"operations the client does not cover (add them, and to COVERED): {missing}"
    )


def test_the_table_names_no_operation_that_is_gone() -> None:
    known = set(operations(spec_of("committed"))) | set(operations(spec_of("app")))
    assert set(COVERED) - PROXY <= known


@pytest.mark.parametrize("name", sorted(set(COVERED.values())))
def test_both_clients_have_the_method_with_the_same_parameters(name: str) -> None:
    sync, async_ = getattr(Compactd, name), getattr(AsyncCompactd, name)
    if name in STREAMS:
        sync_signature, async_signature = inspect.signature(sync), inspect.signature(async_)
        assert sync_signature.parameters == async_signature.parameters
        assert get_type_hints(sync)["return"] is EventStream
        assert get_type_hints(async_)["return"] is AsyncEventStream
    else:
        assert inspect.signature(sync) == inspect.signature(async_)
    if name != "proxy_base_url":
        assert inspect.iscoroutinefunction(async_)
        assert not inspect.iscoroutinefunction(sync)


@pytest.mark.parametrize("source", ["committed", "app"])
def test_every_parameter_and_body_field_is_a_method_parameter(source: str) -> None:
    spec = spec_of(source)
    gaps: list[str] = []
    for op, operation in operations(spec).items():
        if op in PROXY or op not in COVERED:
            continue
        name = COVERED[op]
        accepted = set(inspect.signature(getattr(Compactd, name)).parameters)
        for param in operation.get("parameters", []):
            wanted = RENAMED.get(
                (name, param["name"]), HEADERS.get(param["name"].lower(), param["name"])
            )
            if wanted not in accepted:
                gaps.append(f"{name}: {param['in']} parameter {param['name']}")
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is None or BODY_AS_IS.get(name) in accepted:
            continue
        for field in sorted(body_fields(spec, body["schema"])):
            if field not in BODY_IN.get(name, accepted):
                gaps.append(f"{name}: body field {field}")
    assert not gaps, f"fields of the API the client cannot send: {gaps}"


def typed_dict_in(annotation: Any) -> Any:
    """The TypedDict an annotation holds (``X``, ``X | None``, ``list[X]``), if any."""
    if is_typeddict(annotation):
        return annotation
    for arg in get_args(annotation):
        found = typed_dict_in(arg)
        if found is not None:
            return found
    return None


def schema_ref(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any] | None:
    """The component a property's schema names (through nullable unions and arrays)."""
    if "$ref" in schema:
        found: dict[str, Any] = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        return found
    parts = [*schema.get("anyOf", []), *schema.get("allOf", [])]
    if "items" in schema:
        parts.append(schema["items"])
    for part in parts:
        ref = schema_ref(spec, part)
        if ref is not None:
            return ref
    return None


def shape_gaps(
    spec: dict[str, Any], typed: Any, schema: dict[str, Any], where: str, *, both_ways: bool
) -> list[str]:
    """Where the TypedDict lacks a field of the response schema (and, ``both_ways``, has
    one it does not), recursively."""
    hints = get_type_hints(typed)
    properties: dict[str, Any] = schema.get("properties", {})
    gaps = [
        f"{where}.{name}: not in the client's {typed.__name__}"
        for name in properties.keys() - hints.keys()
    ]
    if both_ways:
        gaps += [f"{where}.{name}: not in the API's answer" for name in hints - properties.keys()]
    for name in hints.keys() & properties.keys():
        inner, ref = typed_dict_in(hints[name]), schema_ref(spec, properties[name])
        if inner is not None and ref is not None:
            gaps += shape_gaps(spec, inner, ref, f"{where}.{name}", both_ways=both_ways)
    return gaps


@pytest.mark.parametrize("source", ["committed", "app"])
def test_the_typed_answers_have_the_fields_the_api_answers_with(source: str) -> None:
    spec = spec_of(source)
    gaps: list[str] = []
    checked = 0
    for op, operation in operations(spec).items():
        if op in PROXY or op not in COVERED:
            continue
        returned = get_type_hints(getattr(Compactd, COVERED[op]))["return"]
        typed = typed_dict_in(returned)
        ok = next(v for k, v in operation["responses"].items() if k.startswith("2"))
        body = ok.get("content", {}).get("application/json", {}).get("schema")
        if typed is None or body is None:
            continue
        component = schema_ref(spec, body)
        assert component is not None, op
        # The committed document may lag behind the app (it is regenerated when the API
        # changes): a field the client already reads may not be in it yet.
        gaps += shape_gaps(spec, typed, component, COVERED[op], both_ways=source == "app")
        checked += 1
    assert checked >= 15
    assert not gaps, gaps
