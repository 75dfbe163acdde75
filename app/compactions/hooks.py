"""Blocking hooks (docs/events.md, "Blocking hooks"): webhooks flagged ``hook`` that a
compaction or a navigation calls, and waits for, before it does its work.

A hook gets a signed POST (app.upstream.signing) of ``{"type", "session_id",
"data"}`` and may answer with a JSON object:

- before a compaction (``compaction.before``; ``data`` has the job, the tokens before
  and the conversation the summary replaces, serialized as the summarizer reads it):
  ``{"cancel": true, "reason": "..."}`` cancels it; ``{"summary": "...", "details":
  {...}}`` is the whole summary, committed as made outside (``from_hook``); ``{"prompt": "...", "context": ["..."], "preserve": {...}}``
  replaces the summary prompt's instructions, adds lines to its
  ``<additional-context>`` and data kept on the compaction's details;
- before a navigation (``navigation.before``): ``{"cancel": true}`` refuses it (409),
  ``{"summary": "..."}`` is the branch summary when one is asked for.

Anything else (``{}``, no JSON, a non-2xx status, no answer within the hook's
``timeout_seconds``) is the default: the work goes on as without the hook. Every call
is recorded (the job's ``details.hooks``, and a ``hook.called`` event) with its
outcome. Hooks are called one after the other, oldest first: a cancel or a summary
stops there; prompts, context lines and preserved data add up (the last prompt wins).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.database import driver_connection
from app.core.outbound import Lane
from app.store import events, webhooks
from app.upstream import signing

log = logging.getLogger("compactd.hooks")

# The most hooks one point calls (their timeouts add up).
MAX_HOOKS = 5
MAX_SUMMARY_CHARS = 200_000
MAX_PROMPT_CHARS = 20_000
MAX_CONTEXT_LINES = 50
MAX_CONTEXT_CHARS = 2_000
MAX_PRESERVE_BYTES = 64 * 1024


@dataclass(slots=True)
class Answered:
    """What the hooks of one point said, together."""

    cancel: str | None = None  # the reason
    summary: str | None = None
    summary_details: dict[str, Any] | None = None
    prompt: str | None = None
    context: list[str] = field(default_factory=list)
    preserve: dict[str, Any] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)  # one record per hook called


def _read(answer: Any, point: str, into: Answered) -> str:
    """Take one hook's answer into ``into``; its outcome, or raise ValueError."""
    if not isinstance(answer, Mapping):
        raise ValueError("the answer is not a JSON object")
    if answer.get("cancel") is True:
        reason = answer.get("reason")
        into.cancel = reason[:500] if isinstance(reason, str) and reason else "cancelled by a hook"
        return "cancelled"
    summary = answer.get("summary")
    if summary is not None:
        details = answer.get("details")
        if isinstance(summary, Mapping):  # {summary: {summary, details}}
            details = summary.get("details")
            summary = summary.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            raise ValueError("summary must be a non-empty string")
        if len(summary) > MAX_SUMMARY_CHARS:
            raise ValueError(f"summary is over {MAX_SUMMARY_CHARS:,} characters")
        into.summary = summary
        into.summary_details = dict(details) if isinstance(details, Mapping) else None
        return "summary"
    if point != "compaction.before":
        return "proceeded"
    # Checked whole before any of it is taken: an answer invalid in part is the
    # default (the work goes on as without this hook), not half applied.
    prompt = answer.get("prompt")
    if prompt is not None and (
        not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS
    ):
        raise ValueError(f"prompt must be a string of 1 to {MAX_PROMPT_CHARS:,} characters")
    context = answer.get("context")
    lines: list[str] = []
    if context is not None:
        if not isinstance(context, list) or not all(isinstance(c, str) for c in context):
            raise ValueError("context must be a list of strings")
        lines = [c[:MAX_CONTEXT_CHARS] for c in context if c.strip()]
    preserve = answer.get("preserve", answer.get("preserveData"))
    merged: dict[str, Any] | None = None
    if preserve is not None:
        if not isinstance(preserve, Mapping):
            raise ValueError("preserve must be a JSON object")
        merged = {**into.preserve, **preserve}
        if len(orjson.dumps(merged)) > MAX_PRESERVE_BYTES:
            raise ValueError(f"preserve is over {MAX_PRESERVE_BYTES:,} bytes")
    if prompt is not None:
        into.prompt = prompt
    if lines:
        into.context = (into.context + lines)[:MAX_CONTEXT_LINES]
    if merged is not None:
        into.preserve = merged
    changed = prompt is not None or bool(lines) or merged is not None
    return "customized" if changed else "proceeded"


async def lookup(
    engine: AsyncEngine, tenant_id: str, session_id: str, point: str
) -> list[webhooks.WebhookRow]:
    """The hooks ``point`` calls for the session, oldest first (at most :data:`MAX_HOOKS`):
    looked up first, so that a caller with none builds no payload for them."""
    async with driver_connection(engine) as driver:
        return (await webhooks.hooks(driver, tenant_id, session_id, point))[:MAX_HOOKS]


async def call(
    engine: AsyncEngine,
    lane: Lane,
    found: list[webhooks.WebhookRow],
    tenant_id: str,
    session_id: str,
    point: str,
    data: dict[str, Any],
    *,
    message_id: str,
) -> Answered:
    """Call ``found``, the session's hooks for ``point`` (see the module's docstring)."""
    answered = Answered()
    body = orjson.dumps({"type": point, "session_id": session_id, "data": data}, default=str)
    for hook in found:
        started = time.perf_counter()
        # The tenant's place in the hooks' lane is taken before the hook's own timeout
        # starts (app.core.outbound).
        async with lane.slot(tenant_id) as http:
            sent = await signing.post(
                http, hook.url, hook.secret, message_id, body, hook.timeout_seconds
            )
        record: dict[str, Any] = {
            "webhook_id": str(hook.id),
            "point": point,
            "status": sent.status,
            "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
        }
        if sent.error is not None:
            record.update(outcome="timeout" if "no answer" in sent.error else "error")
            record["error"] = sent.error
        elif not sent.ok:
            record.update(outcome="error", error=f"answered {sent.status}")
        else:
            try:
                answer = orjson.loads(sent.body) if sent.body.strip() else {}
                record["outcome"] = _read(answer, point, answered)
            except (orjson.JSONDecodeError, ValueError) as exc:
                record.update(outcome="invalid", error=str(exc)[:300])
        if record["outcome"] in ("timeout", "error", "invalid"):
            record["applied"] = "default: the work goes on as without this hook"
            log.warning("hook %s at %s: %s", hook.id, point, record.get("error"))
        answered.calls.append(record)
        async with driver_connection(engine) as driver:
            await events.emit(driver, tenant_id, session_id, "hook.called", record)
        if answered.cancel is not None or answered.summary is not None:
            break
    return answered
