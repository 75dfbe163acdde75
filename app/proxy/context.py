"""The context a proxied call sends upstream: GET /context's, built on the call's own
connection right after its append, or, when nothing but the proxy's own appends moved
the session since, the one it last built extended by the entries those appends wrote.

A fresh context is GET /context's read (:class:`app.context.service.ContextService`):
the session and its prune marks, then the window's stored rows (the pinned entries, the
latest summary, the entries from the cut on), each row's view rendered once when it was
written, a pruned tool result shown as the placeholder (the caller records the version
served, as GET /context does). It costs two statements and a pass over the window's rows.

Most calls need no such read. Between two calls of an agent, the proxy itself stores
the reply and reports its usage; the call then stores its new messages. When, after
that append, the session's view is still drawn the same way as when the last context
was built (same model and config, cut, summary, pinned entries, and no prune or
compaction since) and its log holds only the rows the proxy has seen written (the
window's end moved by exactly the proxy's appends), the window is the last one's rows
followed by the new rows: entries are never rewritten but by a prune (``prune.erase``),
which counts in ``prune_count``. The rows are then assembled as a fresh read assembles
them (tool calls paired with their results). Anything else (an append through /v1 or
another process, a prune, a compaction, a PATCH, the session deleted and made again)
fails one of those checks, and the context is read fresh.

Per process and per app, for the sessions called most lately (bounded in number and in
the characters of views held).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from app.core.driver import Driver
from app.core.errors import NotFound
from app.engine.proxy.wire import Api
from app.engine.window.view import PlaceholderViews, assemble_anthropic, assemble_openai
from app.messages.service import Appended
from app.sessions import service as sessions
from app.store.log import EntryRow, OnPath, read_state_and_marks, read_window
from app.store.session_row import SessionState

# Sessions whose last context is kept, and the most characters of views kept over all.
KEPT_SESSIONS = 256
KEPT_BYTES = 64 * 1024 * 1024


class Item:
    """One row of the window as the assemblers read it (both views hold the fragment of
    the context's format; a pruned result's is its placeholder's)."""

    __slots__ = (
        "call_ids",
        "role",
        "seq",
        "tokens",
        "tool_call_id",
        "view_anthropic",
        "view_openai",
    )

    def __init__(
        self,
        seq: int,
        role: str,
        link_id: str | None,
        call_ids: tuple[str, ...],
        tokens: int,
        view: str,
    ) -> None:
        self.seq = seq
        self.role = role
        self.tool_call_id = link_id
        self.call_ids = call_ids
        self.tokens = tokens
        self.view_openai = self.view_anthropic = view


@dataclass(frozen=True, slots=True)
class Built:
    """A context, ready to go upstream: its messages (and Anthropic ``system`` blocks,
    if it has any) as JSON arrays, the session's version it is, and the tokens its
    entries count (summary, messages and tool outputs). ``state``: the session it was
    built from, to record as served (:func:`app.store.session_row.record_served`, as GET
    /context does; the caller does it, while the context is on its way)."""

    messages: bytes
    system: bytes | None
    version: int
    tokens: int
    state: SessionState
    extended: bool  # built from the last context and the proxy's appends, not read


def _shape(state: SessionState) -> tuple[Any, ...]:
    """What the window's rows and how they are shown depend on, besides the log."""
    return (
        state.model,
        state.context_start_seq,
        state.summary_seq,
        tuple(state.pinned_seqs),
        state.prune_count,
        state.compaction_count,
        orjson.dumps(state.config, option=orjson.OPT_SORT_KEYS),
    )


@dataclass(slots=True)
class _Window:
    """The last context built for a session: its rows as items, in the model's order,
    and what they were drawn from."""

    api: Api
    created_at: datetime  # the session's: a session deleted and made again is another
    shape: tuple[Any, ...]
    end_seq: int  # the items cover the log up to here (the next seq then)
    items: list[Item]
    size: int = field(default=0)  # characters of views held


def _item_of(row: EntryRow, api: Api) -> Item:
    """An entry as written, as the window read gives it back."""
    link = row.view_call_id if row.view_call_id is not None else row.tool_call_id
    call_ids = tuple(orjson.loads(row.call_ids)) if row.call_ids else ()
    view = row.view_openai if api == "openai" else row.view_anthropic
    return Item(row.seq, row.role, link, call_ids, row.tokens, view)


def _items(rows: list[Any], marks: dict[int, int], api: Api, placeholder: str) -> list[Item]:
    """The window read's rows; a pruned tool result shows the placeholder and costs its
    tokens (as :func:`app.context.service._items`)."""
    views = PlaceholderViews(placeholder) if marks else None
    side = 0 if api == "openai" else 1
    items = []
    for row in rows:
        call_ids = row["call_ids"]
        calls: tuple[str, ...] = tuple(call_ids) if call_ids else ()
        tokens = marks.get(row["seq"])
        if tokens is None or views is None:
            view, tokens = row["view"], row["tokens"]
        else:
            view = views.render(row["link_id"], row["is_error"])[side]
        items.append(Item(row["seq"], row["role"], row["link_id"], calls, tokens, view))
    return items


def _assembled(
    items: list[Item], api: Api, state: SessionState, extended: bool, system_messages: bool
) -> Built:
    system: bytes | None = None
    if api == "openai":
        messages, used = assemble_openai(items)
    else:
        system, messages, used = assemble_anthropic(items, system_messages=system_messages)
    tokens = sum(items[i].tokens for i in used)
    return Built(messages, system, state.version, tokens, state, extended)


class Contexts:
    """The last context built for each session lately called through the proxy (see
    the module's docstring). One per app: its sessions are its database's."""

    def __init__(self, sessions_kept: int = KEPT_SESSIONS, bytes_kept: int = KEPT_BYTES) -> None:
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()
        self._sessions_kept = sessions_kept
        self._bytes_kept = bytes_kept
        self._size = 0

    async def after_append(
        self,
        driver: Driver,
        tenant_id: str,
        session_id: str,
        api: Api,
        created_at: datetime,
        appended: Appended | None,
        *,
        system_messages: bool = False,
    ) -> Built:
        """The context once ``appended`` (this call's append, None if it stored nothing)
        is stored: the last one extended by it when it may be, else read fresh.
        ``system_messages``: Anthropic's later system entries as ``role: "system"``
        messages (the request allows them), not as ``<system>`` user text."""
        key = (tenant_id, session_id)
        if appended is not None and self._extend(key, api, created_at, appended):
            state = appended.after
            assert state is not None  # _extend checked it
            return _assembled(self._windows[key].items, api, state, True, system_messages)
        return await self.fresh(
            driver, tenant_id, session_id, api, created_at, system_messages=system_messages
        )

    async def fresh(
        self,
        driver: Driver,
        tenant_id: str,
        session_id: str,
        api: Api,
        created_at: datetime,
        *,
        system_messages: bool = False,
    ) -> Built:
        """The context as GET /context reads it; kept as the session's last."""
        key = (tenant_id, session_id)
        self._drop(key)
        found = await read_state_and_marks(driver, tenant_id, session_id)
        if found is None:
            raise NotFound(f"session {session_id!r} does not exist")
        state, marks = found
        rows = await read_window(
            driver,
            tenant_id,
            OnPath.of(session_id, state),
            state.context_start_seq,
            state.next_seq,
            api,
            summary_seq=state.summary_seq,
            pinned_seqs=state.pinned_seqs,
        )
        config = sessions.effective_config(state.config)
        items = _items(rows, marks, api, config.prune.placeholder)
        self._keep(key, _Window(api, created_at, _shape(state), state.next_seq, items))
        return _assembled(items, api, state, False, system_messages)

    def extend(self, tenant_id: str, session_id: str, api: Api, appended: Appended) -> None:
        """The rows of an append the proxy made (a reply) added to the session's last
        context, if nothing else moved the session since; else that context is
        forgotten (the next call reads its context fresh)."""
        key = (tenant_id, session_id)
        window = self._windows.get(key)
        if window is not None:
            self._extend(key, api, window.created_at, appended)

    def _extend(
        self, key: tuple[str, str], api: Api, created_at: datetime, appended: Appended
    ) -> bool:
        """Whether the session's last context, extended by ``appended``'s rows, is the
        window now (see the module's docstring); forgotten when it is not."""
        window = self._windows.get(key)
        before, after = appended.before, appended.after
        if (
            window is None
            or before is None
            or after is None
            or window.api != api
            or window.created_at != created_at
            or window.end_seq != before.next_seq
            or after.next_seq != before.next_seq + len(appended.rows)
            or window.shape != _shape(before)
            or _shape(after) != window.shape
        ):
            self._drop(key)
            return False
        added = [_item_of(row, api) for row in appended.rows]
        window.items.extend(added)
        window.end_seq = after.next_seq
        grown = sum(len(i.view_openai) for i in added)
        window.size += grown
        self._size += grown
        self._windows.move_to_end(key)
        self._trim()
        return key in self._windows

    def _keep(self, key: tuple[str, str], window: _Window) -> None:
        window.size = sum(len(i.view_openai) for i in window.items)
        self._windows[key] = window
        self._size += window.size
        self._trim()

    def _drop(self, key: tuple[str, str]) -> None:
        window = self._windows.pop(key, None)
        if window is not None:
            self._size -= window.size

    def _trim(self) -> None:
        while self._windows and (
            len(self._windows) > self._sessions_kept or self._size > self._bytes_kept
        ):
            _, window = self._windows.popitem(last=False)
            self._size -= window.size
