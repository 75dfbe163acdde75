"""API models for usage reports, pruning and provider errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.compactions.schemas import CompactionStarted
from app.engine.accounting import provider_usage
from app.engine.accounting.provider_usage import UsageFormat
from app.history.schemas import Format
from app.sessions.schemas import Strict

# No prompt is larger than this; anything above is a client bug, not a usage figure.
MAX_REPORTED_TOKENS = provider_usage.MAX_TOKENS
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


# What a usage report says besides the figures, whatever shape the figures come in.
USAGE_CONTROL_FIELDS = ("context_version", "tools", "tools_tokens", "format")

FORMAT_FIELD_DESCRIPTION = (
    "The wire format the agent uses, openai or anthropic, as every route with a format "
    "takes it (also as the `?format=` query parameter; given both, they must agree). "
    "Checked, not used to read the figures: their shape is recognised from their "
    "fields (see `usage_format` in the answer)."
)

USAGE_EXAMPLES: dict[str, dict[str, Any]] = {
    "native": {
        "summary": "Native figures",
        "value": {"input_tokens": 1834, "output_tokens": 212, "cache_read_tokens": 12000},
    },
    "openai_chat": {
        "summary": "OpenAI chat completions usage (resp.usage.model_dump())",
        "value": {
            "prompt_tokens": 13834,
            "completion_tokens": 212,
            "total_tokens": 14046,
            "prompt_tokens_details": {"cached_tokens": 12000, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 64},
            "finish_reason": "tool_calls",
        },
    },
    "openai_responses": {
        "summary": "OpenAI Responses usage",
        "value": {
            "input_tokens": 13834,
            "input_tokens_details": {"cached_tokens": 12000},
            "output_tokens": 212,
            "output_tokens_details": {"reasoning_tokens": 64},
            "total_tokens": 14046,
        },
    },
    "anthropic": {
        "summary": "Anthropic Messages usage, with the stop reason",
        "value": {
            "input_tokens": 1834,
            "output_tokens": 212,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 12000,
            "service_tier": "standard",
            "stop_reason": "end_turn",
        },
    },
    "gemini": {
        "summary": "Gemini usageMetadata (REST names; the SDK's snake_case too)",
        "value": {
            "promptTokenCount": 13834,
            "cachedContentTokenCount": 12000,
            "candidatesTokenCount": 212,
            "thoughtsTokenCount": 40,
            "totalTokenCount": 14086,
            "finishReason": "STOP",
        },
    },
    "whole_response": {
        "summary": "A whole Anthropic Message (resp.model_dump()): usage and stop_reason read",
        "value": {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "Done."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1834, "output_tokens": 212, "cache_read_input_tokens": 0},
            "context_version": 42,
        },
    },
}


class UsageReport(Strict):
    """The usage the provider reported for the last model call.

    Send it right after the call, before appending the reply: the prompt it
    measures is then exactly the context the session holds.

    **The figures come in any of these shapes**, renamed nothing:

    - *native*: ``input_tokens`` (uncached), ``output_tokens``,
      ``cache_read_tokens``, ``cache_write_tokens``; the prompt is their sum;
    - *OpenAI chat completions* ``usage`` as the SDK's ``model_dump()`` or the API
      gives it (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
      ``prompt_tokens_details``...): the prompt is ``prompt_tokens``, which
      includes ``prompt_tokens_details.cached_tokens``;
    - *OpenAI Responses* ``usage`` (``input_tokens``, ``input_tokens_details``,
      ``output_tokens``, ``output_tokens_details``, ``total_tokens``): the prompt
      is ``input_tokens``, cached tokens included;
    - *Anthropic Messages* ``usage`` (``input_tokens``, ``output_tokens``,
      ``cache_creation_input_tokens``, ``cache_read_input_tokens``,
      ``cache_creation``, ``server_tool_use``, ``service_tier``...): the prompt is
      input + cache read + cache creation;
    - *Gemini* ``usageMetadata`` (``promptTokenCount``, ``candidatesTokenCount``,
      ``cachedContentTokenCount``, ``thoughtsTokenCount``,
      ``toolUsePromptTokenCount``, ``totalTokenCount``... or the google-genai
      SDK's snake_case names): the prompt is ``promptTokenCount`` (cached content
      included; tool-use prompt tokens are not part of it);
    - a *whole response* as the SDK returns it (``resp.model_dump()``): an OpenAI
      ``ChatCompletion``, a Responses ``Response``, an Anthropic ``Message`` or a
      Gemini ``GenerateContentResponse``: only its usage and its stop reason are
      read.

    The stop reason goes under the provider's name: ``finish_reason``,
    ``stop_reason`` or ``finishReason`` (a whole response's own is read from it;
    for a Responses ``Response``, ``status`` completed is ``stop`` and incomplete
    at ``max_output_tokens`` is ``length``). ``context_version``, ``tools`` and
    ``tools_tokens`` may go beside any shape.

    **Unknown fields**: the native body is closed (a field it does not have is a
    422 naming it). A provider's usage object is open: its documented fields are
    read, nested ``*_details`` objects are free-form, and a field it does not
    document (one a newer SDK adds) is ignored, unless its name is a near miss of
    a known one (``cache_read_input_token``, ``cacheReadInputTokens``), which is a
    422 naming it. Two shapes mixed, negative or non-integer figures, cached
    tokens beyond the prompt and two different stop reasons are 422s naming the
    fields. The answer's ``usage_format`` says which shape was read.

    **Bounds**: every figure is at most 100,000,000, and so is a figure read as the
    sum of others (the prompt: ``input_tokens + cache_read_tokens +
    cache_write_tokens``, or Anthropic's input and cache figures; Gemini's output):
    an over-large one is a 422 naming it.

    ``format`` (``openai`` or ``anthropic``, in the body or as ``?format=``) may go
    beside any shape, as on every route with a wire format; anything else is a 422
    naming the field and the allowed values.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"input_tokens": 1834, "output_tokens": 212, "cache_read_tokens": 12000}]
        },
    )

    # Which shape the figures came in (see usage_format).
    _usage_format: UsageFormat = PrivateAttr("native")

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
    format: Format | None = Field(None, description=FORMAT_FIELD_DESCRIPTION)
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
        "tools_tokens is not given. (A whole Responses `Response` carries its own "
        "`tools`: they are these.)",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _provider_native(
        cls, data: Any, handler: ModelWrapValidatorHandler[UsageReport]
    ) -> UsageReport:
        """A provider's usage object or whole response, read as the native figures
        (:func:`app.engine.accounting.provider_usage.read_usage`)."""
        if not isinstance(data, Mapping):
            return handler(data)
        try:
            read = provider_usage.read_usage(data, passthrough=USAGE_CONTROL_FIELDS)
        except provider_usage.UsageError as exc:
            if exc.native:
                # The native body: the field validators name every bad field they
                # see (the stop reason's other names aside); what they let pass
                # (two stop reasons) is the mapping's to name.
                plain = {k: v for k, v in data.items() if k not in provider_usage.REASON_ALIASES}
                handler(plain)
            raise PydanticCustomError(
                "field_error", "{detail}", {"field": exc.field, "detail": exc.detail}
            ) from None
        native = {k: data[k] for k in USAGE_CONTROL_FIELDS if k in data}
        native.update(read.native())
        report = handler(native)
        report._usage_format = read.format
        return report

    @property
    def usage_format(self) -> UsageFormat:
        """Which shape the figures came in."""
        return self._usage_format


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
    usage_format: UsageFormat = Field(
        "native",
        description="Which shape the report's figures were read as: native, openai_chat, "
        "openai_responses, anthropic or gemini.",
    )
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
