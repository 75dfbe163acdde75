"""API models for appending and reading the stored history."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.budget.schemas import PruneResult, Verdict
from app.compactions.schemas import CompactionStarted
from app.history.schemas import Format

# The fields of a provider's request that do not bear on the stored history: an
# append takes the request as the agent has it, and ignores these. Any other
# unknown field is a 422 naming it. (From the installed SDKs' create params, and
# the APIs' sampling parameters: tests/messages check the lists cover the SDKs.)
IGNORED_REQUEST_FIELDS: dict[str, frozenset[str]] = {
    "openai": frozenset(
        {
            "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
            "stop", "stream", "stream_options", "tool_choice", "parallel_tool_calls",
            "functions", "function_call", "metadata", "store", "seed", "user",
            "frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
            "top_logprobs", "response_format", "reasoning_effort", "service_tier",
            "modalities", "audio", "prediction", "web_search_options", "verbosity",
            "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
            "safety_identifier", "moderation",
        }
    ),
    "anthropic": frozenset(
        {
            "model", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences",
            "stream", "tool_choice", "metadata", "thinking", "service_tier", "container",
            "mcp_servers", "context_management", "output_config", "inference_geo", "speed",
            "cache_control", "diagnostics", "user_profile_id", "workspace_id", "betas",
        }
    ),
}  # fmt: skip


_APPEND_DESCRIPTION = (
    "A batch of messages to append, and what of the agent's request bears on the history "
    "besides them (`system`, `tools`). The agent may send its provider request as it has "
    "it: the fields of the provider's request that do not bear on the history are accepted "
    "and ignored, and any other field is a 422 naming it. Ignored for format openai: "
    + ", ".join(sorted(IGNORED_REQUEST_FIELDS["openai"]))
    + ". Ignored for format anthropic: "
    + ", ".join(sorted(IGNORED_REQUEST_FIELDS["anthropic"]))
    + "."
)


class AppendRequest(BaseModel):
    """A batch of messages to append, and what of the agent's request bears on
    the history besides them (``system``, ``tools``); the provider request's
    other fields in ``IGNORED_REQUEST_FIELDS`` are accepted and ignored."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "description": _APPEND_DESCRIPTION,
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
                },
                {
                    "format": "anthropic",
                    "model": "claude-sonnet-4-5",
                    "max_tokens": 4096,
                    "system": [
                        {
                            "type": "text",
                            "text": "You are a coding agent.",
                            "cache_control": {"type": "ephemeral"},
                        }
                    ],
                    "tools": [
                        {
                            "name": "bash",
                            "description": "Run a shell command.",
                            "input_schema": {
                                "type": "object",
                                "properties": {"command": {"type": "string"}},
                            },
                        }
                    ],
                    "messages": [{"role": "user", "content": "List the files."}],
                },
            ],
        },
    )

    messages: list[dict[str, Any]] = Field(
        min_length=1,
        description="OpenAI chat messages, or Anthropic messages when format is anthropic.",
    )
    format: Format = Field(
        "openai",
        description="The messages' format. The `?format=` query parameter says the same "
        "(as on every route with a format); given both, they must agree.",
    )
    system: str | list[dict[str, Any]] | None = Field(
        None,
        description="The request's top-level system prompt, as sent to the provider: a string "
        "or a list of text blocks (`cache_control` and other block keys are kept in the "
        "stored history, never shown to the model). It is stored as one system entry before "
        "the batch's messages, unless the session's latest system entry (the last stored "
        "entry of role system, however it was appended) has the same texts: the same text "
        "blocks' texts in the same order, a string being one block, other block keys not "
        "compared. So an agent may send the same system prompt with every append: it is "
        "stored once, and again only when it changes. An empty string or list stores "
        "nothing. Accepted in both formats.",
    )
    tools: list[dict[str, Any]] | None = Field(
        None,
        max_length=2000,
        description="The request's tool schemas, as sent to the provider (OpenAI or "
        "Anthropic tools). They are never stored as messages; their tokens become the "
        "session's overhead (`overhead_tokens`, counted as for a usage report's `tools`), "
        "which every verdict adds. An empty list sets the overhead to 0; without `tools` "
        "the overhead stays as it was.",
    )


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
