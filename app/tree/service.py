"""Moving in a session's tree: the tree as a page, navigation (at once, or once a
branch summary is written), forks. The path arithmetic is app.engine.tree's; the
SQL is the store's (app.store.branches, log, session_row, idempotency). A move recounts
the new path's context from its window (app.engine.accounting.ledger.PathMoved): never
a walk of the history.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions import hooks
from app.compactions.branch import move_leaf
from app.compactions.pivot import cancel_active, enqueue_branch_summary, transition
from app.core import metrics
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.errors import Conflict, NotFound, UnprocessableContent, invalid
from app.core.outbound import Lane
from app.engine.tree import OPEN, Prefix
from app.engine.tree import Path as TreePath
from app.sessions import service as sessions
from app.store import branches, events, idempotency, session_row
from app.store.log import LogRepository
from app.store.paths import OnPath
from app.store.session_row import SessionState, Unit, locked, read_state
from app.store.webhooks import WebhookRow
from app.tree.schemas import (
    BranchSummaryOut,
    ForkRequest,
    NavigateRequest,
    NavigateResponse,
    PathSegment,
    TreeEntry,
    TreePage,
)

BRANCH_SUMMARY = "branch_summary"

_CURSOR = re.compile(r"^(\d{1,19})\.(\d{1,19})$")


def _request_hash(route: str, body: Any) -> str:
    raw = orjson.dumps([route, body.model_dump(mode="json")], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()


def _cursor(branch: int, seq: int) -> str:
    return base64.urlsafe_b64encode(f"{branch}.{seq}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise invalid("cursor", "is not a cursor this service issued") from None
    found = _CURSOR.match(raw)
    if found is None or int(found[1]) > OPEN or int(found[2]) > OPEN:
        raise invalid("cursor", "is not a cursor this service issued")
    return int(found[1]), int(found[2])


def segments_of(path: TreePath, leaf_seq: int) -> list[PathSegment]:
    """The path up to its leaf as runs of seqs per branch."""
    branches, ends = path.segments(1, leaf_seq + 1)
    starts = [1, *(end + 1 for end in ends)][: len(ends)]
    return [
        PathSegment(branch=b, from_seq=start, to_seq=end)
        for b, start, end in zip(branches, starts, ends, strict=True)
    ]


def on_path(path: TreePath, leaf_seq: int, branch: int, seq: int) -> bool:
    return 1 <= seq <= leaf_seq and path.branch_of(seq) == branch


async def session_document(driver: Driver, tenant_id: str, session_id: str) -> dict[str, Any]:
    """The session as GET /v1/sessions/{id} shows it (JSON-ready), read on ``driver``."""
    row = await session_row.read_row(driver, tenant_id, session_id)
    if row is None:  # pragma: no cover - read under the caller's lock or insert
        raise NotFound(f"session {session_id!r} does not exist")
    document: dict[str, Any] = sessions.to_schema(row).model_dump(mode="json")
    return document


class TreeService:
    """The tree of one tenant's sessions."""

    def __init__(
        self,
        engine: AsyncEngine,
        tenant_id: str,
        wake: asyncio.Event | None = None,
        http: Lane | None = None,
    ) -> None:
        self.engine = engine
        self.tenant_id = tenant_id
        self.wake = wake
        self.http = http  # for the session's navigation.before hooks

    # --- reading ------------------------------------------------------------------

    async def tree(self, session_id: str, *, limit: int, cursor: str | None) -> TreePage:
        after = _decode_cursor(cursor) if cursor else (-1, 0)
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, self.tenant_id, session_id)
            if state is None:
                raise NotFound(f"session {session_id!r} does not exist")
            base = await branches.first_branch_path(
                driver, self.tenant_id, state.family_id, session_id
            )
            rows = await branches.tree_page(
                driver, self.tenant_id, state.family_id, session_id, base, after, limit + 1
            )
            leaf_seq = state.next_seq - 1
            path = state.path
            leaf = (
                await branches.landing_at(
                    driver, self.tenant_id, state.family_id, path.branch_of(leaf_seq), leaf_seq
                )
                if leaf_seq
                else None
            )
        page = rows[:limit]
        entries = [
            TreeEntry(
                id=r.id,
                seq=r.seq,
                branch=r.branch,
                parent_id=r.parent_id,
                kind=r.kind,
                role=r.role,
                label=" ".join((r.label or "").split())[:100],
                tokens=r.tokens,
                pinned=r.pinned,
                children=r.children,
                on_path=on_path(path, leaf_seq, r.branch, r.seq),
                leaf=leaf is not None and r.id == leaf.id,
            )
            for r in page
        ]
        last = page[-1] if page else None
        return TreePage(
            entries=entries,
            leaf_seq=leaf_seq,
            leaf_id=None if leaf is None else leaf.id,
            path=segments_of(path, leaf_seq),
            next_cursor=(
                _cursor(last.branch, last.seq) if last is not None and len(rows) > limit else None
            ),
        )

    # --- navigation -----------------------------------------------------------------

    async def navigate(
        self,
        session_id: str,
        body: NavigateRequest,
        *,
        idempotency_key: str | None,
        if_match: str | None,
    ) -> tuple[dict[str, Any], int, bool]:
        """The response document, its status (200, or 202 while a branch summary is
        written) and whether it replays an earlier one (an ``Idempotency-Key``)."""
        digest = _request_hash("navigate", body)
        hooked = hooks.Answered()
        found = (
            []
            if self.http is None
            else await hooks.lookup(self.engine, self.tenant_id, session_id, "navigation.before")
        )
        if found:
            # The hooks come after what would refuse the request or answer it without
            # them (no such session, a target that is not one, a replay), before the
            # lock: they may take seconds. All of it is checked again under the lock.
            async with driver_connection(self.engine) as driver:
                state = await read_state(driver, self.tenant_id, session_id)
                if state is None:
                    raise NotFound(f"session {session_id!r} does not exist")
                replay = await self._replay(driver, session_id, idempotency_key, digest)
                if replay is not None:
                    return replay[0], replay[1], True
                sessions.check_if_match(if_match, state.version)
                await self._target(driver, session_id, state, body)
            hooked = await self._hooks(session_id, body, found)
            if hooked.cancel is not None:
                raise Conflict(f"a hook cancelled the navigation: {hooked.cancel}")
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                driver, state = unit.driver, unit.state
                replay = await self._replay(driver, session_id, idempotency_key, digest)
                if replay is not None:
                    return replay[0], replay[1], True
                sessions.check_if_match(if_match, state.version)
                config = sessions.effective_config(state.config)
                landing, prefix = await self._target(driver, session_id, state, body)
                old_leaf = state.next_seq - 1
                common = min(state.path.common_depth(prefix.reopen()), old_leaf, landing.seq)
                abandoned = old_leaf - common
                summarize = (
                    body.summarize if body.summarize is not None else config.branch_summary.enabled
                )
                status_code = 200
                summary: BranchSummaryOut | None = None
                if landing.seq == old_leaf and abandoned == 0:
                    status = "unchanged"
                elif summarize and abandoned > 0:
                    summary = await self._enqueue_summary(
                        unit, body, landing, prefix, common, old_leaf, hooked
                    )
                    status, status_code = "pending", 202
                else:
                    await move_leaf(unit, landing, prefix)
                    status = "moved"
                    await events.emit(
                        driver,
                        self.tenant_id,
                        session_id,
                        "session.navigated",
                        {
                            "from_leaf_seq": old_leaf,
                            "to_leaf_seq": landing.seq,
                            "to_entry_id": str(landing.id),
                            "abandoned_seqs": abandoned,
                            "branch_summary_seq": None,
                        },
                    )
                leaf_seq = unit.state.next_seq - 1
                leaf_id = (
                    landing.id
                    if status != "pending"
                    else await self._leaf_id(driver, unit.state, leaf_seq)
                )
                document = NavigateResponse(
                    status=status,
                    session=await session_document(driver, self.tenant_id, session_id),
                    leaf_seq=leaf_seq,
                    leaf_id=leaf_id,
                    abandoned_seqs=abandoned,
                    branch_summary=summary,
                ).model_dump(mode="json")
                await self._keep(driver, session_id, idempotency_key, digest, status_code, document)
        return document, status_code, False

    async def _hooks(
        self, session_id: str, body: NavigateRequest, found: list[WebhookRow]
    ) -> hooks.Answered:
        """What the session's ``navigation.before`` hooks say (app.compactions.hooks):
        called before the session is locked, since they may take seconds."""
        assert self.http is not None
        data = {
            "entry_id": None if body.entry_id is None else str(body.entry_id),
            "seq": body.seq,
            "summarize": body.summarize,
            "instructions": body.instructions,
        }
        return await hooks.call(
            self.engine,
            self.http,
            found,
            self.tenant_id,
            session_id,
            "navigation.before",
            data,
            message_id=f"navigate-{uuid.uuid4()}",
        )

    async def _leaf_id(
        self, driver: Driver, state: SessionState, leaf_seq: int
    ) -> uuid.UUID | None:
        if not leaf_seq:
            return None
        found = await branches.landing_at(
            driver, self.tenant_id, state.family_id, state.path.branch_of(leaf_seq), leaf_seq
        )
        return None if found is None else found.id

    async def _target(
        self, driver: Driver, session_id: str, state: SessionState, body: NavigateRequest
    ) -> tuple[branches.Landing, Prefix]:
        """The entry a navigation lands on, and the path up to it; 422 when the
        session's tree has no such entry."""
        family = state.family_id
        if body.seq is not None:
            leaf = state.next_seq - 1
            if body.seq > leaf:
                raise invalid("seq", f"the active path ends at seq {leaf}")
            landing = await branches.landing_at(
                driver,
                self.tenant_id,
                family,
                state.path.branch_of(body.seq),
                body.seq,
                placed=True,
            )
            if landing is None:  # pragma: no cover - every seq of a path has its entry
                raise invalid("seq", f"no entry at seq {body.seq}")
            return landing, state.path.prefix(body.seq)
        assert body.entry_id is not None
        # With its branch's owner, path and tip (one round trip): move_leaf needs them.
        found = await branches.landing_by_id(
            driver, self.tenant_id, family, body.entry_id, placed=True
        )
        if found is None:
            raise invalid("entry_id", "is not an entry of this session")
        owner = (
            (found.placement.owner_id, found.placement.path)
            if found.placement is not None
            else await branches.branch_path(driver, self.tenant_id, family, found.branch)
        )
        if owner is None:  # pragma: no cover - an entry's branch has its row
            raise invalid("entry_id", "is not an entry of this session")
        if owner[0] != session_id:
            # Another session's branch: in this one's tree only on the path it was
            # forked from.
            base = await branches.first_branch_path(driver, self.tenant_id, family, session_id)
            if base is None or not base.holds(found.branch, found.seq):
                raise invalid("entry_id", "is not an entry of this session")
        return found, owner[1].prefix(found.seq)

    async def _enqueue_summary(
        self,
        unit: Unit,
        body: NavigateRequest,
        landing: branches.Landing,
        prefix: Prefix,
        common: int,
        old_leaf: int,
        hooked: hooks.Answered,
    ) -> BranchSummaryOut:
        """A branch-summary job: the worker summarizes the old path's entries after
        ``common`` and then moves the leaf, the summary entry after the target."""
        if await self._waits_on_results(unit, landing, prefix):
            raise Conflict(
                "a branch summary cannot follow an entry whose tool calls wait on their "
                "results: navigate to another entry, or without summarize"
            )
        if not await cancel_active(unit, "a navigation with a branch summary replaced it"):
            raise Conflict(
                "a compaction of this session is running; navigate again once it ends",
            )
        state = unit.state
        details: dict[str, Any] = {
            "navigation": {
                "from_branches": list(state.path_branches),
                "from_ends": list(state.path_ends),
                "from_next_seq": state.next_seq,
                "from_version": state.version,
                "common_seq": common,
                "target_branch": landing.branch,
                "target_seq": landing.seq,
                "target_branches": list(prefix.branches),
                "target_ends": list(prefix.ends),
            }
        }
        if hooked.calls:
            details["hooks"] = hooked.calls
        if hooked.summary is not None:
            details["hook_summary"] = hooked.summary  # the worker writes it as it is
        job = await enqueue_branch_summary(
            unit.driver,
            self.tenant_id,
            unit.session_id,
            body.instructions,
            details,
            context_tokens=state.context_tokens,
        )
        state.active_compaction_id = job.id
        await unit.save()
        transition("queued", BRANCH_SUMMARY, job.id, unit.session_id, self.tenant_id)
        if self.wake is not None:
            self.wake.set()
        return BranchSummaryOut(
            id=job.id, status=job.status, abandoned_from_seq=common + 1, abandoned_to_seq=old_leaf
        )

    async def _waits_on_results(
        self, unit: Unit, landing: branches.Landing, prefix: Prefix
    ) -> bool:
        at = OnPath(unit.session_id, unit.state.family_id, prefix.reopen())
        repo = LogRepository(self.tenant_id)
        tail = await repo.tail(unit.driver, at, landing.seq)
        if tail is None:
            return False
        role, kind, makes_calls, _ = tail
        if makes_calls:
            return True
        return (
            kind == "message"
            and role == "tool"
            and await repo.calls_pending(unit.driver, at, landing.seq)
        )

    # --- forks ------------------------------------------------------------------------

    async def fork(
        self,
        source_id: str,
        body: ForkRequest,
        *,
        idempotency_key: str | None,
        parent_id: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """A new session whose history is the source's path up to ``at_seq``: its
        first branch starts after that entry, so it shares the source's storage and
        grows on its own. The response document and whether it replays one.
        ``parent_id``: the new session's (the proxy's moved side conversations)."""
        digest = _request_hash("fork", body)
        async with locked(self.engine, self.tenant_id, source_id) as source:
            driver, state = source.driver, source.state
            replay = await self._replay(driver, source_id, idempotency_key, digest)
            if replay is not None:
                return replay[0], True
            leaf = state.next_seq - 1
            if leaf == 0:
                raise Conflict(f"session {source_id!r} is empty: there is nothing to fork")
            at_seq = leaf if body.at_seq is None else body.at_seq
            if at_seq > leaf:
                raise invalid("at_seq", f"the active path ends at seq {leaf}")
            new_id = body.id or f"ses_{uuid.uuid4().hex}"
            if await session_row.exists(driver, self.tenant_id, new_id):
                raise Conflict(f"session {new_id!r} already exists")
            family, path = state.family_id, state.path
            landing = await branches.landing_at(
                driver, self.tenant_id, family, path.branch_of(at_seq), at_seq, placed=True
            )
            if landing is None:  # pragma: no cover - every seq of a path has its entry
                raise invalid("at_seq", f"no entry at seq {at_seq}")
            prefix = path.prefix(at_seq)
            try:
                async with driver.transaction():  # a savepoint: the 409 leaves the lock
                    await session_row.insert_fork(
                        driver,
                        self.tenant_id,
                        source_id,
                        new_id,
                        metadata=body.metadata,
                        path=prefix,
                        now=datetime.now(UTC),
                        parent_id=parent_id,
                    )
            except asyncpg.UniqueViolationError:  # a create of the same id came first
                raise Conflict(f"session {new_id!r} already exists") from None
            fork_state = await read_state(driver, self.tenant_id, new_id)
            assert fork_state is not None
            unit = Unit(driver, self.tenant_id, new_id, fork_state)
            start = (
                state.context_start_seq
                if at_seq == leaf
                else (
                    await branches.pivot_at(
                        driver, self.tenant_id, OnPath(source_id, family, path), at_seq
                    )
                ).start_seq
            )
            # The fork's context is the source's as it was at that entry, outputs
            # hidden as they were.
            await LogRepository(self.tenant_id).copy_marks(
                driver, OnPath(source_id, family, path), new_id, start, at_seq + 1
            )
            await move_leaf(unit, landing, prefix, same_as=state)
            document = await session_document(driver, self.tenant_id, new_id)
            await self._keep(driver, source_id, idempotency_key, digest, 201, document)
        return document, False

    # --- idempotency ------------------------------------------------------------------

    async def _replay(
        self, driver: Driver, session_id: str, key: str | None, digest: str
    ) -> tuple[dict[str, Any], int] | None:
        if key is None:
            return None
        record = await idempotency.read(driver, self.tenant_id, session_id, key)
        if record is None:
            return None
        if record.request_hash != digest:
            raise UnprocessableContent(
                f"Idempotency-Key {key!r} was already used with a different request",
                errors=[{"field": "Idempotency-Key", "detail": "reused with a different request"}],
            )
        return record.response, record.status_code

    async def _keep(
        self,
        driver: Driver,
        session_id: str,
        key: str | None,
        digest: str,
        status_code: int,
        document: dict[str, Any],
    ) -> None:
        if key is not None:
            await idempotency.keep(
                driver, self.tenant_id, session_id, key, digest, status_code, document
            )
