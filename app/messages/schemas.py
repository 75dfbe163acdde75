"""API models for appending and reading the stored history."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.budget.schemas import CompactionStarted, PruneResult, Verdict

Format = Literal["openai", "anthropic"]


class AppendRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "format": "openai",
                    "messages": [
                        {"role": "user", "content": "List the files."},
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                                }
                            ],
                        },
                        {"role": "tool", "tool_call_id": "call_1", "content": "README.md\napp\n"},
                    ],
                }
            ]
        },
    )

    messages: list[dict[str, Any]] = Field(
        min_length=1,
        description="OpenAI chat messages, or Anthropic messages when format is anthropic.",
    )
    format: Format = "openai"


class StoredEntry(BaseModel):
    id: uuid.UUID
    seq: int
    role: str
    tokens: int


class AppendResponse(BaseModel):
    entries: list[StoredEntry]
    version: int = Field(description="The session's version after the append.")
    context_tokens: int
    overflow: Verdict
    pruned: PruneResult | None = Field(
        description="The automatic prune this append started, when the verdict asked for one."
    )
    compaction: CompactionStarted | None = Field(
        None,
        description="The automatic compaction this append started: queued (threshold), or "
        "already done (emergency).",
    )


class HistoryEntry(BaseModel):
    id: uuid.UUID
    seq: int
    kind: str
    role: str
    tokens: int
    source_format: Format
    tool_name: str | None
    created_at: datetime
    pruned_at: datetime | None = Field(
        description="When pruning hid this tool output from the model; it stays here."
    )
    erased_bytes: int | None = Field(
        description="Bytes of stored content cleared by pruning (prune.erase)."
    )
    omitted_lines: int | None = Field(
        description="Lines the model's view leaves out (ingest truncation); the message "
        "below is whole."
    )
    omitted_bytes: int | None
    message: dict[str, Any] = Field(description="The message as stored, in the requested format.")


class HistoryPage(BaseModel):
    entries: list[HistoryEntry]
    next_after_seq: int | None = Field(
        description="Pass as after_seq for the next page; null on the last."
    )
