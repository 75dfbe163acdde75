"""The one context assembly: a session's stored window read as items, and the context
assembled from them. ``GET /context`` (:mod:`app.context.service`) and the proxy both
build their context here; the proxy also keeps the last one it built per session and
extends it by its own appends (:class:`Contexts`), on the terms of :class:`WindowKey`.
How and why: docs/proxy.md, "The context kept between calls"."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import orjson

from app.core.driver import Driver, Record
from app.core.errors import NotFound
from app.engine.window.view import PlaceholderViews, assemble_anthropic, assemble_openai
from app.history.schemas import Format
from app.messages.service import AppendResult
from app.sessions import service as sessions
from app.sessions.schemas import SessionConfig
from app.store.append import EntryRow
from app.store.context_reads import read_state_and_marks, read_window
from app.store.paths import OnPath
from app.store.session_row import SessionState

# Sessions whose last context is kept, and the most characters of views kept over all.
KEPT_SESSIONS = 256
KEPT_BYTES = 64 * 1024 * 1024


class Item(NamedTuple):
    """One row of the window, as the assemblers read it (both view names hold the
    fragment of the context's format; a pruned result's is its placeholder's). A tuple:
    a context read makes one per row."""

    seq: int
    role: str
    tool_call_id: str | None
    call_ids: tuple[str, ...]
    tokens: int
    view_openai: str

    @property
    def view_anthropic(self) -> str:
        return self.view_openai


_new_item = tuple.__new__  # Item(...) without NamedTuple's Python-level __new__


def _item(row: Record, view: str, tokens: int) -> Item:
    call_ids = row["call_ids"]
    return _new_item(
        Item,
        (
            row["seq"],
            row["role"],
            row["link_id"],
            tuple(call_ids) if call_ids else (),
            tokens,
            view,
        ),
    )


def items_of(
    rows: list[Record], marks: dict[int, int], fmt: Format, placeholder: str
) -> list[Item]:
    """The window's rows; a pruned tool result shows the placeholder and costs its tokens."""
    if not marks:
        return [_item(row, row["view"], row["tokens"]) for row in rows]
    views = PlaceholderViews(placeholder)
    side = 0 if fmt == "openai" else 1
    items = []
    for row in rows:
        tokens = marks.get(row["seq"])
        if tokens is None:
            items.append(_item(row, row["view"], row["tokens"]))
        else:
            rendered = views.render(row["link_id"], row["is_error"])[side]
            items.append(_item(row, rendered, tokens))
    return items


def item_of_entry(row: EntryRow, fmt: Format) -> Item:
    """An entry as an append wrote it, as the window read gives it back."""
    link = row.view_call_id if row.view_call_id is not None else row.tool_call_id
    call_ids = tuple(orjson.loads(row.call_ids)) if row.call_ids else ()
    view = row.view_openai if fmt == "openai" else row.view_anthropic
    return Item(row.seq, row.role, link, call_ids, row.tokens, view)


@dataclass(frozen=True, slots=True)
class WindowKey:
    """What a session's window (which rows it holds) and each row's view depend on,
    besides the log itself. A context kept may be extended by later appends only while
    this is unchanged; a field the read or the views come to depend on belongs here."""

    model: str
    context_start_seq: int
    summary_seq: int | None
    pinned_seqs: tuple[int, ...]
    prune_count: int  # a prune rewrites rows (prune.erase) and marks them
    compaction_count: int
    config: bytes  # the overrides as sorted JSON (the placeholder, the view's options)

    @classmethod
    def of(cls, state: SessionState) -> WindowKey:
        return cls(
            state.model,
            state.context_start_seq,
            state.summary_seq,
            tuple(state.pinned_seqs),
            state.prune_count,
            state.compaction_count,
            orjson.dumps(state.config, option=orjson.OPT_SORT_KEYS),
        )


@dataclass(frozen=True, slots=True)
class Window:
    """A session's window as read: the session (its prune marks applied to the items),
    its effective config, and its rows as items, in the model's order."""

    state: SessionState
    config: SessionConfig
    items: list[Item]


async def read(driver: Driver, tenant_id: str, session_id: str, fmt: Format) -> Window:
    """The window as GET /context reads it: two statements. The session and its prune
    marks come from one snapshot, and the window stops below the ``next_seq`` read with
    them, so it matches the totals even when an append commits between the two."""
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
        fmt,
        summary_seq=state.summary_seq,
        pinned_seqs=state.pinned_seqs,
    )
    config = sessions.effective_config(state.config)
    return Window(state, config, items_of(rows, marks, fmt, config.prune.placeholder))


class Assembled(NamedTuple):
    """The context's messages (and Anthropic ``system`` blocks) as JSON arrays, and the
    indices of the items in them (a tool call without its result is left out)."""

    messages: bytes
    system: bytes | None
    used: list[int]


