"""Recall: search over the whole history of a session, compacted and pruned entries,
other branches and tool outputs included (the SQL is app.recall.repository's, the
text it searches app.engine.search_text's)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import uuid

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions.service import CompactionService
from app.core.database import driver_connection
from app.core.errors import Conflict, NotFound, invalid
from app.engine import search_text, tree
from app.recall import repository
from app.recall.schemas import (
    MAX_QUERY_CHARS,
    MAX_TOOL_NAME_CHARS,
    MAX_TOOLS,
    SearchHit,
    SearchPage,
    SearchQuery,
)
from app.store import branches
from app.store import search_index as indexer
from app.store.paths import OnPath
from app.store.session_row import SessionState, read_state

# How many matching entries each source (words, substring) ranks at most: what bounds
# a search's work whatever the query (see app.recall.repository).
MAX_RANKED = 1_000


def _digest(query: SearchQuery) -> str:
    """What a cursor is bound to: the query and its filters."""
    raw = orjson.dumps(
        [
            query.q,
            query.roles,
            query.kinds,
            query.tools,
            query.from_seq,
            query.to_seq,
            str(query.compaction),
        ]
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def encode_cursor(query: SearchQuery, score: float, seq: int, branch: int) -> str:
    raw = orjson.dumps([score, seq, branch, _digest(query)])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(query: SearchQuery, cursor: str) -> tuple[float, int, int]:
    """The last hit of the page before (score, seq, branch); 422 for a cursor this
    service did not issue for this same query and filters."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        score, seq, branch, digest = orjson.loads(raw)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise invalid("cursor", "is not a cursor this service issued") from None
    if digest != _digest(query):
        raise invalid("cursor", "was issued for another query or other filters")
    if not (
        isinstance(score, float | int)
        and not isinstance(score, bool)
        and math.isfinite(score)
        and all(isinstance(v, int) and 0 <= v <= tree.OPEN for v in (seq, branch))
    ):
        raise invalid("cursor", "is not a cursor this service issued")
    return float(score), seq, branch


def _compacted(state: SessionState, seq: int, kind: str, on_path: bool) -> bool:
    """Not in the current context: off the active path, before the context's start on
    it (but for the entries the context keeps from there, system and pinned ones), or
    a summary that a later one replaced."""
    if not on_path:
        return True
    if kind == "compaction":
        return seq != state.summary_seq
    return seq < state.context_start_seq and seq not in state.pinned_seqs


class RecallService:
    """Search over one tenant's sessions."""

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def search(self, session_id: str, query: SearchQuery) -> SearchPage:
        """A page of the entries of the session's tree that match ``query.q``, best
        first: the branches it writes and the path it was forked from, every entry
        (compacted, pruned, on another branch) as stored, within the filters."""
        read = search_text.read_query(query.q)
        if read is None or len(query.q) > MAX_QUERY_CHARS:
            raise invalid("q", f"must hold 1 to {MAX_QUERY_CHARS} characters besides spaces")
        if len(query.tools) > MAX_TOOLS:
            raise invalid("tool", f"names at most {MAX_TOOLS} tools")
        if any(not 1 <= len(name) <= MAX_TOOL_NAME_CHARS for name in query.tools):
            raise invalid("tool", f"a tool's name has 1 to {MAX_TOOL_NAME_CHARS} characters")
        if (
            query.from_seq is not None
            and query.to_seq is not None
            and query.from_seq > query.to_seq
        ):
            raise invalid("to_seq", "is before from_seq")
        after = decode_cursor(query, query.cursor) if query.cursor else None
        replaced = None
        if query.compaction is not None:
            replaced = await self._replaced(session_id, query.compaction)
        async with (
            driver_connection(self.engine) as driver,
            # One snapshot: the tree and the path the hits are placed on are the ones
            # the search read.
            driver.transaction(isolation="repeatable_read", readonly=True),
        ):
            state = await read_state(driver, self.tenant_id, session_id)
            if state is None:
                raise NotFound(f"session {session_id!r} does not exist")
            family = state.family_id
            base = await branches.first_branch_path(driver, self.tenant_id, family, session_id)
            base_branches, base_ends = ([], []) if base is None else base.segments(1, tree.OPEN)
            scope = repository.Scope(
                owned=await repository.owned_branches(driver, self.tenant_id, family, session_id),
                base_branches=base_branches,
                base_ends=base_ends,
                roles=list(query.roles) or None,
                kinds=list(query.kinds) or None,
                tools=list(query.tools) or None,
                from_seq=query.from_seq,
                to_seq=query.to_seq,
                replaced=replaced,
            )
            found = await repository.search(
                driver,
                self.tenant_id,
                family,
                scope,
                read,
                cap=MAX_RANKED,
                limit=query.limit + 1,
                after=after,
            )
            pending = await driver.fetchval(indexer.PENDING_SQL, family, self.tenant_id)
        rows = found.hits[: query.limit]
        path, leaf = state.path, state.next_seq - 1
        hits = []
        for row in rows:
            on_path = 1 <= row.seq <= leaf and path.branch_of(row.seq) == row.branch
            shown = search_text.snippet(
                row.text or "",
                read.literal if row.exact else read.words,
                exact=row.exact,
                pattern=read.pattern,
            )
            hits.append(
                SearchHit(
                    id=row.id,
                    seq=row.seq,
                    branch=row.branch,
                    role=row.role,
                    kind=row.kind,
                    tool_name=row.tool_name,
                    on_path=on_path,
                    compacted=_compacted(state, row.seq, row.kind, on_path),
                    score=row.score,
                    snippet=shown,
                )
            )
        more = len(found.hits) > query.limit
        last = rows[-1] if rows else None
        return SearchPage(
            hits=hits,
            complete=found.complete and not pending,
            pending=pending,
            next_cursor=encode_cursor(query, last.score, last.seq, last.branch)
            if more and last is not None
            else None,
        )

    async def _replaced(
        self, session_id: str, compaction_id: uuid.UUID
    ) -> tuple[tree.Path, int, int]:
        """The entries a compaction replaced, as GET …/compactions/{id}/source reads
        them: the seqs of the path to its summary from where its window started (the
        pivot of the compaction before it on that path, else 1) to its first kept
        entry. 404: no such compaction; 409: it replaced nothing."""
        job = await CompactionService(self.engine, self.tenant_id).get(session_id, compaction_id)
        if job.reason == "branch_summary":
            raise Conflict(
                f"compaction {compaction_id} is a branch summary: it replaced no entry of its "
                "path (search its abandoned branch by seq range instead)"
            )
        if job.status != "succeeded" or job.first_kept_seq is None or job.entry_seq is None:
            raise Conflict(f"compaction {compaction_id} is {job.status}: it replaced nothing")
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, self.tenant_id, session_id)
            family = session_id if state is None else state.family_id
            path = await branches.path_to_compaction(driver, self.tenant_id, family, compaction_id)
            if path is None:
                raise Conflict(f"compaction {compaction_id} wrote no summary: it replaced nothing")
            before = await branches.pivot_at(
                driver, self.tenant_id, OnPath(session_id, family, path), job.entry_seq - 1
            )
        return path, before.start_seq, job.first_kept_seq
