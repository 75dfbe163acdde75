"""A provider's usage object, as its SDK or its API gives it, read as the
native usage figures: the one mapping both ``POST …/usage`` and the proxy use.

An agent sends what its SDK handed it (``resp.usage.model_dump()``, or the
whole ``resp.model_dump()``) and renames nothing. What the native report calls
the prompt is ``input_tokens + cache_read_tokens + cache_write_tokens``
(Anthropic's figures as they come); each provider counts it its own way.

The mapping of each shape (OpenAI chat, Responses, Anthropic, Gemini, native),
the fields that tell the shapes apart, what of a whole response is read, which
unknown fields are refused and the bounds on every figure are written in
docs/api.md, "Provider-native payloads".

Pure: no I/O. :func:`read_usage` is the entry point.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# No prompt is larger than this; anything above is a client bug, not a usage figure.
MAX_TOKENS = 100_000_000
# The longest stop reason kept (providers' words are a few characters).
MAX_REASON_CHARS = 64

UsageFormat = Literal["native", "openai_chat", "openai_responses", "anthropic", "gemini"]

FORMAT_NAMES: dict[UsageFormat, str] = {
    "native": "native",
    "openai_chat": "OpenAI chat completions",
    "openai_responses": "OpenAI Responses",
    "anthropic": "Anthropic Messages",
    "gemini": "Gemini",
}


class UsageError(ValueError):
    """A usage body that cannot be read, with the path of the offending field
    (``prompt_tokens_details.cached_tokens``, ``usage.input_tokens``; ``body``
    for the body itself)."""

    def __init__(self, field: str, detail: str, *, native: bool = False) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail
        # The body was read as the native report (no provider's shape recognised).
        self.native = native


@dataclass(frozen=True, slots=True)
class ReadUsage:
    """A usage body read as the native figures.

    ``input_tokens`` are the prompt's uncached tokens, so that
    :attr:`prompt_tokens` is the whole prompt the provider measured.
    ``finish_reason`` is the provider's own word (``stop``, ``end_turn``,
    ``STOP``...), except for a Responses ``Response``, which has none: its
    ``status`` gives ``stop`` (completed), ``length`` (incomplete at
    ``max_output_tokens``), the incomplete reason, or the status itself.
    ``whole_response``: the body was a whole response, not its usage object.
    """

    format: UsageFormat
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    finish_reason: str | None
    whole_response: bool = False

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def native(self) -> dict[str, Any]:
        """The native report's fields (``input_tokens`` ... ``finish_reason``)."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "finish_reason": self.finish_reason,
        }


# --- the shapes ---------------------------------------------------------------

NATIVE_FIELDS = frozenset(
    {"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"}
)
# The stop reason under each provider's name, at the top level of a usage body.
REASON_ALIASES = ("stop_reason", "finishReason")  # the native report's is finish_reason
REASON_FIELDS = ("finish_reason", *REASON_ALIASES)

_GEMINI_PAIRS = (
    ("promptTokenCount", "prompt_token_count"),
    ("candidatesTokenCount", "candidates_token_count"),
    ("cachedContentTokenCount", "cached_content_token_count"),
    ("toolUsePromptTokenCount", "tool_use_prompt_token_count"),
    ("thoughtsTokenCount", "thoughts_token_count"),
    ("totalTokenCount", "total_token_count"),
    ("promptTokensDetails", "prompt_tokens_details"),
    ("cacheTokensDetails", "cache_tokens_details"),
    ("candidatesTokensDetails", "candidates_tokens_details"),
    ("toolUsePromptTokensDetails", "tool_use_prompt_tokens_details"),
    ("trafficType", "traffic_type"),
    # The Live API's name for the candidates' count.
    ("responseTokenCount", "response_token_count"),
    ("responseTokensDetails", "response_tokens_details"),
)

# Every documented top-level field of each provider's usage object.
FIELDS: dict[UsageFormat, frozenset[str]] = {
    "openai_chat": frozenset(
        {
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "prompt_tokens_details",
            "completion_tokens_details",
        }
    ),
    "openai_responses": frozenset(
        {
            "input_tokens",
            "input_tokens_details",
            "output_tokens",
            "output_tokens_details",
            "total_tokens",
        }
    ),
    "anthropic": frozenset(
        {
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "cache_creation",
            "server_tool_use",
            "service_tier",
            "inference_geo",
            "speed",
            "output_tokens_details",
        }
    ),
    "gemini": frozenset(name for pair in _GEMINI_PAIRS for name in pair),
}

