"""API models for appending and reading the stored history."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.budget.schemas import PruneResult, Verdict
from app.compactions.schemas import CompactionStarted
from app.history.schemas import Format


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
