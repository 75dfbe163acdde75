"""API models for compactions and their archive."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.history.schemas import HistoryEntry

CompactionStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
CompactionReason = Literal["manual", "threshold", "overflow", "emergency"]
Status = CompactionStatus
Reason = CompactionReason


class CompactionStarted(BaseModel):
    """The compaction an append, usage report or provider error started."""

    id: uuid.UUID
    status: CompactionStatus
    reason: CompactionReason
    created: bool = Field(description="False when the session already had one queued or running.")


Strategy = Literal["structured", "narrative"]
Summarizer = Literal["llm", "extractive"]

MAX_INSTRUCTIONS_CHARS = 10_000
MAX_WAIT_SECONDS = 120.0


class CompactionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instructions: str | None = Field(
        None,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description=f"Extra focus for the summary, at most {MAX_INSTRUCTIONS_CHARS} characters.",
    )
    strategy: Strategy | None = Field(None, description="Default: the session config's.")
    summarizer: Summarizer | None = Field(
        None, description="Default: the session config's (extractive when no upstream is set)."
    )
    model: str | None = Field(
        None, min_length=1, max_length=200, description="The summarizer model for this one."
    )
    wait: float = Field(
        0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Seconds to wait for the compaction to finish before answering.",
    )


class CompactionDetails(BaseModel):
    read_files: list[str] = Field(default_factory=list)
    modified_files: list[str] = Field(default_factory=list)
    split_turn: bool = Field(
        False, description="The cut fell inside a turn: its start has a summary of its own."
    )
    summarized_entries: int | None = None
    summarized_tokens: int | None = None
    kept_tokens: int | None = Field(None, description="Tokens kept verbatim after the cut.")
    continued: bool = Field(
        False, description="A synthetic 'Continue if you have next steps.' followed it."
    )
    notes: list[str] = Field(
        default_factory=list, description="Why the upstream was not (fully) used, and retries."
    )


class CompactionOut(BaseModel):
    id: uuid.UUID
    session_id: str
    status: Status
    reason: Reason
    auto: bool
    strategy: Strategy
    summarizer: Summarizer = Field(description="As requested.")
    summarizer_used: Summarizer | None = Field(description="What made the summary.")
    attempts: int
    cancel_requested: bool
    summary: str | None
    short_summary: str | None
    first_kept_seq: int | None = Field(description="The first entry the context keeps verbatim.")
    entry_seq: int | None = Field(description="The compaction's own entry in the history.")
    tokens_before: int | None = Field(description="Estimated context tokens before.")
    tokens_after: int | None = Field(description="Estimated context tokens after.")
    details: CompactionDetails | None
    error: str | None
    upstream_model: str | None
    upstream_usage: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    next_attempt_at: datetime | None = Field(description="When a queued retry may run.")


class CompactionPage(BaseModel):
    compactions: list[CompactionOut]
    next_cursor: str | None


class SourcePage(BaseModel):
    compaction_id: uuid.UUID
    entries: list[HistoryEntry]
    next_after_seq: int | None = Field(
        description="Pass as after_seq for the next page; null on the last."
    )
