"""What the session-store adapters share: which compactd session holds a store's
conversation now, reading the managed context, popping the last message and clearing,
on compactd's append-only history (nothing stored is ever deleted).

- **The session**: the store's id is a compactd session's id, created on first use
  (the adapter's ``model``, window and ``config``). After a clear the conversation goes
  on in a new session, ``<id>.<n>``; the first session's metadata names the current one
  (``compactd_client.current``), so a store opened later with the same id finds it.
- **Pop**: the active leaf moves back to the entry before the last message (the tree's
  navigate); the popped message stays stored, on a branch of its own that the next
  append leaves behind. A pop right after a compaction also steps back before that
  compaction (its summary entry came after the popped message): the context is the
  uncompacted one, and the next append or usage report compacts again when it is due.
  The first message cannot be navigated before: popping it clears.
- **Clear**: a new session, as above; the old one stays, whole, under its own id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from compactd_client import types as t
from compactd_client._async import AsyncCompactd
from compactd_client._sync import Compactd
from compactd_client.errors import ConflictError, NotFoundError

CURRENT_KEY = "compactd_client.current"
OF_KEY = "compactd_client.of"
# The agent SDKs run their own loop: a "continue" prompt compactd would add after a
# compaction is not the user's, and the SDK's next run brings the user's input anyway.
DEFAULT_CONFIG: dict[str, Any] = {"compaction": {"auto_continue": False}}
# Terminal states of a compaction job.
DONE = frozenset({"succeeded", "failed", "cancelled"})
# How far back from the leaf a pop looks for the last message (past a compaction's
# summary entry and the service's own "continue" prompt).
POP_LOOKBACK = 16


def merged(base: Mapping[str, Any], over: Mapping[str, Any] | None) -> dict[str, Any]:
    """``over`` on top of ``base``, nested objects merged."""
    out = dict(base)
    for key, value in (over or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class StoreSpec:
    """How an adapter's session is created: the arguments of ``create_session``."""

    def __init__(
        self,
        session_id: str,
        model: str,
        *,
        context_window: int | None,
        max_output_tokens: int | None,
        input_limit: int | None,
        config: Mapping[str, Any] | None,
        metadata: Mapping[str, Any] | None,
    ) -> None:
        self.session_id = session_id
        self.model = model
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens
        self.input_limit = input_limit
        self.config = merged(DEFAULT_CONFIG, config)
        self.metadata = dict(metadata or {})

    def create_args(self, session_id: str) -> dict[str, Any]:
        metadata = self.metadata
        if session_id != self.session_id:
            metadata = {**metadata, OF_KEY: self.session_id}
        return {
            "id": session_id,
            "context_window": self.context_window,
            "max_output_tokens": self.max_output_tokens,
            "input_limit": self.input_limit,
            "config": self.config,
            "metadata": metadata,
        }

    def generation_id(self, n: int) -> str:
        return f"{self.session_id}.{n}"


def current_of(session: t.Session) -> str:
    current = session["metadata"].get(CURRENT_KEY)
    return current if isinstance(current, str) and current else session["id"]


def last_message(page: t.HistoryPage) -> t.HistoryEntry | None:
    messages = [e for e in page["entries"] if e["kind"] == "message"]
    return messages[-1] if messages else None


# The synchronous side (LangChain's history is synchronous).


