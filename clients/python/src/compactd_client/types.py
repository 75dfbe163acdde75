"""The shapes of compactd's answers, as the JSON arrives (times are ISO 8601 strings,
ids are strings). Messages stay plain dicts: OpenAI or Anthropic messages as the
provider's SDK has them."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

Format = Literal["openai", "anthropic"]
Message = dict[str, Any]
Action = Literal["none", "prune", "compact", "emergency"]
CompactionStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
CompactionReason = Literal["manual", "threshold", "overflow", "emergency", "branch_summary"]
Strategy = Literal["structured", "narrative"]
Policy = Literal["summarize", "verbatim_first"]
Summarizer = Literal["llm", "extractive"]
UsageFormat = Literal["native", "openai_chat", "openai_responses", "anthropic", "gemini"]
OutputCategory = Literal["head_tail", "match_list", "file_content", "generic"]
NavigateStatus = Literal["moved", "unchanged", "pending"]
Role = Literal["system", "developer", "user", "assistant", "tool"]
EntryKind = Literal["message", "compaction", "continue", "branch_summary"]


class Health(TypedDict):
    status: str


class Readiness(TypedDict):
    status: str
    database: str
    migration: str


class CompactionConfig(TypedDict):
    enabled: bool
    auto: bool
    reserve_tokens: int
    threshold: float | None
    keep_recent_tokens: int
    keep_requests_tokens: int
    strategy: Strategy
    summarizer: Summarizer
    model: str | None
    # Summarizer models tried in order after the compaction's own, before extractive.
    models: list[str]
    # POST {systemPrompt, prompt} here for every summarizer request; {summary} back.
    remote_endpoint: str | None
    auto_continue: bool
    emergency_fraction: float
    instructions: str | None
    # summarize, or verbatim_first: user and assistant text kept as written within
    # verbatim_share of the window, tool outputs as pointers, only the rest summarized.
    policy: Policy
    verbatim_share: float


class BranchSummaryConfig(TypedDict):
    """How a navigation summarizes the branch it abandons."""

    enabled: bool  # navigations summarize unless they say otherwise
    reserve_tokens: int  # the summarizer reads the branch up to the window less this


class RecallConfig(TypedDict):
    """The recall tools (``get_tools``, ``run_tool_call``, and through the proxy)."""

    result_tokens: int  # the most a result holds unless the call says otherwise
    proxy_tools: bool  # proxied calls offer them, and compactd answers them itself


class PruneConfig(TypedDict):
    enabled: bool
    auto: bool
    protect_tokens: int
    minimum_tokens: int
    protect_turns: int
    protected_tools: list[str]
    placeholder: str
    erase: bool


class TruncateConfig(TypedDict):
    enabled: bool
    tool_result_token_cap: int
    categories: dict[str, OutputCategory]


class SessionConfig(TypedDict):
    """The session's config as it applies: every key, defaults filled in."""

    compaction: CompactionConfig
    branch_summary: BranchSummaryConfig
    recall: RecallConfig
    prune: PruneConfig
    truncate: TruncateConfig


class SessionWarning(TypedDict):
    """Something the service assumed for a session, and how to fix it."""

    code: Literal["unknown_model"]  # the model is in no catalog; its window is a default
    detail: str


class SummarizerUsage(TypedDict):
    """Summarizer requests (failed ones included) and the tokens reported for them."""

    calls: int
    input_tokens: int  # the whole prompt, cached parts included
    output_tokens: int
    cached_tokens: int  # prompt tokens read from the provider's cache


class Session(TypedDict):
    id: str
    parent_id: str | None  # the session this one is a side conversation of
    model: str
    context_window: int
    max_output_tokens: int
    input_limit: int | None
    usable_tokens: int
    model_known: bool
    config: SessionConfig
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
    compaction_cost: SummarizerUsage  # what compaction cost this session
    compaction_saved_tokens: int  # context tokens its compactions removed
    active_compaction_id: str | None
    compaction_failures: int
    auto_compaction: Literal["on", "off", "held", "stopped"]
    version: int
    created_at: str
    updated_at: str
    warnings: list[SessionWarning]  # empty when nothing was assumed


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


class QuotedRequest(TypedDict):
    seq: int
    text: str
    clipped: bool


