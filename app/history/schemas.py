"""API models for reading the stored history back."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from fastapi import Query
from pydantic import BaseModel, Field

Format = Literal["openai", "anthropic"]
FORMATS: frozenset[str] = frozenset(get_args(Format))

FORMAT_DESCRIPTION = (
    "The wire format: openai (chat completions messages) or anthropic (Messages API "
    "blocks). Every route with a format takes it as this query parameter."
)
# ``?format=`` on every route that reads or writes messages in a wire format.
FormatQuery = Annotated[Format, Query(description=FORMAT_DESCRIPTION)]


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
