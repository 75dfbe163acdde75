"""Conversations an agent did not plan as one: where a proxied call goes on when its
history departs from the stored one (the rules: :mod:`app.engine.proxy.conversations`).

Called by the proxy's pipeline (:func:`app.proxy.placement.prepare`) after
matching found the request's history is not the stored one followed by new messages,
and the "sent again" rule did not answer it. It reads the stored history (its first
entries only, unless the first message is shared), then, by the rule that applies:

- ``branch``: moves the session's leaf to the last message the request shares with it
  (as ``POST …/navigate`` does without a branch summary: a new branch of the tree
  after that entry, the old one kept; the event ``session.navigated``), and the call
  goes on in the same session: its messages after the shared ones are stored on the
  new branch, its reply after them.
- ``side``: the call goes on in the named session's child for its first message
  (created on first use, with the request's model, the proxy's config and
  ``parent_id``), where the whole pipeline runs: matching, append, context, upstream,
  reply.
- ``takeover``: the stored conversation is a provisional one (a title request that
  came before the real first call): it is forked, exactly as stored, into the child
  its first message names (``parent_id`` set: the fork shares the stored entries,
  nothing is copied or rewritten), and the named session starts again on a new, empty
  branch from the root of its tree (the provisional entries stay on the branch it
  leaves), where the call goes on.

Everything here happens while the call holds the named session's turn (a side
conversation's call keeps it until it ends: calls of one agent are served one at a
time in a process). Each change is its own short transaction with the session row
locked, made only if the session has not moved since the call read it; otherwise the
pipeline reads and matches again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions.branch import move_leaf, restart_at_root
from app.core import metrics
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.errors import BadRequest, Conflict
from app.engine.model import InvalidMessage
from app.engine.proxy import conversations as rules
from app.engine.proxy.history import Stored, digest, first_difference
from app.engine.proxy.wire import ProxyRequest
from app.engine.proxy.wires import wire_of
from app.engine.tree import Path
from app.proxy.repository import KnownRow, ProxyRepository, StoredMessage
from app.proxy.request import invalid
from app.store import branches, events
from app.store.session_row import locked
from app.tree.schemas import ForkRequest
from app.tree.service import TreeService

log = logging.getLogger("compactd.proxy")

# Stored message entries read per statement when locating where a request departs.
PAGE = 1000
# The most times one call moves to another session or path: a side conversation's
# child, then a branch in it, leaves room for one more.
MOVES = 3
# Enough of the stored history to tell a provisional conversation (one exchange).
_HEAD = rules.PROVISIONAL_ENTRIES + 1
_NO_RETRY = {"x-should-retry": "false"}


@dataclass(frozen=True, slots=True)
class Placed:
    """The session the call goes on in; ``parent_id``: the one to create it under, if it
    does not exist yet (a side conversation's child)."""

    session_id: str
    parent_id: str | None = None


class Conversations:
    """Where a diverged call of one tenant goes on (see the module's docstring)."""

    def __init__(self, engine: AsyncEngine, tenant_id: str, repo: ProxyRepository) -> None:
        self.engine = engine
        self.tenant_id = tenant_id
        self.repo = repo

    async def place(
        self, driver: Driver, request: ProxyRequest, session_id: str, row: KnownRow, moves: int
    ) -> Placed:
        """Where the call goes on (having made the move the rule asks for); ``row``: the
        session as the call read it, ``moves``: the moves this call made already."""
        if moves >= MOVES:
            raise BadRequest(
                f"the history in this request could not be placed in session {session_id!r} "
                f"or its side conversations after {moves} moves; start a new session id",
                headers=_NO_RETRY,
            )
        parse = wire_of(request).parse
        try:
            firsts = parse(request.messages[0], request.path(0)) if request.messages else []
        except InvalidMessage as exc:
            raise invalid(exc) from None
        head = await self.repo.messages_after(driver, session_id, 0, _HEAD)
        if firsts and head and Stored.of(head[0].entry, head[0].erased).matches(firsts[0]):
            stored = await self._stored(driver, session_id, head)
            try:
                found = first_difference(
                    request.messages,
                    parse,
                    [Stored.of(r.entry, r.erased) for r in stored],
                    request.offset,
                    request.field,
                )
            except InvalidMessage as exc:
                raise invalid(exc) from None
            if found.messages >= 1:
                await self._branch(session_id, row, stored[found.entries - 1], len(stored))
                return Placed(session_id)
        provisional = rules.provisional([r.entry for r in head], row.tools_declared)
        where = rules.place(0, provisional, rules.declares_tools(request.body))
        if where == "takeover":
            first = Stored.of(head[0].entry, head[0].erased).digest
            await self._take_over(
                session_id, row, rules.child_id(session_id, row.created_at, first)
            )
            return Placed(session_id)
        child = rules.child_id(session_id, row.created_at, digest(firsts[0]) if firsts else b"")
        exists, parent = await self.repo.parent_of(driver, child)
        if exists and parent != session_id:
            raise BadRequest(
                f"the first message of this request differs from session {session_id!r}'s, "
                f"so it is another conversation, stored in the child session {child!r}; but "
                f"a session {child!r} exists that is not {session_id!r}'s child (created by "
                "hand, or the parent deleted): delete it, or start a new session id",
                headers=_NO_RETRY,
            )
        log.info(
            "proxied call is another conversation: stored in a child session",
            extra={"session_id": session_id, "child_id": child, "created": not exists},
        )
        return Placed(child, session_id)

    async def _stored(
        self, driver: Driver, session_id: str, head: list[StoredMessage]
    ) -> list[StoredMessage]:
        """All the message entries on the session's path (``head``: its first ones)."""
        stored = list(head)
        if len(head) < _HEAD:
            return stored
        while True:
            rows = await self.repo.messages_after(driver, session_id, stored[-1].seq, PAGE)
            stored.extend(rows)
            if len(rows) < PAGE:
                return stored

    async def _branch(
        self, session_id: str, row: KnownRow, shared: StoredMessage, stored: int
    ) -> None:
        """Move the session's leaf to ``shared``, the last message the request shares
        with it, unless the session moved since ``row`` was read (then the call reads
        and matches again)."""
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                state = unit.state
                if state.version != row.version or state.path != _path(row):
                    return
                seq = shared.seq
                landing = await branches.landing_at(
                    unit.driver,
                    self.tenant_id,
                    state.family_id,
                    state.path.branch_of(seq),
                    seq,
                    placed=True,
                )
                if landing is None:  # pragma: no cover - every seq of a path has its entry
                    raise Conflict(f"session {session_id!r} changed during the call; retry")
                old_leaf = state.next_seq - 1
                await move_leaf(unit, landing, state.path.prefix(seq))
                await events.emit(
                    unit.driver,
                    self.tenant_id,
                    session_id,
                    "session.navigated",
                    {
                        "from_leaf_seq": old_leaf,
                        "to_leaf_seq": seq,
                        "to_entry_id": str(landing.id),
                        "abandoned_seqs": old_leaf - seq,
                        "branch_summary_seq": None,
                    },
                )
        log.info(
            "proxied call departs from the stored history: it goes on on a new branch",
            extra={"session_id": session_id, "from_seq": seq, "stored_messages": stored},
        )

    async def _take_over(self, session_id: str, row: KnownRow, child: str) -> None:
        """Fork the session's provisional conversation into ``child`` and start the
        session again from the root, unless it moved since ``row`` was read."""
        tree = TreeService(self.engine, self.tenant_id)
        try:
            await tree.fork(
                session_id, ForkRequest(id=child), idempotency_key=None, parent_id=session_id
            )
        except Conflict:
            async with driver_connection(self.engine) as driver:
                exists, parent = await self.repo.parent_of(driver, child)
            if not exists or parent != session_id:
                raise BadRequest(
                    f"session {session_id!r}'s first conversation is to move to its child "
                    f"session {child!r}, but a session {child!r} exists that is not its "
                    "child: delete it, or start a new session id",
                    headers=_NO_RETRY,
                ) from None
            # Moved there already (a call that ended before the session restarted).
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                if unit.state.version != row.version or unit.state.path != _path(row):
                    return
                old_leaf = unit.state.next_seq - 1
                await restart_at_root(unit)
                await events.emit(
                    unit.driver,
                    self.tenant_id,
                    session_id,
                    "session.navigated",
                    {
                        "from_leaf_seq": old_leaf,
                        "to_leaf_seq": 0,
                        "to_entry_id": None,
                        "abandoned_seqs": old_leaf,
                        "branch_summary_seq": None,
                    },
                )
        log.info(
            "proxied call is the agent's conversation: the provisional one before it moved "
            "to a child session",
            extra={"session_id": session_id, "child_id": child},
        )


def _path(row: KnownRow) -> Path:
    return Path(*row.path)
