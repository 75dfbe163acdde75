"""What the agent tier checks of a run: the conversation as stored and as sent upstream,
in one shape whatever the wire format, and each upstream request's validity and size."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from app.engine.window.context import check_openai_pairing
from tests.agents.agents import PROVIDER_KEY
from tests.proxy.support import assert_valid_upstream
from tests.upstream_server import RecordedRequest, prompt_tokens

#: The wire API each agent speaks: the scripted upstream's name for it.
API = {"claude": "anthropic", "codex": "responses", "opencode": "openai"}
#: The format its stored history is read back in (GET /v1/sessions/{id}/messages).
STORED_FORMAT = {"claude": "anthropic", "codex": "openai", "opencode": "openai"}

Turn = tuple[str, ...]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return ""


def _args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return str(arguments)
    return json.dumps(arguments, sort_keys=True)


def transcript(fmt: str, messages: list[Any]) -> list[Turn]:
    """The conversation as ``("user", text)``, ``("assistant", text)``,
    ``("call", id, name, arguments)`` and ``("result", id, text)``, in order: what the
    agent and the model said, without the wire's packaging (string or block content,
    where ``cache_control`` marks sit, how a turn's blocks are split into messages).
    System and developer messages are the agent's prompt, not its conversation, and
    are left out."""
    out: list[Turn] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        if fmt == "responses":
            kind = m.get("type", "message")
            if kind == "message" and m.get("role") in ("user", "assistant"):
                text = _text(m.get("content"))
                if text:
                    out.append((m["role"], text))
            elif kind in ("function_call", "custom_tool_call"):
                args = m.get("arguments", m.get("input"))
                out.append(("call", m["call_id"], m["name"], _args(args)))
            elif kind in ("function_call_output", "custom_tool_call_output"):
                out.append(("result", m["call_id"], _text(m.get("output"))))
            continue
        role, content = m.get("role"), m.get("content")
        if fmt == "openai":
            if role in ("user", "assistant") and _text(content):
                out.append((role, _text(content)))
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                out.append(("call", call["id"], fn["name"], _args(fn["arguments"])))
            if role == "tool":
                out.append(("result", m["tool_call_id"], _text(content)))
            continue
        if role not in ("user", "assistant"):
            continue
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks or []:
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                out.append((role, block["text"]))
            elif kind == "tool_use":
                out.append(("call", block["id"], block["name"], _args(block["input"])))
            elif kind == "tool_result":
                out.append(("result", block["tool_use_id"], _text(block.get("content"))))
    return out


def request_messages(api: str, request: RecordedRequest) -> list[Any]:
    body = request.json
    assert isinstance(body, dict), request.body[:200]
    key = "input" if api == "responses" else "messages"
    items = body[key]
    return [{"role": "user", "content": items}] if isinstance(items, str) else list(items)


def as_chat(items: list[Any]) -> list[dict[str, Any]]:
    """Responses input items as the chat messages they stand for (to check a Codex
    request's pairing as a chat request's)."""
    out: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {
                    "name": item["name"],
                    "arguments": item.get("arguments", item.get("input", "")),
                },
            }
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            )
    return out


def assert_valid(request: RecordedRequest, api: str, budget: int | None = None) -> None:
    """The upstream got a request valid for its API: every tool call answered and every
    result after its call, the agent's key, no compactd header; and, given ``budget``,
    a prompt within it as the model counts it (:func:`prompt_tokens`: compactd counts
    with its own tokenizer and calibrates that count on the usage the model reports)."""
    body = request.json
    assert isinstance(body, dict)
    if api == "responses":
        chat = as_chat(request_messages(api, request))
        problems = check_openai_pairing(chat, allow_pending=False)
        assert problems == [], problems
        assert request.headers.get("authorization") == f"Bearer {PROVIDER_KEY}"
        assert not any(k.startswith("x-compactd-") for k in request.headers)
    elif api == "anthropic":
        # Claude Code's system messages inside ``messages`` (its beta allows them) sit
        # between turns; the pairing and the alternation of roles are of the rest.
        rest = [m for m in body["messages"] if m.get("role") != "system"]
        assert_valid_upstream(dataclasses.replace(request, json={**body, "messages": rest}), api)
    else:
        assert_valid_upstream(request, api)
    if budget is not None:
        assert prompt_tokens(body) <= budget, (prompt_tokens(body), budget)