class SyncStore:
    def __init__(self, client: Compactd, spec: StoreSpec) -> None:
        self.client = client
        self.spec = spec
        self._current: str | None = None

    def current(self) -> str:
        """The compactd session that holds the conversation now (created on first use)."""
        if self._current is None:
            try:
                session = self.client.get_session(self.spec.session_id)
            except NotFoundError:
                try:
                    session = self.client.create_session(
                        self.spec.model, **self.spec.create_args(self.spec.session_id)
                    )
                except ConflictError:  # created meanwhile by another process
                    session = self.client.get_session(self.spec.session_id)
            self._current = current_of(session)
        return self._current

    def context(self, wait: float) -> t.Context:
        sid = self.current()
        context = self.client.get_context(sid, format="openai")
        if context["state"] == "ok" or wait <= 0:
            return context
        job = self.client.get_session(sid)["active_compaction_id"]
        deadline = time.monotonic() + wait
        while job is not None and time.monotonic() < deadline:
            if self.client.get_compaction(sid, job)["status"] in DONE:
                return self.client.get_context(sid, format="openai")
            time.sleep(0.1)
        return context

    def pop(self) -> t.Message | None:
        sid = self.current()
        leaf = self.client.get_tree(sid, limit=1)["leaf_seq"]
        if leaf == 0:
            return None
        start = max(0, leaf - POP_LOOKBACK)
        entry = last_message(self.client.list_messages(sid, after_seq=start, limit=POP_LOOKBACK))
        if entry is None:
            return None
        if entry["seq"] == 1:
            self.clear()
        else:
            self.client.navigate(sid, seq=entry["seq"] - 1)
        return entry["message"]

    def clear(self) -> None:
        self.current()
        first = self.client.get_session(self.spec.session_id)
        n = int(first["metadata"].get(f"{CURRENT_KEY}.n", 0))
        while True:
            n += 1
            new_id = self.spec.generation_id(n)
            try:
                self.client.create_session(self.spec.model, **self.spec.create_args(new_id))
                break
            except ConflictError:  # left by a clear that did not finish: use the next
                continue
        metadata = {**first["metadata"], CURRENT_KEY: new_id, f"{CURRENT_KEY}.n": n}
        self.client.update_session(
            self.spec.session_id, {"metadata": metadata}, if_match=first["version"]
        )
        self._current = new_id


# The asynchronous side (the OpenAI Agents SDK's session is asynchronous).


class AsyncStore:
    def __init__(self, client: AsyncCompactd, spec: StoreSpec) -> None:
        self.client = client
        self.spec = spec
        self._current: str | None = None

    async def current(self) -> str:
        """The compactd session that holds the conversation now (created on first use)."""
        if self._current is None:
            try:
                session = await self.client.get_session(self.spec.session_id)
            except NotFoundError:
                try:
                    session = await self.client.create_session(
                        self.spec.model, **self.spec.create_args(self.spec.session_id)
                    )
                except ConflictError:  # created meanwhile by another process
                    session = await self.client.get_session(self.spec.session_id)
            self._current = current_of(session)
        return self._current

    async def context(self, wait: float) -> t.Context:
        sid = await self.current()
        context = await self.client.get_context(sid, format="openai")
        if context["state"] == "ok" or wait <= 0:
            return context
        job = (await self.client.get_session(sid))["active_compaction_id"]
        deadline = time.monotonic() + wait
        while job is not None and time.monotonic() < deadline:
            if (await self.client.get_compaction(sid, job))["status"] in DONE:
                return await self.client.get_context(sid, format="openai")
            await asyncio.sleep(0.1)
        return context

    async def pop(self) -> t.Message | None:
        sid = await self.current()
        leaf = (await self.client.get_tree(sid, limit=1))["leaf_seq"]
        if leaf == 0:
            return None
        start = max(0, leaf - POP_LOOKBACK)
        page = await self.client.list_messages(sid, after_seq=start, limit=POP_LOOKBACK)
        entry = last_message(page)
        if entry is None:
            return None
        if entry["seq"] == 1:
            await self.clear()
        else:
            await self.client.navigate(sid, seq=entry["seq"] - 1)
        return entry["message"]

    async def clear(self) -> None:
        await self.current()
        first = await self.client.get_session(self.spec.session_id)
        n = int(first["metadata"].get(f"{CURRENT_KEY}.n", 0))
        while True:
            n += 1
            new_id = self.spec.generation_id(n)
            try:
                await self.client.create_session(self.spec.model, **self.spec.create_args(new_id))
                break
            except ConflictError:  # left by a clear that did not finish: use the next
                continue
        metadata = {**first["metadata"], CURRENT_KEY: new_id, f"{CURRENT_KEY}.n": n}
        await self.client.update_session(
            self.spec.session_id, {"metadata": metadata}, if_match=first["version"]
        )
        self._current = new_id
