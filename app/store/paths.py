"""Where a session's log is read: the tree's key condition "on the path"
(app.engine.tree) spelled in SQL, and :class:`OnPath`, what a read of a path takes.
Every module of the store that reads entries, marks or calls of a path uses these."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine import tree
from app.store.session_row import SessionState

_OPEN = f"{tree.OPEN}::bigint"


def on_path(alias: str, branches: str, ends: str, seq: str = "seq") -> str:
    """The key condition "on the path": the row's branch is one of ``branches``
    and its seq at most that branch's end in ``ends`` (SQL array expressions). A
    branch's own entries start after its fork point, so no lower end is needed."""
    a = f"{alias}." if alias else ""
    return (
        f"{a}branch = ANY({branches})"
        f" AND {a}{seq} <= ({ends})[array_position({branches}, {a}branch)]"
    )


def on_session_path(alias: str, seq: str = "seq") -> str:
    """:func:`on_path` for the path of the session row ``s`` of the same statement."""
    return on_path(alias, "s.path_branches", f"(s.path_ends || {_OPEN})", seq)


@dataclass(frozen=True, slots=True)
class OnPath:
    """Where a session's log is read: its own id (its prune marks are its own),
    its family's (where the entries are stored) and the path it follows."""

    session_id: str
    family_id: str
    path: tree.Path

    @classmethod
    def of(cls, session_id: str, state: SessionState) -> OnPath:
        return cls(session_id, state.family_id, state.path)

    def args(self, lo: int, hi: int = tree.OPEN) -> tuple[list[int], list[int]]:
        """The arrays :func:`on_path` takes for the path's seqs ``lo <= seq < hi``."""
        return self.path.segments(lo, hi)
