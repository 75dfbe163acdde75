"""API models for the tree: its page, a navigation and a fork."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.sessions.schemas import SessionId, SessionOut, Strict

SeqInt = Field(ge=1, le=2**62)


class TreeEntry(BaseModel):
    id: uuid.UUID
    seq: int = Field(description="The entry's depth on its path (the first entry is 1).")
    branch: int = Field(description="The run of seqs that holds it (0: the first).")
    parent_id: uuid.UUID | None = Field(description="The previous entry on its path.")
    kind: str = Field(description="message, compaction, continue or branch_summary.")
    role: str
    label: str = Field(description="The start of its text, or the tools it calls.")
    tokens: int
    pinned: bool
    children: int = Field(description="Entries of this session's tree that follow it.")
    on_path: bool = Field(description="On the path from the root to the active leaf.")
    leaf: bool = Field(description="The active leaf: appends go after it.")


class PathSegment(BaseModel):
    branch: int
    from_seq: int
    to_seq: int


class TreePage(BaseModel):
    entries: list[TreeEntry]
    leaf_seq: int = Field(description="The active leaf's seq (0: the session is empty).")
    leaf_id: uuid.UUID | None
    path: list[PathSegment] = Field(
        description="The active path from the root to the leaf, as runs of seqs per branch."
    )
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")


class NavigateRequest(Strict):
    entry_id: uuid.UUID | None = Field(
        None, description="The entry to move the leaf to, anywhere in the session's tree."
    )
    seq: int | None = Field(
        None, ge=1, le=2**62, description="Or: the entry at this seq of the active path."
    )
    summarize: bool | None = Field(
        None,
        description="Summarize the abandoned branch (the old leaf back to the common "
        "ancestor) into a branch summary entry after the target, written by the worker; "
        "the leaf moves when it is written. Default: the session's branch_summary.enabled.",
    )
    instructions: str | None = Field(
        None, max_length=20_000, description="What the branch summary should focus on."
    )

    @model_validator(mode="after")
    def _one_target(self) -> NavigateRequest:
        if (self.entry_id is None) == (self.seq is None):
            raise ValueError("give exactly one of entry_id and seq")
        return self


class BranchSummaryOut(BaseModel):
    id: uuid.UUID = Field(description="The job, a compaction of reason branch_summary.")
    status: str
    abandoned_from_seq: int
    abandoned_to_seq: int


class NavigateResponse(BaseModel):
    status: Literal["moved", "unchanged", "pending"] = Field(
        description="moved: the leaf is the target now; unchanged: it was already; "
        "pending: a branch summary is being written, and the leaf moves once it is."
    )
    session: SessionOut
    leaf_seq: int
    leaf_id: uuid.UUID | None
    abandoned_seqs: int = Field(description="Entries of the old path the new one leaves.")
    branch_summary: BranchSummaryOut | None = None


class ForkRequest(Strict):
    at_seq: int | None = Field(
        None,
        ge=1,
        le=2**62,
        description="The entry of the source's active path the fork "
        "ends at (its leaf); default: the source's leaf.",
    )
    id: SessionId | None = Field(None, description="The new session's id; generated when absent.")
    metadata: dict[str, Any] | None = Field(
        None, description="The new session's metadata; default: the source's."
    )
