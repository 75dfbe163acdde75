"""API models for the context the agent sends to its model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.history.schemas import Format


class TokenBreakdown(BaseModel):
    summary: int
    messages: int
    tool_outputs: int
    overhead: int


class ContextTokens(BaseModel):
    estimated: int = Field(description="Estimated prompt tokens of this context, calibrated.")
    budget: int = Field(description="The usable input budget of the session's model.")
    fraction: float
    breakdown: TokenBreakdown


class ContextOut(BaseModel):
    format: Format
    messages: list[dict[str, Any]]
    system: list[dict[str, Any]] | None = Field(
        None, description="Anthropic format only: the top-level system blocks."
    )
    tokens: ContextTokens
    state: Literal["ok", "prune", "compact", "overflow"]
    compaction: dict[str, Any] | None = Field(
        None, description="The active compaction pivot, if any."
    )
    version: int
