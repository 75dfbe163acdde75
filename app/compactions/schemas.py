"""API models for compactions and their archive."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.history.schemas import HistoryEntry
from app.sessions.schemas import SummarizerUsage

CompactionStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
CompactionReason = Literal["manual", "threshold", "overflow", "emergency", "branch_summary"]
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


class QuotedRequest(BaseModel):
    seq: int = Field(description="The request's entry in the history.")
    text: str = Field(description="As quoted: as written, or clipped.")
    clipped: bool = Field(False, description="Cut to fit the budget (whole lines kept).")


class FirstRequest(QuotedRequest):
    pinned: bool = Field(
        False, description="Pinned on append: the context holds it, so it is not quoted."
    )


class UserRequests(BaseModel):
    """The user's requests the summary quotes verbatim, carried to the next compaction."""

    first: FirstRequest | None = Field(
        None, description="The session's first request; null until a compaction summarized it."
    )
    later: list[QuotedRequest] = Field(
        default_factory=list, description="The latest requests quoted, oldest first."
    )
    omitted: int = Field(0, description="Requests since the first that are not quoted.")
    budget_tokens: int = Field(0, description="The block's budget (keep_requests_tokens, capped).")
    tokens: int = Field(0, description="What the block takes, counted.")


class UnresolvedError(BaseModel):
    """The latest error of the history no later result resolved."""

    line: str = Field(description="The error's line, as the output wrote it.")
    command: str = Field("", description="The command that produced it, on one line.")


class GateItems(BaseModel):
    """Anchors of the task, by kind."""

    terms: list[str] = Field(default_factory=list, description="Key terms of the task.")
    files: list[str] = Field(default_factory=list, description="Modified files, by path.")
    error: str | None = Field(None, description="The latest unresolved error's line.")


class GateChecked(BaseModel):
    terms: int = Field(0, description="How many task terms were checked.")
    files: int = Field(0, description="How many modified files were checked.")
    error: str | None = Field(None, description="The unresolved error checked, if any.")


class ContinuityGate(BaseModel):
    """What the continuity gate found before the commit: what the summary (with the
    context's kept window) did not name of the task's key terms, the modified files
    and the latest unresolved error, and what became of it."""

    checked: GateChecked = Field(default_factory=GateChecked)
    missing_before: GateItems = Field(
        default_factory=GateItems, description="Not named by the summary as first written."
    )
    retried: bool = Field(
        False, description="A model's summary was asked for again, with the missing named."
    )
    retry_missing: GateItems | None = Field(
        None, description="What the summary asked for again still did not name."
    )
    retry_error: str | None = Field(None, description="Why the second ask gave nothing.")
    completed: GateItems = Field(
        default_factory=GateItems,
        description="Named by the <continuity-anchors> block the summary was completed with.",
    )
    trimmed: GateItems = Field(
        default_factory=GateItems,
        description="Left out of the block so that the compaction still makes the context smaller.",
    )
    missing_after: GateItems = Field(
        default_factory=GateItems,
        description="Still not named: beyond the block's size cap, or trimmed.",
    )


class BranchNavigation(BaseModel):
    """Where a navigation with a branch summary started and where it goes: the old
    path (as branch segments) and its next seq, the deepest entry it shares with the
    new one, and the target entry (its branch and seq) with the path to it."""

    from_branches: list[int]
    from_ends: list[int]
    from_next_seq: int
    common_seq: int
    target_branch: int
    target_seq: int
    target_branches: list[int]
    target_ends: list[int]


class DroppedValues(BaseModel):
    """One kind of specifics the summarized entries named."""

    count: int = Field(0, description="How many distinct values of this kind they named.")
    first: list[str] = Field(
        default_factory=list,
        description="The first of them (20 at most), in the order they first appear, as "
        "written (cut to 200 characters).",
    )
    seqs: list[list[int]] | None = Field(
        None,
        description="Beside `first`, item for item: the seqs of the entries that hold each "
        "value (the first 3 of them), on the compaction's path, so that `history_read` "
        "with `from_seq` and `to_seq` opens the exact place. Null for a branch summary "
        "(its entries are on the branch it left) and for a compaction made before it was "
        "recorded.",
    )


class DroppedIndex(BaseModel):
    """What left the context with this compaction: the specifics the entries it
    summarized named, by kind. The archive (``…/source``) holds them all."""

    paths: DroppedValues = Field(
        default_factory=DroppedValues,
        description="Files the tool calls read or changed, and words that look like paths.",
    )
    commands: DroppedValues = Field(
        default_factory=DroppedValues,
        description="Command lines the shell tool calls ran (here-document bodies left out).",
    )
    errors: DroppedValues = Field(
        default_factory=DroppedValues,
        description="Lines that say what went wrong in the tool results that failed and in "
        "errors the user pasted.",
    )
    identifiers: DroppedValues = Field(
        default_factory=DroppedValues,
        description="snake_case, camelCase and dotted names (not plain words).",
    )
    numbers: DroppedValues = Field(
        default_factory=DroppedValues,
        description="Specific numbers: versions, ports, ids and hashes, measurements with "
        "a unit; not bare small integers.",
    )
    urls: DroppedValues = Field(default_factory=DroppedValues, description="URLs.")
    truncated: bool = Field(
        False,
        description="Some long entries were read in part (their head and end) or not at "
        "all: the counts are of what was read.",
    )


class HookCall(BaseModel):
    webhook_id: str
    point: str = Field(description="`compaction.before` or `navigation.before`.")
    outcome: Literal[
        "proceeded", "customized", "summary", "cancelled", "timeout", "error", "invalid"
    ]
    status: int | None = Field(description="The hook's HTTP status (none: no answer).")
    elapsed_ms: float
    error: str | None = None
    applied: str | None = Field(None, description="What applied instead, when it failed.")


