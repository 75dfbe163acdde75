"""The shapes of compactd's answers, as the JSON arrives (times are ISO 8601 strings,
ids are strings). Messages stay plain dicts: OpenAI or Anthropic messages as the
provider's SDK has them."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

Format = Literal["openai", "anthropic"]
Message = dict[str, Any]
Action = Literal["none", "prune", "compact", "emergency"]
CompactionStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
CompactionReason = Literal["manual", "threshold", "overflow", "emergency"]
Strategy = Literal["structured", "narrative"]
Summarizer = Literal["llm", "extractive"]
UsageFormat = Literal["native", "openai_chat", "openai_responses", "anthropic", "gemini"]


class Health(TypedDict):
    status: str


class Readiness(TypedDict):
    status: str
    database: str
    migration: str


class Session(TypedDict):
    id: str
    model: str
    context_window: int
    max_output_tokens: int
    input_limit: int | None
    usable_tokens: int
    model_known: bool
    config: dict[str, Any]
    metadata: dict[str, Any]
    entry_count: int
    stored_tokens: int
    context_tokens: int
    overhead_tokens: int
    calibration_factor: float
    last_usage: dict[str, Any] | None
    usage_count: int
    pruned_tokens: int
    prune_count: int
    compaction_count: int
    active_compaction_id: str | None
    compaction_failures: int
    auto_compaction: Literal["on", "off", "held", "stopped"]
    version: int
    created_at: str
    updated_at: str


class SessionChanges(TypedDict, total=False):
    """A PATCH: the keys present change; the others stay."""

    model: str
    context_window: int
    max_output_tokens: int
    input_limit: int | None
    config: dict[str, Any]
    metadata: dict[str, Any]


class SessionPage(TypedDict):
    sessions: list[Session]
    next_cursor: str | None


class Verdict(TypedDict):
    estimated_tokens: int
    usable_tokens: int
    threshold_tokens: int
    fraction: float
    calibration_factor: float
    overflow: bool
    action: Action


class PrunedEntry(TypedDict):
    seq: int
    tool_name: str | None
    tokens: int


class PruneResult(TypedDict):
    dry_run: bool
    pruned: list[PrunedEntry]
    tokens_saved: int
    candidate_tokens: int
    protected_tokens: int
    reason: str | None
    version: int
    overflow: Verdict


class CompactionStarted(TypedDict):
    id: str
    status: CompactionStatus
    reason: CompactionReason
    created: bool


class StoredEntry(TypedDict):
    id: str
    seq: int
    role: str
    tokens: int


class AppendResult(TypedDict):
    entries: list[StoredEntry]
    version: int
    context_tokens: int
    overflow: Verdict
    pruned: PruneResult | None
    compaction: CompactionStarted | None


class HistoryEntry(TypedDict):
    id: str
    seq: int
    kind: str
    role: str
    tokens: int
    source_format: Format
    tool_name: str | None
    created_at: str
    pruned_at: str | None
    erased_bytes: int | None
    omitted_lines: int | None
    omitted_bytes: int | None
    message: Message


class HistoryPage(TypedDict):
    entries: list[HistoryEntry]
    next_after_seq: int | None


class TokenBreakdown(TypedDict):
    summary: int
    messages: int
    tool_outputs: int
    overhead: int


class ContextTokens(TypedDict):
    estimated: int
    budget: int
    fraction: float
    breakdown: TokenBreakdown


class Context(TypedDict):
    format: Format
    messages: list[Message]
    system: list[dict[str, Any]] | None
    tokens: ContextTokens
    state: Literal["ok", "prune", "compact", "overflow"]
    compaction: dict[str, Any] | None
    version: int


class UsageResult(TypedDict):
    calibration_factor: float
    reported_prompt_tokens: int | None
    overhead_tokens: int
    version: int
    overflow: Verdict
    pruned: PruneResult | None
    compaction: CompactionStarted | None
    stale: bool
    usage_format: UsageFormat


class Recovery(TypedDict):
    action: Literal["prune", "compact", "none"]
    pruned: PruneResult | None
    compaction: CompactionStarted | None
    stale: bool


class ProviderErrorVerdict(TypedDict):
    overflow: bool
    provider: str | None
    pattern: str | None
    requested_tokens: int | None
    limit_tokens: int | None
    recovery: Recovery | None
    verdict: Verdict


class Compaction(TypedDict):
    id: str
    session_id: str
    status: CompactionStatus
    reason: CompactionReason
    auto: bool
    strategy: Strategy
    summarizer: Summarizer
    summarizer_used: Summarizer | None
    attempts: int
    cancel_requested: bool
    summary: str | None
    short_summary: str | None
    first_kept_seq: int | None
    entry_seq: int | None
    tokens_before: int | None
    tokens_after: int | None
    details: dict[str, Any] | None
    error: str | None
    upstream_model: str | None
    upstream_usage: dict[str, Any] | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    next_attempt_at: str | None


class CompactionPage(TypedDict):
    compactions: list[Compaction]
    next_cursor: str | None


class SourcePage(TypedDict):
    compaction_id: str
    entries: list[HistoryEntry]
    next_after_seq: int | None