class FirstRequest(QuotedRequest):
    pinned: bool


class UserRequests(TypedDict):
    first: FirstRequest | None
    later: list[QuotedRequest]
    omitted: int
    budget_tokens: int
    tokens: int


class UnresolvedError(TypedDict):
    line: str
    command: str


class GateItems(TypedDict):
    terms: list[str]
    files: list[str]
    error: str | None


class GateChecked(TypedDict):
    terms: int
    files: int
    error: str | None


class ContinuityGate(TypedDict):
    checked: GateChecked
    missing_before: GateItems
    retried: bool
    retry_missing: GateItems | None
    retry_error: str | None
    completed: GateItems
    trimmed: GateItems
    missing_after: GateItems


class BranchNavigation(TypedDict):
    """A branch summary's navigation: the old path (branches and where each ends),
    the deepest entry it shares with the new one, and the target with its path."""

    from_branches: list[int]
    from_ends: list[int]
    from_next_seq: int
    common_seq: int
    target_branch: int
    target_seq: int
    target_branches: list[int]
    target_ends: list[int]


class DroppedValues(TypedDict):
    count: int  # distinct values of the kind
    first: list[str]  # the first of them, in the order they appear
    # Item for item beside `first`: the seqs of the entries that hold it (history_read
    # from_seq=seq opens one); None for a branch summary or before it was recorded.
    seqs: list[list[int]] | None


class DroppedIndex(TypedDict):
    """What left the context with a compaction: the specifics it summarized, by kind."""

    paths: DroppedValues
    commands: DroppedValues
    errors: DroppedValues
    identifiers: DroppedValues
    numbers: DroppedValues
    urls: DroppedValues
    truncated: bool  # some long entries were read in part: counts of what was read


class HookCall(TypedDict):
    """One blocking hook's call and what came of it."""

    webhook_id: str
    point: str  # compaction.before | navigation.before
    outcome: str  # proceeded, customized, summary, cancelled, timeout, error, invalid
    status: int | None
    elapsed_ms: float
    error: str | None
    applied: str | None


class VerbatimMessage(TypedDict):
    seq: int
    role: Literal["user", "assistant"]
    text: str


class VerbatimPointer(TypedDict):
    seq: int  # the tool output's entry: history_read from_seq=seq to_seq=seq
    line: str


class VerbatimBlock(TypedDict):
    """What a ``verbatim_first`` compaction kept as written."""

    messages: list[VerbatimMessage]  # user and assistant text kept whole, oldest first
    pointers: list[VerbatimPointer]  # one line per old tool output, oldest first
    omitted_pointers: int  # older tool outputs counted, without a line
    omitted_from: int | None
    omitted_to: int | None
    budget_tokens: int  # the block's cap: verbatim_share of the window
    tokens: int  # the block's tokens, as counted


class CompactionDetails(TypedDict):
    read_files: list[str]
    modified_files: list[str]
    split_turn: bool
    summarized_entries: int | None
    summarized_tokens: int | None
    kept_tokens: int | None
    continued: bool
    notes: list[str]
    pinned_entries: int | None
    user_requests: UserRequests | None
    task_terms: list[str] | None
    unresolved_error: UnresolvedError | None
    working_directory: str | None
    gate: ContinuityGate | None
    abandoned_entries: int | None  # a branch summary: the entries of the branch left
    navigation: BranchNavigation | None  # a branch summary: its navigation
    dropped: DroppedIndex | None  # what left the context; None before it was recorded
    hooks: list[HookCall] | None  # the blocking hooks called before it (docs/events.md)
    from_hook: bool  # a hook supplied the whole summary
    hook_details: dict[str, Any] | None  # the details the hook gave with it
    preserve: dict[str, Any] | None  # data a hook asked to keep on it
    policy: Policy | None  # the session's compaction policy then (None: summarize)
    verbatim: VerbatimBlock | None  # a verbatim_first compaction's block


class CompactionUsage(SummarizerUsage):
    model: str | None  # the model that wrote the summary


class UsageHour(SummarizerUsage):
    hour_start: str
    limited_compactions: int