class VerbatimMessage(BaseModel):
    seq: int
    role: Literal["user", "assistant"]
    text: str


class VerbatimPointer(BaseModel):
    seq: int = Field(description="The tool output's entry: history_read from_seq=seq to_seq=seq.")
    line: str


class VerbatimBlock(BaseModel):
    """What a ``verbatim_first`` compaction kept as written (docs/how-it-works.md)."""

    messages: list[VerbatimMessage] = Field(
        default_factory=list, description="User and assistant text kept whole, oldest first."
    )
    pointers: list[VerbatimPointer] = Field(
        default_factory=list, description="One line per old tool output, oldest first."
    )
    omitted_pointers: int = Field(0, description="Older tool outputs counted, without a line.")
    omitted_from: int | None = None
    omitted_to: int | None = None
    budget_tokens: int = Field(0, description="The block's cap: verbatim_share of the window.")
    tokens: int = Field(0, description="The block's tokens, as counted.")


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
    pinned_entries: int | None = Field(
        None, description="Entries before the cut the context keeps: system and pinned ones."
    )
    user_requests: UserRequests | None = Field(
        None, description="The user's requests the summary ends with, verbatim."
    )
    task_terms: list[str] | None = Field(
        None, description="The first request's key terms, carried to the next compaction."
    )
    unresolved_error: UnresolvedError | None = Field(
        None, description="The latest unresolved error before the cut, carried until resolved."
    )
    working_directory: str | None = Field(
        None, description="The working directory the history states, if it states one."
    )
    gate: ContinuityGate | None = Field(
        None, description="What the continuity gate found and did before the commit."
    )
    abandoned_entries: int | None = Field(
        None,
        description="A branch summary: the entries of the branch the navigation left "
        "(the newest of them, summarized_entries, were read within the budget).",
    )
    navigation: BranchNavigation | None = Field(
        None, description="A branch summary: the navigation it belongs to."
    )
    dropped: DroppedIndex | None = Field(
        None,
        description="What left the context: the paths, commands, error lines, identifiers, "
        "numbers and URLs the summarized entries named (counts and the first of each); "
        "null for a compaction made before it was recorded.",
    )
    hooks: list[HookCall] | None = Field(
        None, description="The blocking hooks called before it, and what each did (docs/events.md)."
    )
    from_hook: bool = Field(
        False, description="A hook supplied the whole summary (seed 001's fromExtension)."
    )
    hook_details: dict[str, Any] | None = Field(
        None, description="The details the hook gave with the summary it supplied."
    )
    preserve: dict[str, Any] | None = Field(
        None, description="Data a hook asked to keep on this compaction."
    )
    policy: Literal["summarize", "verbatim_first"] | None = Field(
        None, description="The session's compaction policy when it was made (null: summarize)."
    )
    verbatim: VerbatimBlock | None = Field(
        None, description="Under verbatim_first: the text kept as written and the pointers."
    )


class CompactionUsage(SummarizerUsage):
    """A compaction's summarizer usage, and the model that wrote its summary."""

    model: str | None = Field(
        description="The model that wrote the summary (`remote:<host>` for a remote "
        "endpoint); null when no model did."
    )


class UsageHour(SummarizerUsage):
    """The tenant's summarizer usage in the current hour of the clock (UTC)."""

    hour_start: datetime = Field(description="The hour's first instant, UTC.")
    limited_compactions: int = Field(
        description="Compactions the spend limit made extractive in this hour."
    )


class TenantUsage(BaseModel):
    """What compaction cost and saved the API key's tenant, since the start and in the
    current hour: counted as each compaction commits, never summed at read time."""

    summarizer: SummarizerUsage = Field(
        description="The summarizer's requests and tokens for the tenant's compactions and "
        "branch summaries."
    )
    compactions: int = Field(description="Compactions committed (emergency ones included).")
    saved_tokens: int = Field(
        description="Context tokens those compactions removed (`tokens_before - "
        "tokens_after`, summed)."
    )
    limited_compactions: int = Field(
        description="Compactions that used the extractive summarizer because the tenant had "
        "reached its hourly spend limit."
    )
    current_hour: UsageHour
    tokens_per_hour_limit: int | None = Field(
        description="COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR as this server process has it "
        "(input + output tokens per hour; the workers' setting is what applies); null: no "
        "limit."
    )
    updated_at: datetime | None = Field(
        description="When a compaction last added to these figures; null before the first."
    )


class CompactionOut(BaseModel):
    id: uuid.UUID
    session_id: str
    status: Status
    reason: Reason
    auto: bool
    strategy: Strategy
    summarizer: Summarizer = Field(description="As requested.")
    summarizer_used: Literal["llm", "extractive", "hook"] | None = Field(
        description="What made the summary (`hook`: a blocking hook supplied it)."
    )
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
    upstream_usage: dict[str, Any] | None = Field(
        description="The upstream's usage as reported, summed over the compaction's "
        "summarizer requests: `input_tokens`, `output_tokens`, and `cache_read_tokens`, "
        "`cache_write_tokens`, `reasoning_tokens` when reported; null when none reported any. "
        "`usage` is the same in a fixed shape, with the requests counted."
    )
    usage: CompactionUsage = Field(
        description="What its summarizer requests took (all of them: the history's, the "
        "split turn's, the continuity gate's second ask, the short title, a model that failed "
        "before the next candidate or the extractive fallback, and the summaries of a plan "
        "made again); zeros when none was asked. Counted in the session's `compaction_cost` "
        "and the tenant's `GET /v1/usage` when the compaction ends."
    )
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
