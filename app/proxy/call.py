"""A proxied call in progress, and what every step of its pipeline works with
(docs/proxy.md, "Inside a call")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.context.assembly import Built
from app.core.settings import Settings
from app.engine.proxy import recall as proxy_recall
from app.engine.proxy.history import Known, Matched
from app.engine.proxy.wire import ProxyRequest
from app.proxy.forward import ProxyClient
from app.proxy.repository import ProxyRepository

# Appends that lose their If-Match to another writer (a compaction committing, a usage
# report) are tried again this many times in all.
ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class ProxyDeps:
    """What the pipeline's steps work with, for one tenant's request."""

    engine: AsyncEngine
    client: ProxyClient
    http: httpx.AsyncClient
    settings: Settings
    tenant_id: str
    repo: ProxyRepository
    # The agent's query string (Claude Code's ?beta=true): it goes upstream as sent.
    query: bytes = b""


@dataclass(slots=True)
class Call:
    """One call in progress: the request, what was matched and stored, what was sent."""

    request: ProxyRequest
    session_id: str
    created_at: datetime  # the session's (app.context.assembly.Contexts tells sessions apart by it)
    headers: list[tuple[str, str]]
    matched: Matched
    overhead: int
    context: Built  # the context to send first
    known: Known  # after the new messages were stored
    last_seq: int  # of the last message entry the proxy knows is stored
    session_version: int  # the session's, as the call's own writes left it
    # The path of the session's tree the call's history is (a navigation moves it).
    path: tuple[tuple[int, ...], tuple[int, ...]] = ((0,), ())
    version: int = 0  # of the context sent
    sent_tokens: int = 0  # counted tokens of the context sent
    attempts: int = 0  # upstream requests made
    # The request with the recall tools, when the session offers them.
    offered: proxy_recall.Offered | None = None
    # Anthropic: later system entries go as ``role: "system"`` messages (the request
    # allows them: anthropic_format.system_messages_allowed), not as ``<system>`` text.
    system_messages: bool = False
    sent: Built | None = None  # the context sent last