class TenantUsage(TypedDict):
    """GET /v1/usage: what compaction cost and saved the key's tenant."""

    summarizer: SummarizerUsage
    compactions: int
    saved_tokens: int
    limited_compactions: int  # made extractive by the hourly spend limit
    current_hour: UsageHour
    tokens_per_hour_limit: int | None
    updated_at: str | None


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
    details: CompactionDetails | None
    error: str | None
    upstream_model: str | None
    upstream_usage: dict[str, Any] | None
    usage: CompactionUsage
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


class TreeEntry(TypedDict):
    id: str
    seq: int
    branch: int
    parent_id: str | None
    kind: str  # message, compaction, continue or branch_summary
    role: str
    label: str
    tokens: int
    pinned: bool
    children: int
    on_path: bool
    leaf: bool


class PathSegment(TypedDict):
    branch: int
    from_seq: int
    to_seq: int


class TreePage(TypedDict):
    entries: list[TreeEntry]
    leaf_seq: int
    leaf_id: str | None
    path: list[PathSegment]
    next_cursor: str | None


class BranchSummaryJob(TypedDict):
    """The compaction (reason ``branch_summary``) a pending navigation waits on."""

    id: str
    status: str
    abandoned_from_seq: int
    abandoned_to_seq: int


class NavigateResult(TypedDict):
    status: NavigateStatus
    session: Session
    leaf_seq: int
    leaf_id: str | None
    abandoned_seqs: int
    branch_summary: BranchSummaryJob | None


class SearchHit(TypedDict):
    """An entry that matches a search, anywhere in the session's tree."""

    id: str
    seq: int
    branch: int
    role: str
    kind: str  # message, compaction, continue or branch_summary
    tool_name: str | None  # the tool whose output it is
    on_path: bool  # on the path from the root to the active leaf
    compacted: bool  # not in the current context (replaced, or on another branch)
    score: float  # higher is better: 4 and more where the query stands as written
    snippet: str  # the entry around the match, the matches marked «like this»


class SearchPage(TypedDict):
    hits: list[SearchHit]
    complete: bool  # every match was ranked (else narrow the query or filter)
    pending: int  # entries not searchable yet (the indexer writes them within seconds)
    next_cursor: str | None


class ToolDefinitions(TypedDict):
    """The recall tools (``history_search``, ``history_read``) in a provider's format,
    to add to the tools of the agent's model requests as they are."""

    format: Format
    tools: list[dict[str, Any]]


class ToolCallResult(TypedDict):
    tool_call_id: str
    name: str
    format: Format
    is_error: bool  # the call could not be run; content says why
    content: str
    tokens: int
    truncated: bool  # cut to fit: content ends with how to read on
    message: dict[str, Any]  # the result as the agent appends it, in the call's format


class Event(TypedDict):
    """One event of a session's (or a tenant's) log, as its stream carries it."""

    id: str  # <transaction>-<sequence>: resume after it with last_event_id=
    type: str  # session.pruned, compaction.succeeded, ... (docs/events.md lists them)
    session_id: str | None  # None for a tenant's own (webhook.disabled)
    created_at: str
    data: dict[str, Any]


DeliveryStatus = Literal["pending", "succeeded", "failed", "skipped"]


class Webhook(TypedDict):
    id: str
    url: str
    types: list[str]  # event types (or families, compaction.*); a hook's points; []: all
    session_id: str | None  # only this session's events (or hook calls)
    hook: bool  # a blocking hook, waited for before a compaction or a navigation
    timeout_seconds: float  # a hook's time to answer
    description: str | None
    enabled: bool
    failures: int  # failed attempts in a row (a success resets it)
    disabled_reason: str | None
    created_at: str


class WebhookCreated(Webhook):
    secret: str  # whsec_...: shown this once; verify_webhook() checks deliveries with it


class WebhookList(TypedDict):
    webhooks: list[Webhook]


class Delivery(TypedDict):
    """One delivery of an event to a webhook, and how it went."""

    id: str
    event_id: str
    type: str
    session_id: str | None
    status: DeliveryStatus
    attempts: int
    last_status: int | None  # the receiver's last HTTP status
    last_error: str | None
    last_attempt_at: str | None
    next_attempt_at: str | None  # when a pending one is tried again
    created_at: str
    payload: dict[str, Any]  # the body POSTed: the event as a stream carries it


class DeliveryPage(TypedDict):
    deliveries: list[Delivery]
    next_cursor: str | None