# The fields that say which shape a body is: each belongs to one shape only.
MARKERS: dict[UsageFormat, frozenset[str]] = {
    "native": frozenset({"cache_read_tokens", "cache_write_tokens"}),
    # (prompt_tokens_details is the google-genai SDK's name too: it marks neither.)
    "openai_chat": frozenset({"prompt_tokens", "completion_tokens", "completion_tokens_details"}),
    "openai_responses": frozenset({"input_tokens_details"}),
    "anthropic": FIELDS["anthropic"] - {"input_tokens", "output_tokens", "output_tokens_details"},
    "gemini": FIELDS["gemini"] - {"prompt_tokens_details"},
}

# Figures read from nested objects: a top-level field of one of these names is
# misplaced, not new.
_NESTED_FIGURES = {
    "cached_tokens": "prompt_tokens_details.cached_tokens",
    "reasoning_tokens": "completion_tokens_details.reasoning_tokens",
    "audio_tokens": "prompt_tokens_details.audio_tokens",
}

_KNOWN = frozenset(
    {*NATIVE_FIELDS, *REASON_FIELDS, *(f for fields in FIELDS.values() for f in fields)}
)


def _squash(name: str) -> str:
    return name.replace("_", "").lower()


_SQUASHED = {_squash(name): name for name in sorted(_KNOWN)}
_NEAR_MISS_CUTOFF = 0.88


def near_miss(name: str) -> str | None:
    """The known field ``name`` looks like a slip of, if any: another case or
    separators (``cacheReadInputTokens``), a letter or two off
    (``cache_read_input_token``), or a nested figure at the top level."""
    if name in _KNOWN:
        return None
    if name in _NESTED_FIGURES:
        return _NESTED_FIGURES[name]
    squashed = _squash(name)
    if squashed in _SQUASHED and _SQUASHED[squashed] != name:
        return _SQUASHED[squashed]
    close = difflib.get_close_matches(squashed, list(_SQUASHED), n=1, cutoff=_NEAR_MISS_CUTOFF)
    return _SQUASHED[close[0]] if close else None


# --- figures --------------------------------------------------------------------


