"""API models for sessions and the per-session config."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.engine.window.view import SENTINEL
from app.upstream.remote import MAX_URL_CHARS, url_problem

SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"
SessionId = Annotated[
    str, Field(pattern=SESSION_ID_PATTERN, description="1-128 of A-Z a-z 0-9 . _ : -")
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompactionConfig(Strict):
    enabled: bool = True
    auto: bool = True
    reserve_tokens: int = Field(16_384, ge=0, le=10_000_000)
    threshold: float | None = Field(
        None, gt=0, le=1, description="A fraction of the usable window; wins over reserve_tokens."
    )
    keep_recent_tokens: int = Field(20_000, ge=0, le=10_000_000)
    keep_requests_tokens: int = Field(
        20_000,
        ge=0,
        le=10_000_000,
        description="Tokens of the user's requests a compaction's summary quotes verbatim "
        "(the first request, then the latest ones), within 15% of the compaction "
        "threshold; beyond it they are clipped by whole lines, the opening line, errors, "
        "names and paths first. 0: none quoted.",
    )
    strategy: Literal["structured", "narrative"] = "structured"
    summarizer: Literal["llm", "extractive"] = "llm"
    policy: Literal["summarize", "verbatim_first"] = Field(
        "summarize",
        description="What a compaction does with the history it replaces. `summarize`: all "
        "of it goes to the summarizer. `verbatim_first`: the tool outputs leave first, each "
        "leaving a one-line pointer (tool, command or path, size, and the history_read "
        "from_seq/to_seq that reads it back); the user's and the assistant's text stays as "
        "written, newest first, while it fits `verbatim_share`; only what does not fit is "
        "summarized.",
    )
    verbatim_share: float = Field(
        0.25,
        gt=0,
        le=0.5,
        description="Under the `verbatim_first` policy, the share of the window's usable "
        "tokens that the summary's verbatim text and pointers may take, the previous "
        "compaction's included (so it never grows past it); less when the context after the "
        "compaction would otherwise stand near the compaction threshold.",
    )
    model: str | None = Field(None, max_length=200)
    models: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=5,
        description="Summarizer models tried in order, after the compaction's own model (the "
        "request's model, else `model`, else the server's COMPACTD_UPSTREAM_MODEL, else the "
        "session's model), when it fails in a way that would end in the extractive summary; "
        "duplicates are skipped.",
    )
    remote_endpoint: str | None = Field(
        None,
        max_length=MAX_URL_CHARS,
        description="An absolute http(s) URL: every summarizer request of a compaction is "
        'POSTed there as {"systemPrompt", "prompt"}, answered with {"summary"}, instead of '
        "going to the upstream LLM (none needs to be configured); its summaries record "
        "`remote:<host>` as their model.",
    )
    auto_continue: bool = True
    emergency_fraction: float = Field(0.95, gt=0, le=1)
    instructions: str | None = Field(None, max_length=20_000)

    @field_validator("remote_endpoint")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        if value is not None and (problem := url_problem(value)) is not None:
            raise ValueError(problem)
        return value


class PruneConfig(Strict):
    enabled: bool = Field(True, description="False: nothing is pruned, not even on request.")
    auto: bool = Field(
        True, description="Prune when an append or usage report moves the verdict to prune."
    )
    protect_tokens: int = Field(40_000, ge=0, le=10_000_000)
    minimum_tokens: int = Field(20_000, ge=0, le=10_000_000)
    protect_turns: int = Field(2, ge=0, le=1000)
    protected_tools: list[str] = Field(
        default_factory=lambda: ["skill"],
        max_length=200,
        description="Tools whose outputs are never pruned: names, or fnmatch-style patterns "
        '(`*`, `?`, `[...]`), case-insensitive. Seed 000\'s set is `["skill", "tool-*"]`.',
    )
    placeholder: str = Field(
        "[Old tool result content cleared]",
        min_length=1,
        max_length=1000,
        description="What the model sees in place of a pruned output.",
    )
    erase: bool = False

    @field_validator("placeholder")
    @classmethod
    def _not_the_template_marker(cls, value: str) -> str:
        if SENTINEL in value:
            raise ValueError(f"must not contain {SENTINEL!r}, which marks the call id")
        return value


OutputCategory = Literal["head_tail", "match_list", "file_content", "generic"]


class TruncateConfig(Strict):
    enabled: bool = True
    tool_result_token_cap: int = Field(4_000, ge=100, le=1_000_000)
    categories: dict[str, OutputCategory] = Field(
        default_factory=dict, description="Tool name to output category, over the defaults."
    )


class BranchSummaryConfig(Strict):
    enabled: bool = Field(
        False,
        description="Navigations summarize the branch they abandon unless they say otherwise.",
    )
    reserve_tokens: int = Field(
        16_384,
        ge=0,
        le=10_000_000,
        description="The summarizer reads the abandoned branch's newest entries up to the "
        "model's window less this.",
    )


class RecallConfig(Strict):
    result_tokens: int = Field(
        4_000,
        ge=200,
        le=32_000,
        description="The most a recall tool call's result holds (POST …/tool-calls), unless "
        "the call says otherwise; a longer one ends with a note of how to read on. Through the "
        "proxy, the most one round's results hold together.",
    )
    proxy_tools: bool = Field(
        False,
        description="Proxied calls offer the model history_search and history_read beside the "
        "agent's tools, and compactd answers them itself before the agent gets the reply (see "
        "docs/proxy.md, Recall). Every upstream request of such a call is whole, not streamed.",
    )


class SessionConfig(Strict):
    """Per-session behaviour; every field can be overridden at create or patch."""

    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    branch_summary: BranchSummaryConfig = Field(default_factory=BranchSummaryConfig)
    recall: RecallConfig = Field(default_factory=RecallConfig)
    prune: PruneConfig = Field(default_factory=PruneConfig)
    truncate: TruncateConfig = Field(default_factory=TruncateConfig)


def _check_window(
    context_window: int | None, max_output: int | None, input_limit: int | None
) -> None:
    if context_window is not None and max_output is not None and max_output >= context_window:
        raise ValueError("max_output_tokens must be smaller than context_window")
    if context_window is not None and input_limit is not None and input_limit > context_window:
        raise ValueError("input_limit must not exceed context_window")


WindowInt = Annotated[int, Field(ge=1, le=100_000_000)]


class SessionCreate(Strict):
    model: str = Field(min_length=1, max_length=200, examples=["gpt-4o"])
    id: SessionId | None = Field(None, description="Client-chosen id; generated when absent.")
    context_window: WindowInt | None = None
    max_output_tokens: WindowInt | None = None
    input_limit: WindowInt | None = None
    config: dict[str, Any] = Field(
        default_factory=dict, description="Partial SessionConfig overrides."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    parent_id: SessionId | None = Field(
        None,
        description="The session this one is a side conversation of (a title request, a "
        "subagent), in the same tenant; 404 when it does not exist. The proxy sets it on "
        "the child sessions it makes.",
    )

    @model_validator(mode="after")
    def _window(self) -> SessionCreate:
        _check_window(self.context_window, self.max_output_tokens, self.input_limit)
        return self


class SessionPatch(Strict):
    model: str | None = Field(None, min_length=1, max_length=200)
    context_window: WindowInt | None = None
    max_output_tokens: WindowInt | None = None
    input_limit: WindowInt | None = None
    config: dict[str, Any] | None = Field(
        None, description="Merged into the overrides; null resets a key."
    )
    metadata: dict[str, Any] | None = Field(None, description="Replaces the metadata.")


class SessionWarning(BaseModel):
    """Something the service assumed for a session, and how to fix it."""

    code: Literal["unknown_model"] = Field(
        description="unknown_model: the model is in no catalog; its window is a default."
    )
    detail: str = Field(description="What was assumed and what to set instead.")


class SummarizerUsage(BaseModel):
    """What summarizer requests took, summed over calls: as each upstream reported it
    (a remote endpoint reports no tokens, only its calls are counted)."""

    calls: int = Field(description="Requests sent to the summarizer, failed ones included.")
    input_tokens: int = Field(description="Prompt tokens, the cached ones included.")
    output_tokens: int = Field(description="Output tokens (reasoning included).")
    cached_tokens: int = Field(
        description="Prompt tokens the provider read from its cache (OpenAI's "
        "`prompt_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`): "
        "part of `input_tokens`."
    )


class SessionOut(BaseModel):
    id: str
    parent_id: str | None = Field(
        description="The session this one is a side conversation of (the proxy's title "
        "requests and subagents: docs/proxy.md); null for a session of its own, and once the "
        "parent is deleted (its children are kept).",
    )
    model: str
    context_window: int
    max_output_tokens: int
    input_limit: int | None
    usable_tokens: int
    model_known: bool = Field(
        description="False when the model is in no catalog (neither the built-in one nor "
        "COMPACTD_MODEL_CATALOG): its window is COMPACTD_DEFAULT_CONTEXT_WINDOW (128k) unless "
        "the session gives its own; `warnings` then says so."
    )
    config: SessionConfig
    metadata: dict[str, Any]
    entry_count: int
    stored_tokens: int
    context_tokens: int
    calibration_factor: float
    overhead_tokens: int = Field(
        0,
        description="Tokens each request adds besides the stored messages (the tool schemas): "
        "set by an append's `tools` or a usage report's `tools`/`tools_tokens`, added to "
        "every estimate made without a usage report's exact base.",
    )
    last_usage: dict[str, Any] | None
    usage_count: int = Field(description="Usage reports received.")
    pruned_tokens: int = Field(description="Tokens pruning has taken out of the context.")
    prune_count: int
    compaction_count: int
    compaction_cost: SummarizerUsage = Field(
        description="What compaction cost this session: the summarizer's requests and tokens "
        "for its compactions and branch summaries, added as each one commits (a compaction "
        "whose summary saved nothing included; one retried later counts its last attempt)."
    )
    compaction_saved_tokens: int = Field(
        description="What compaction saved this session: the context tokens its committed "
        "compactions removed (`tokens_before - tokens_after`, summed), emergency ones included."
    )
    active_compaction_id: uuid.UUID | None = Field(
        description="The compaction queued or running for this session, if any."
    )
    compaction_failures: int = Field(
        description="Automatic compactions that failed in a row (3 stop them until a manual "
        "one succeeds)."
    )
    auto_compaction: Literal["on", "off", "held", "stopped"] = Field(
        description="off: disabled in the config; held: the last compaction saved under 5%, "
        "so none runs until new history arrives; stopped: 3 automatic ones failed in a row."
    )
    version: int
    created_at: datetime
    updated_at: datetime
    warnings: list[SessionWarning] = Field(
        default_factory=list,
        description="What the service assumed for this session and you may want to fix, "
        "e.g. `unknown_model`: the model is in no catalog, so its window is a default. "
        "Empty when nothing was assumed.",
    )


class SessionPage(BaseModel):
    sessions: list[SessionOut]
    next_cursor: str | None = Field(
        description="Pass as cursor for the next page; null on the last."
    )