def assemble(items: list[Item], fmt: Format, *, system_messages: bool = False) -> Assembled:
    """The context of ``items``. ``system_messages``: Anthropic's later system entries as
    ``role: "system"`` messages (the request allows them), not as ``<system>`` user text."""
    if fmt == "openai":
        messages, used = assemble_openai(items)
        return Assembled(messages, None, used)
    system, messages, used = assemble_anthropic(items, system_messages=system_messages)
    return Assembled(messages, system, used)


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


def _built(
    items: list[Item], fmt: Format, state: SessionState, extended: bool, system_messages: bool
) -> Built:
    found = assemble(items, fmt, system_messages=system_messages)
    tokens = sum(items[i].tokens for i in found.used)
    return Built(found.messages, found.system, state.version, tokens, state, extended)


@dataclass(slots=True)
class _Kept:
    """The last context built for a session: its items, and what they were drawn from."""

    fmt: Format
    created_at: datetime  # the session's: a session deleted and made again is another
    key: WindowKey
    end_seq: int  # the items cover the log up to here (the next seq then)
    items: list[Item]
    size: int = field(default=0)  # characters of views held


class Contexts:
    """The last context built for each session lately called through the proxy, per
    process and per app (its sessions are its database's), bounded in sessions and in
    the characters of views held."""

    def __init__(self, sessions_kept: int = KEPT_SESSIONS, bytes_kept: int = KEPT_BYTES) -> None:
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
        self._sessions_kept = sessions_kept
        self._bytes_kept = bytes_kept
        self._size = 0

    async def after_append(
        self,
        driver: Driver,
        tenant_id: str,
        session_id: str,
        fmt: Format,
        created_at: datetime,
        appended: AppendResult | None,
        *,
        system_messages: bool = False,
    ) -> Built:
        """The context once ``appended`` (this call's append, None if it stored nothing)
        is stored: the last one extended by it when it may be, else read fresh."""
        key = (tenant_id, session_id)
        if appended is not None and self._extend(key, fmt, created_at, appended):
            state = appended.after
            assert state is not None  # _extend checked it
            return _built(self._kept[key].items, fmt, state, True, system_messages)
        return await self.fresh(
            driver, tenant_id, session_id, fmt, created_at, system_messages=system_messages
        )

    async def fresh(
        self,
        driver: Driver,
        tenant_id: str,
        session_id: str,
        fmt: Format,
        created_at: datetime,
        *,
        system_messages: bool = False,
    ) -> Built:
        """The context as GET /context reads it; kept as the session's last."""
        key = (tenant_id, session_id)
        self._drop(key)
        window = await read(driver, tenant_id, session_id, fmt)
        state = window.state
        self._keep(key, _Kept(fmt, created_at, WindowKey.of(state), state.next_seq, window.items))
        return _built(window.items, fmt, state, False, system_messages)

    def extend(self, tenant_id: str, session_id: str, fmt: Format, appended: AppendResult) -> None:
        """The rows of an append the proxy made (a reply) added to the session's last
        context, if nothing else moved the session since; else that context is
        forgotten (the next call reads its context fresh)."""
        key = (tenant_id, session_id)
        kept = self._kept.get(key)
        if kept is not None:
            self._extend(key, fmt, kept.created_at, appended)

    def _extend(
        self, key: tuple[str, str], fmt: Format, created_at: datetime, appended: AppendResult
    ) -> bool:
        """Whether the session's last context, extended by ``appended``'s rows, is the
        window now: the same session, drawn the same way before and after the append
        (:class:`WindowKey`), and the append's rows all that its log gained since.
        Forgotten when it is not."""
        kept = self._kept.get(key)
        before, after = appended.before, appended.after
        if (
            kept is None
            or before is None
            or after is None
            or kept.fmt != fmt
            or kept.created_at != created_at
            or kept.end_seq != before.next_seq
            or after.next_seq != before.next_seq + len(appended.rows)
            or kept.key != WindowKey.of(before)
            or WindowKey.of(after) != kept.key
        ):
            self._drop(key)
            return False
        added = [item_of_entry(row, fmt) for row in appended.rows]
        kept.items.extend(added)
        kept.end_seq = after.next_seq
        grown = sum(len(i.view_openai) for i in added)
        kept.size += grown
        self._size += grown
        self._kept.move_to_end(key)
        self._trim()
        return key in self._kept

    def _keep(self, key: tuple[str, str], kept: _Kept) -> None:
        kept.size = sum(len(i.view_openai) for i in kept.items)
        self._kept[key] = kept
        self._size += kept.size
        self._trim()

    def _drop(self, key: tuple[str, str]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._size -= kept.size

    def _trim(self) -> None:
        while self._kept and (
            len(self._kept) > self._sessions_kept or self._size > self._bytes_kept
        ):
            _, kept = self._kept.popitem(last=False)
            self._size -= kept.size