def _path(prefix: str, name: str) -> str:
    return f"{prefix}{name or chr(34) * 2}"  # an empty key shown as ""


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _count(obj: Mapping[str, Any], name: str, prefix: str, *, required: bool = False) -> int:
    """A token figure: a non-negative integer up to ``MAX_TOKENS``; absent or
    null is 0 unless ``required``."""
    field = _path(prefix, name)
    value = obj.get(name)
    if value is None:
        if required:
            raise UsageError(field, "is required" if name not in obj else "must not be null")
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(field, f"must be an integer, got {_type_name(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise UsageError(field, f"must be an integer, got {value}")
        value = int(value)
    if value < 0:
        raise UsageError(field, f"must not be negative, got {value}")
    if value > MAX_TOKENS:
        raise UsageError(field, f"is {value:,}; no usage figure is above {MAX_TOKENS:,}")
    return value


def _details(obj: Mapping[str, Any], name: str, prefix: str) -> Mapping[str, Any]:
    """A nested details object (free-form), or an empty one when absent or null."""
    value = obj.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(_path(prefix, name), f"must be an object, got {_type_name(value)}")
    return value


def _reason(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(field, f"must be a string, got {_type_name(value)}")
    reason = str(value)  # a str enum (google-genai's FinishReason) as its value
    if len(reason) > MAX_REASON_CHARS:
        raise UsageError(field, f"is {len(reason)} characters; at most {MAX_REASON_CHARS}")
    return reason


def _within(prompt: int, prompt_field: str, parts: list[tuple[int, str]]) -> None:
    """The cached parts of a prompt add up to no more than the prompt."""
    if sum(n for n, _ in parts) > prompt:
        named = " + ".join(f"{f} ({n:,})" for n, f in parts if n)
        raise UsageError(
            parts[0][1], f"{named} is more than {prompt_field} ({prompt:,}), which includes them"
        )


def _sum_within_max(what: str, parts: list[tuple[int, str]]) -> int:
    """A figure that is the sum of others (the prompt of input and cache figures, Gemini's
    output of candidates and thoughts) is bounded like any one figure: each part may be
    within ``MAX_TOKENS`` and their sum not. Named by its first part, the detail naming
    the sum."""
    total = sum(n for n, _ in parts)
    if total > MAX_TOKENS:
        named = " + ".join(f"{f} ({n:,})" for n, f in parts if n)
        first = next(f for n, f in parts if n)
        raise UsageError(
            first,
            f"{named} is {total:,}, the {what}; no usage figure is above {MAX_TOKENS:,}",
        )
    return total


def _gemini_get(obj: Mapping[str, Any], camel: str, snake: str, prefix: str) -> tuple[str, Any]:
    """A Gemini field under its REST (camelCase) or SDK (snake_case) name."""
    if camel in obj and snake in obj:
        raise UsageError(
            _path(prefix, snake),
            f"the same figure as {_path(prefix, camel)}, given twice (the SDK and the REST name)",
        )
    return (snake, obj[snake]) if snake in obj else (camel, obj.get(camel))


def _figures(fmt: UsageFormat, usage: Mapping[str, Any], prefix: str) -> tuple[int, int, int, int]:
    """``(input, output, cache_read, cache_write)`` of a usage object of shape ``fmt``."""
    if fmt in ("native", "anthropic"):
        # The prompt is the sum of the three (Anthropic's figures as they come).
        read_name, write_name = (
            ("cache_read_tokens", "cache_write_tokens")
            if fmt == "native"
            else ("cache_read_input_tokens", "cache_creation_input_tokens")
        )
        if fmt == "anthropic":
            _details(usage, "cache_creation", prefix)
            _details(usage, "server_tool_use", prefix)
            _details(usage, "output_tokens_details", prefix)
        figures = (
            _count(usage, "input_tokens", prefix, required=True),
            _count(usage, "output_tokens", prefix),
            _count(usage, read_name, prefix),
            _count(usage, write_name, prefix),
        )
        _sum_within_max(
            "prompt",
            [
                (figures[0], _path(prefix, "input_tokens")),
                (figures[2], _path(prefix, read_name)),
                (figures[3], _path(prefix, write_name)),
            ],
        )
        return figures
    if fmt in ("openai_chat", "openai_responses"):
        chat = fmt == "openai_chat"
        prompt_name, output_name = (
            ("prompt_tokens", "completion_tokens") if chat else ("input_tokens", "output_tokens")
        )
        details_name = "prompt_tokens_details" if chat else "input_tokens_details"
        prompt = _count(usage, prompt_name, prefix, required=True)
        output = _count(usage, output_name, prefix)
        _count(usage, "total_tokens", prefix)
        _details(usage, "completion_tokens_details" if chat else "output_tokens_details", prefix)
        details = _details(usage, details_name, prefix)
        inner = _path(prefix, details_name) + "."
        cached = _count(details, "cached_tokens", inner)
        written = _count(details, "cache_write_tokens", inner)
        parts = [(cached, inner + "cached_tokens")]
        if written:
            parts.append((written, inner + "cache_write_tokens"))
        _within(prompt, _path(prefix, prompt_name), parts)
        return prompt - cached - written, output, cached, written
    # gemini
    values: dict[str, tuple[str, Any]] = {
        camel: _gemini_get(usage, camel, snake, prefix) for camel, snake in _GEMINI_PAIRS
    }
    counts: dict[str, int] = {}
    for camel, (name, value) in values.items():
        if camel.endswith("Count"):
            counts[camel] = _count(usage, name, prefix, required=camel == "promptTokenCount")
        elif camel.endswith("Details") and value is not None and not isinstance(value, list):
            raise UsageError(_path(prefix, name), f"must be a list, got {_type_name(value)}")
    prompt = counts["promptTokenCount"]
    cached = counts["cachedContentTokenCount"]
    _within(
        prompt,
        _path(prefix, values["promptTokenCount"][0]),
        [(cached, _path(prefix, values["cachedContentTokenCount"][0]))],
    )
    candidates = "candidatesTokenCount" if counts["candidatesTokenCount"] else "responseTokenCount"
    output = _sum_within_max(
        "output",
        [
            (counts[candidates], _path(prefix, values[candidates][0])),
            (counts["thoughtsTokenCount"], _path(prefix, values["thoughtsTokenCount"][0])),
        ],
    )
    return prompt - cached, output, cached, 0


# --- recognising a shape --------------------------------------------------------------


def _markers(keys: Collection[str]) -> dict[UsageFormat, list[str]]:
    """The marker fields present, by shape (shapes with none left out)."""
    found: dict[UsageFormat, list[str]] = {}
    for fmt, markers in MARKERS.items():
        present = sorted(k for k in keys if k in markers)
        if present:
            found[fmt] = present
    return found


def _mixed(found: Mapping[UsageFormat, list[str]]) -> UsageError:
    """Named by the first marker found (the native body's first, when it is one
    of them); the detail names every marker of each shape."""
    shapes = [f"{', '.join(names)} ({FORMAT_NAMES[fmt]})" for fmt, names in found.items()]
    return UsageError(
        next(iter(found.values()))[0],
        "two usage shapes are mixed: " + " and ".join(shapes) + "; send one provider's object",
    )


def shape_of(usage: Mapping[str, Any]) -> UsageFormat:
    """Which shape a usage object is, by the fields only that shape has.
    Raises :class:`UsageError` when two shapes are mixed."""
    keys = [k for k in usage if k not in REASON_FIELDS]
    found = _markers(keys)
    if len(found) > 1:
        raise _mixed(found)
    if found:
        return next(iter(found))
    if "input_tokens" in usage and "total_tokens" in usage:
        return "openai_responses"
    if "output_tokens_details" in usage:
        # Anthropic's and Responses' both, without the cache figures that would
        # tell them apart: read alike either way.
        return "anthropic"
    return "native"


def _check_fields(fmt: UsageFormat, usage: Mapping[str, Any], prefix: str) -> None:
    """Fields of another shape, unknown native fields and near misses are refused."""
    documented = NATIVE_FIELDS if fmt == "native" else FIELDS[fmt]
    for name in usage:
        if name in documented or name in REASON_FIELDS:
            continue
        field = _path(prefix, name)
        owners: list[tuple[UsageFormat, frozenset[str]]] = [("native", NATIVE_FIELDS)]
        owners.extend(FIELDS.items())
        owner = next((f for f, fields in owners if name in fields), None)
        if owner is not None:
            evidence = sorted(k for k in usage if k in MARKERS[fmt] or k in documented)
            shown = f" ({', '.join(evidence[:2])})" if evidence else ""
            raise UsageError(
                field,
                f"is a field of {FORMAT_NAMES[owner]} usage, not of the {FORMAT_NAMES[fmt]} "
                f"usage the other fields are{shown}; send one provider's object",
            )
        if fmt == "native":
            hint = near_miss(name)
            raise UsageError(
                field,
                "unknown field"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + "; a usage report has input_tokens, output_tokens, cache_read_tokens, "
                "cache_write_tokens, or a provider's usage object as its SDK gives it",
            )
        hint = near_miss(name)
        if hint is not None:
            raise UsageError(
                field,
                f"is not a field of {FORMAT_NAMES[fmt]} usage; did you mean {hint!r}?",
            )
        # Otherwise a field this module does not know yet: ignored.


# --- whole responses ----------------------------------------------------------------


def _response_kind(body: Mapping[str, Any]) -> UsageFormat | None:
    """Which provider's response ``body`` is, from the fields that only a
    response has (not its usage)."""
    if "choices" in body or body.get("object") == "chat.completion":
        return "openai_chat"
    if body.get("object") == "response" or "incomplete_details" in body or "output" in body:
        return "openai_responses"
    if body.get("type") == "message":
        return "anthropic"
    if any(
        k in body
        for k in (
            "candidates",
            "usageMetadata",
            "usage_metadata",
            "promptFeedback",
            "prompt_feedback",
            "modelVersion",
            "model_version",
        )
    ):
        return "gemini"
    return None


def _first(body: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any] | None, str]:
    """``body[name][0]`` when it is a non-empty list of objects."""
    items = body.get(name)
    if items is None:
        return None, name
    if not isinstance(items, list):
        raise UsageError(name, f"must be a list, got {_type_name(items)}")
    if not items:
        return None, name
    first = items[0]
    if not isinstance(first, Mapping):
        raise UsageError(f"{name}[0]", f"must be an object, got {_type_name(first)}")
    return first, f"{name}[0]"


def _response_reason(kind: UsageFormat, body: Mapping[str, Any]) -> tuple[str | None, str]:
    """The stop reason a whole response gives, and where it was read."""
    if kind == "openai_chat":
        choice, where = _first(body, "choices")
        if choice is None:
            return None, where
        return _reason(choice.get("finish_reason"), f"{where}.finish_reason"), where
    if kind == "anthropic":
        return _reason(body.get("stop_reason"), "stop_reason"), "stop_reason"
    if kind == "gemini":
        candidate, where = _first(body, "candidates")
        if candidate is None:
            return None, where
        _, value = _gemini_get(candidate, "finishReason", "finish_reason", f"{where}.")
        return _reason(value, f"{where}.finishReason"), where
    if kind == "openai_responses":
        status = _reason(body.get("status"), "status")
        if status != "incomplete":
            return ("stop" if status == "completed" else status), "status"
        details = _details(body, "incomplete_details", "")
        why = _reason(details.get("reason"), "incomplete_details.reason")
        if why == "max_output_tokens":
            return "length", "incomplete_details.reason"  # OpenAI chat's word for it
        return why or status, "incomplete_details.reason"
    return None, ""


def _top_reason(body: Mapping[str, Any]) -> tuple[str | None, str]:
    """The stop reason at the top level of a usage body, under any provider's
    name; two different ones are refused."""
    found = [
        (name, _reason(body[name], name)) for name in REASON_FIELDS if body.get(name) is not None
    ]
    distinct = {reason for _, reason in found}
    if len(distinct) > 1:
        raise UsageError(
            found[-1][0],
            "two different stop reasons: " + ", ".join(f"{n}={r!r}" for n, r in found),
        )
    return (found[0][1], found[0][0]) if found else (None, "")


_USAGE_KEYS = ("usage", "usageMetadata", "usage_metadata")


def read_usage(payload: Mapping[str, Any], *, passthrough: Collection[str] = ()) -> ReadUsage:
    """Read a usage body: the native report, a provider's usage object, or a
    provider's whole response (see the module's docstring).

    ``passthrough``: top-level fields the caller reads itself (the usage
    route's ``context_version``, ``tools``, ``tools_tokens``): neither figures
    nor unknown. Raises :class:`UsageError` naming the field.
    """
    if not isinstance(payload, Mapping):
        raise UsageError("body", f"must be an object, got {_type_name(payload)}")
    usage_keys = [k for k in _USAGE_KEYS if k in payload]
    kind = _response_kind(payload)
    if usage_keys or kind is not None:
        return _read_response(payload, usage_keys, kind)
    body = {k: v for k, v in payload.items() if k not in passthrough}
    fmt = shape_of(body)
    try:
        _check_fields(fmt, body, "")
        figures = _figures(fmt, body, "")
        reason, _ = _top_reason(body)
    except UsageError as exc:
        exc.native = fmt == "native"
        raise
    return ReadUsage(fmt, *figures, finish_reason=reason)


def _read_response(
    payload: Mapping[str, Any], usage_keys: list[str], kind: UsageFormat | None
) -> ReadUsage:
    """A whole response (or a wrapper of a usage object): its usage and its
    reason only."""
    if len(usage_keys) > 1:
        raise UsageError(
            usage_keys[-1], f"a response has one usage object, and {usage_keys[0]} is one"
        )
    if not usage_keys:
        name = "usageMetadata" if kind == "gemini" else "usage"
        what = FORMAT_NAMES[kind] if kind is not None else "provider"
        raise UsageError(name, f"is missing: this {what} response carries no usage")
    key = usage_keys[0]
    if key != "usage":
        kind = "gemini"
    usage = payload[key]
    if usage is None:
        hint = (
            " (a stream gives it only when asked: stream_options.include_usage)"
            if kind == "openai_chat"
            else ""
        )
        raise UsageError(key, f"is null: the response carries no usage{hint}")
    if not isinstance(usage, Mapping):
        raise UsageError(key, f"must be an object, got {_type_name(usage)}")
    prefix = f"{key}."
    fmt = shape_of(usage)
    if fmt == "native" and kind is not None:
        # A response's usage is its provider's (Anthropic's bare input_tokens and
        # output_tokens are the native figures anyway); a native-only field in it
        # is refused by the field check below.
        fmt = kind
    if kind is not None and fmt != kind:
        raise UsageError(
            key, f"is {FORMAT_NAMES[fmt]} usage, but the response is a {FORMAT_NAMES[kind]} one"
        )
    _check_fields(fmt, usage, prefix)
    figures = _figures(fmt, usage, prefix)
    reason, where = _response_reason(fmt, payload)
    top, top_where = _top_reason(payload)
    if top is not None and reason is not None and top != reason and top_where != where:
        raise UsageError(
            top_where,
            f"is {top!r}, but the response's own stop reason ({where}) is {reason!r}",
        )
    return ReadUsage(fmt, *figures, finish_reason=reason or top, whole_response=True)
