"""API models for usage reports, pruning and provider errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.compactions.schemas import CompactionStarted
from app.sessions.schemas import Strict

# No prompt is larger than this; anything above is a client bug, not a usage figure.
MAX_REPORTED_TOKENS = 100_000_000
TokenFigure = Field(0, ge=0, le=MAX_REPORTED_TOKENS)


class Verdict(BaseModel):
    """How full the window is, from running totals, and what to do about it."""

    estimated_tokens: int
    usable_tokens: int
    threshold_tokens: int
    fraction: float
    calibration_factor: float
    overflow: bool
    action: Literal["none", "prune", "compact", "emergency"]


class UsageReport(Strict):
    """The usage the provider reported for the last model call.

    Send it right after the call, before appending the reply: the prompt it
    measures is then exactly the context the session holds. The prompt size is
    ``input_tokens + cache_read_tokens + cache_write_tokens`` (Anthropic's
    figures as they come; for OpenAI, whose ``prompt_tokens`` already include
    cached tokens, send ``prompt_tokens`` as ``input_tokens`` and no cache figures).
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"input_tokens": 1834, "output_tokens": 212, "cache_read_tokens": 12000}]
        },
    )

    input_tokens: int = Field(ge=0, le=MAX_REPORTED_TOKENS)
    output_tokens: int = TokenFigure
    cache_read_tokens: int = TokenFigure
    cache_write_tokens: int = TokenFigure
    tools_tokens: int | None = Field(
        None,
        ge=0,
        le=MAX_REPORTED_TOKENS,
        description="Tokens the tool schemas and other unstored text add to each request.",
    )
    context_version: int | None = Field(
        None,
        ge=0,
        description="The `version` of the context this call sent (from GET /context). "
        "Without it, the report is about the last context GET /context served that no "
        "report has measured yet (so it may come after the reply's append). A report "
        "about a context that a compaction has since replaced is recorded but neither "
        "calibrates nor triggers anything (`stale` in the answer); one about a context "
        "whose compaction was queued since starts no other.",
    )
    finish_reason: str | None = Field(
        None,
        max_length=64,
        description="The provider's finish or stop reason for the reply (stop, end_turn, "
        "tool_calls, length...). After an automatic compaction, no synthetic 'continue' "
        "message follows a reply that ended on its own.",
    )
    tools: list[dict[str, Any]] | None = Field(
        None,
        max_length=2000,
        description="The tool schemas sent with each request, counted here when "
        "tools_tokens is not given.",
    )


class PrunedEntry(BaseModel):
    seq: int
    tool_name: str | None
    tokens: int = Field(description="Tokens the output took in the model's view.")


class PruneRequest(Strict):
    dry_run: bool = False
    protect_tokens: int | None = Field(None, ge=0, le=10_000_000)
    minimum_tokens: int | None = Field(None, ge=0, le=10_000_000)
    protect_turns: int | None = Field(None, ge=0, le=1000)


class PruneResult(BaseModel):
    dry_run: bool
    pruned: list[PrunedEntry] = Field(
        description="Outputs hidden (or that would be, on a dry run)."
    )
    tokens_saved: int
    candidate_tokens: int = Field(description="What pruning could save with no minimum.")
    protected_tokens: int = Field(description="Tool-output tokens kept in the protected window.")
    reason: str | None = Field(
        description="Why nothing was pruned: nothing_prunable, below_minimum or disabled."
    )
    version: int
    overflow: Verdict


class UsageResponse(BaseModel):
    calibration_factor: float
    reported_prompt_tokens: int | None = Field(
        description="The estimate's exact base: this report's prompt (null when a stale "
        "report left none since the last compaction)."
    )
    overhead_tokens: int
    version: int
    overflow: Verdict
    pruned: PruneResult | None = Field(description="The automatic prune this report started.")
    compaction: CompactionStarted | None = Field(
        None, description="The automatic compaction this report started."
    )
    stale: bool = Field(
        False,
        description="The report measured a context a compaction has replaced since: kept as "
        "the last usage only.",
    )


class ProviderError(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "status": 400,
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                }
            ]
        },
    )

    status: int | None = Field(None, ge=100, le=599, description="The provider's HTTP status.")
    context_version: int | None = Field(
        None,
        ge=0,
        description="The `version` of the context the refused call sent (from GET /context; "
        "without it, the last context served): an error about a context a compaction has "
        "since replaced starts no recovery.",
    )
    message: str = Field(
        max_length=1_000_000, description="The error message, or the whole error body as text."
    )


class Recovery(BaseModel):
    action: Literal["prune", "compact", "none"] = Field(
        description="compact: a compaction (reason overflow) was started; prune: only pruning "
        "was possible."
    )
    pruned: PruneResult | None
    compaction: CompactionStarted | None = None
    stale: bool = Field(
        False,
        description="The refused prompt was a context a compaction has replaced since: "
        "read the context again and retry.",
    )


class ProviderErrorVerdict(BaseModel):
    overflow: bool = Field(description="Whether the error is a context-window overflow.")
    provider: str | None
    pattern: str | None
    requested_tokens: int | None = Field(description="The prompt size the error states.")
    limit_tokens: int | None = Field(description="The context limit the error states.")
    recovery: Recovery | None
    verdict: Verdict
