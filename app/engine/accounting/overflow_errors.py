"""Recognise an upstream LLM error that says the prompt overflowed the context window.

compactd answers such a refusal by compacting and retrying, so it has to tell a
context-window overflow apart from every other 4xx and 5xx. Providers say it in their
own words; :func:`classify` knows the wordings they really send, each cited beside its
test case in ``tests/engine/test_overflow_errors.py``.

The rules (a bounded scan, rate-limit vetoes first, provider rules in order, generic
rules last; how the token counts are read and a provider attributed) are written in
docs/how-it-works.md, "Recognising a context overflow". Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MAX_SCAN_CHARS: Final = 64 * 1024
MAX_JSON_CHARS: Final = 256 * 1024
_MAX_JSON_PARSES: Final = 8
_MAX_JSON_NODES: Final = 20_000
_MAX_DIGITS: Final = 15
_JSON_START_WITHIN: Final = 1024

OPENAI: Final = "openai"
AZURE_OPENAI: Final = "azure_openai"
OPENAI_COMPATIBLE: Final = "openai_compatible"
ANTHROPIC: Final = "anthropic"
GEMINI: Final = "gemini"
BEDROCK: Final = "bedrock"
MISTRAL: Final = "mistral"
DEEPSEEK: Final = "deepseek"
OPENROUTER: Final = "openrouter"
OLLAMA: Final = "ollama"
LLAMA_CPP: Final = "llama_cpp"
VLLM: Final = "vllm"
XAI: Final = "xai"
GROQ: Final = "groq"
CEREBRAS: Final = "cerebras"
SGLANG: Final = "sglang"
MINIMAX: Final = "minimax"
MOONSHOT: Final = "moonshot"
GITHUB_COPILOT: Final = "github_copilot"
LM_STUDIO: Final = "lm_studio"
HUGGINGFACE_TGI: Final = "huggingface_tgi"
DS4: Final = "ds4"


@dataclass(frozen=True, slots=True)
class OverflowMatch:
    """The verdict on one upstream error. Only ``overflow`` is set when it is not one."""

    overflow: bool
    provider: str | None = None
    pattern: str | None = None
    requested_tokens: int | None = None
    limit_tokens: int | None = None


NOT_OVERFLOW: Final = OverflowMatch(overflow=False)


@dataclass(frozen=True, slots=True)
class _Body:
    text: str  # lower-cased: JSON string values first, then the raw text, both capped
    status: int | None
    counts: dict[str, int]  # llama.cpp's n_prompt_tokens / n_ctx from parsed JSON


def classify(status: int | None, message: str) -> OverflowMatch:
    """Whether ``status`` and ``message`` (a message, or a whole error body as text) say
    the prompt is too long for the model's context window. Never raises."""
    if not isinstance(message, str) or status == 429:  # callers outside the type checker
        return NOT_OVERFLOW
    body = _read(status, message)
    if _RATE_LIMIT.search(body.text):
        return NOT_OVERFLOW
    for rule in _PROVIDER_RULES:
        found = rule(body)
        if found is not None:
            return found
    if _OUTPUT_CAP.search(body.text):
        return NOT_OVERFLOW
    for rule in _GENERIC_RULES:
        found = rule(body)
        if found is not None:
            return found
    return NOT_OVERFLOW


# Reading the body


def _read(status: int | None, message: str) -> _Body:
    strings: list[str] = []
    counts: dict[str, int] = {}
    if len(message) <= MAX_JSON_CHARS:
        _collect_json(message, strings, counts)
    strings.append(message[:MAX_SCAN_CHARS])
    return _Body(text="\n".join(strings).lower(), status=status, counts=counts)


def _collect_json(text: str, strings: list[str], counts: dict[str, int]) -> None:
    """Gather the string values of ``text`` parsed as JSON, and of JSON strings nested
    in it, into ``strings`` (at most ``MAX_SCAN_CHARS`` in all)."""
    pending = [text]
    budget = MAX_SCAN_CHARS
    parses = nodes = 0
    while pending and parses < _MAX_JSON_PARSES and budget > 0:
        parses += 1
        stack: list[object] = [_parse_json(pending.pop())]
        while stack and nodes < _MAX_JSON_NODES:
            nodes += 1
            node = stack.pop()
            if isinstance(node, dict):
                for key, value in node.items():
                    if _is_count(value) and key.lower() in _COUNT_FIELDS:
                        counts.setdefault(key.lower(), value)
                    stack.append(value)
            elif isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, str) and budget > 0:
                strings.append(node[:budget])
                budget -= min(len(node), budget)
                if "{" in node[:_JSON_START_WITHIN]:
                    pending.append(node)


_COUNT_FIELDS: Final = frozenset({"n_prompt_tokens", "n_ctx"})


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value < 10**_MAX_DIGITS


def _parse_json(text: str) -> object:
    """The JSON value that starts at the first ``{`` or ``[`` near the start of
    ``text`` (so ``Error: 400 {...}`` parses too), or None."""
    starts = (text.find("[", 0, _JSON_START_WITHIN), text.find("{", 0, _JSON_START_WITHIN))
    for start in sorted(i for i in starts if i >= 0):
        try:
            value, _ = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):  # RecursionError: pathologically deep nesting
            continue
        return value
    return None


_DECODER: Final = json.JSONDecoder()


# Patterns. All run on lower-cased text, ASCII digits only, with bounded repetition.

_FLAGS: Final = re.ASCII
_NUM: Final = r"(\d(?:[\d,]{0,18}\d)?)"  # 208310, or 1,048,576


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    digits = text.replace(",", "")
    return int(digits) if len(digits) <= _MAX_DIGITS else None


def _add(*parts: int | None) -> int | None:
    return None if any(part is None for part in parts) else sum(p for p in parts if p)


def _found(
    provider: str | None, pattern: str, requested: int | None = None, limit: int | None = None
) -> OverflowMatch:
    return OverflowMatch(True, provider, pattern, requested, limit)


def _with_reserved_output(
    provider: str | None,
    pattern: str,
    input_tokens: int | None,
    output: int | None,
    limit: int | None,
) -> OverflowMatch:
    """An input that overflows only with the output it reserves. A smaller input fits,
    unless the reserved output alone fills the window: that is an output cap (lower
    ``max_tokens``), and no compaction can help."""
    if output is not None and limit is not None and output >= limit:
        return NOT_OVERFLOW
    return _found(provider, pattern, _add(input_tokens, output), limit)


_RATE_LIMIT: Final = re.compile(
    r"tokens per min|requests per min|\btpm\b|\brpm\b|rate[ _-]?limit"
    r"|exceeded your current quota|too many requests|resource_exhausted",
    _FLAGS,
)
_OUTPUT_CAP: Final = re.compile(
    r"max_tokens is too large|completion tokens, whereas|maximum allowed number of output tokens"
    r"|maximum tokens you requested exceeds",
    _FLAGS,
)

_BEDROCK_HINT: Final = re.compile(
    r"validationexception|bedrock|the model returned the following errors", _FLAGS
)
_AZURE_HINT: Final = re.compile(r"azure|\(context_length_exceeded\)|\bmodel_error\b", _FLAGS)
_QUOTE: Final = r"""\\?["']"""  # a JSON or Python-repr quote, possibly escaped
_VLLM_TYPE: Final = re.compile(rf"{_QUOTE}type{_QUOTE}\s*:\s*{_QUOTE}badrequesterror", _FLAGS)
_DEEPSEEK_CODE: Final = re.compile(
    rf"{_QUOTE}code{_QUOTE}\s*:\s*{_QUOTE}invalid_request_error", _FLAGS
)

_LLAMA_SIZES: Final = re.compile(
    rf"request \({_NUM} tokens\) exceeds the available context size \({_NUM} tokens\)", _FLAGS
)
_LLAMA_N_PROMPT: Final = re.compile(r"n_prompt_tokens\W{0,4}(\d{1,15})", _FLAGS)
_LLAMA_N_CTX: Final = re.compile(r"n_ctx\W{0,4}(\d{1,15})", _FLAGS)
_VLLM_MAX_TOKENS: Final = re.compile(
    rf"is too large:\s*{_NUM}[^0-9]{{0,40}}?maximum context length is {_NUM} tokens"
    rf" and your request has {_NUM} input tokens",
    _FLAGS,
)
_VLLM_TOO_LONG_TO_FIT: Final = re.compile(
    rf"prompt \(total length {_NUM}\) is too long to fit into the model \(context length {_NUM}\)",
    _FLAGS,
)
_PROMPT_TOO_LONG: Final = re.compile(
    rf"prompt is too long:\s*{_NUM}\s*tokens?\s*>\s*{_NUM}", _FLAGS
)
_INPUT_AND_MAX_TOKENS: Final = re.compile(
    rf"exceed context limit:\s*{_NUM}\s*\+\s*{_NUM}\s*>\s*{_NUM}", _FLAGS
)
_CONFIGURED_LIMIT: Final = re.compile(
    rf"input tokens exceed the configured limit of {_NUM} tokens", _FLAGS
)
_RESULTED_IN: Final = re.compile(rf"resulted in {_NUM} tokens", _FLAGS)
_GEMINI_COUNT: Final = re.compile(
    rf"input token count(?: \({_NUM}\))? exceeds the maximum number of tokens allowed"
    rf"(?: \({_NUM}\))?",
    _FLAGS,
)
_VERTEX_COUNT: Final = re.compile(
    rf"input token count is {_NUM} but (?:the )?model only supports up to {_NUM}", _FLAGS
)
_MISTRAL: Final = re.compile(
    rf"prompt contains {_NUM} tokens(?: and {_NUM} draft tokens)?[^.]{{0,40}}?"
    rf"too large for model with {_NUM} maximum context length",
    _FLAGS,
)
_XAI: Final = re.compile(
    rf"maximum prompt length is {_NUM} but the request contains {_NUM} tokens", _FLAGS
)
_BEDROCK_MAX_INPUT: Final = re.compile(rf"max input tokens:?\s*{_NUM}", _FLAGS)
_BEDROCK_INPUT_COUNT: Final = re.compile(rf"request input token count:?\s*{_NUM}", _FLAGS)
_OLLAMA_INPUT: Final = re.compile(
    rf"input length exceeds (?:the )?(?:maximum )?context length(?::\s*{_NUM})?", _FLAGS
)
_INPUT_LENGTH_MAXIMUM: Final = re.compile(
    rf"input length {_NUM} exceeds the maximum length {_NUM}", _FLAGS
)
_ALLOWED_INPUT_LENGTH: Final = re.compile(
    rf"input length {_NUM} exceeds (?:the )?maximum allowed input length of {_NUM} tokens?", _FLAGS
)
_INPUT_LENGTH_PARENTHESISED: Final = re.compile(
    rf"input length \({_NUM}\) exceeds (?:the )?model'?s maximum context length \({_NUM}\)", _FLAGS
)
_MANTLE: Final = re.compile(
    rf"prompt tokens \({_NUM}\) exceed (?:customer )?model maximum \({_NUM}\)", _FLAGS
)
_CURRENT_LENGTH: Final = re.compile(rf"current length is {_NUM} while limit is {_NUM}", _FLAGS)
_SGLANG_INPUT: Final = re.compile(
    rf"input \({_NUM} tokens?\) is longer than the model'?s context length \({_NUM}(?: tokens?)?\)",
    _FLAGS,
)
_SGLANG_TOTAL: Final = re.compile(
    rf"requested token count exceeds the model'?s maximum context length of {_NUM} tokens"
    rf"(?:\. you requested a total of {_NUM} tokens: {_NUM} tokens from the input messages"
    rf" and {_NUM} tokens for the completion)?",
    _FLAGS,
)
_MOONSHOT: Final = re.compile(
    rf"exceeded model token limit:?\s*{_NUM}(?:\s*\(requested:?\s*{_NUM}\))?", _FLAGS
)
_COPILOT: Final = re.compile(rf"prompt token count of {_NUM} exceeds the limit of {_NUM}", _FLAGS)
_N_KEEP: Final = re.compile(rf"n_keep\W{{0,4}}{_NUM}\)?\s*>=\s*n_ctx\W{{0,4}}{_NUM}", _FLAGS)
_KEEP_FIRST: Final = re.compile(
    rf"keep the first {_NUM} tokens when context the overflows\.[^0-9]{{0,80}}?"
    rf"context length of only {_NUM} tokens",
    _FLAGS,
)
_TGI_TOTAL: Final = re.compile(
    rf"`?inputs`? tokens \+ `?max_new_tokens`? must be <= {_NUM}"
    rf"(?:\. given: {_NUM} `?inputs`? tokens and {_NUM} `?max_new_tokens`?)?",
    _FLAGS,
)
_TGI_INPUT: Final = re.compile(
    rf"`?inputs`? must have less than {_NUM} tokens\. given: {_NUM}", _FLAGS
)
_DS4: Final = re.compile(
    rf"prompt has {_NUM} tokens?, but the configured context size is {_NUM} tokens?", _FLAGS
)
_MAX_CONTEXT: Final = re.compile(rf"maximum context length is {_NUM} tokens", _FLAGS)
_REQUESTED: Final = re.compile(
    rf"(?:requested (?:about )?|resulted in |request has |request contains |input has )"
    rf"{_NUM} (?:input )?tokens",
    _FLAGS,
)
_VLLM_REQUEST_HAS: Final = re.compile(rf"your request has {_NUM} input tokens", _FLAGS)
_GENERIC: Final = re.compile(
    r"context[ _-]?(?:length|window)[ _-]?(?:exceeded|overflow)"
    r"|exceed(?:s|ed)? (?:the |its |your )?(?:model'?s? )?(?:maximum |max )?"
    r"context (?:length|window|limit|size)"
    r"|context (?:length|window) (?:limit )?(?:has been |was |is )?exceeded"
    r"|too long for (?:the )?(?:model'?s? )?(?:available )?context"
    r"|longer than the model'?s context length",
    _FLAGS,
)
# The reason phrases of HTTP 413, and the OpenAI SDK's text for a 413 with no body.
_HTTP_413_TEXT: Final = re.compile(
    r"request entity too large|payload too large|\b413 (?:status code )?\(no body\)", _FLAGS
)


# Provider rules, tried in order


def _llama_cpp(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "exceed_context_size_error" in text or "exceeds the available context size" in text:
        sizes = _LLAMA_SIZES.search(text)
        requested = body.counts.get("n_prompt_tokens") or _field(_LLAMA_N_PROMPT, text)
        limit = body.counts.get("n_ctx") or _field(_LLAMA_N_CTX, text)
        if sizes is not None:
            requested = requested or _int(sizes[1])
            limit = limit or _int(sizes[2])
        return _found(LLAMA_CPP, "llama_cpp_exceed_context_size", requested, limit)
    if "input is too large to process" in text and "physical batch size" in text:
        return _found(LLAMA_CPP, "llama_cpp_physical_batch_size")
    return None


def _field(pattern: re.Pattern[str], text: str) -> int | None:
    found = pattern.search(text)
    return None if found is None else _int(found[1])


def _vllm(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "is too large:" in text and "your request has" in text:
        found = _VLLM_MAX_TOKENS.search(text)
        if found is not None:
            return _with_reserved_output(
                VLLM,
                "vllm_max_tokens_exceed_context",
                _int(found[3]),
                _int(found[1]),
                _int(found[2]),
            )
    if "too long to fit into the model" in text:
        found = _VLLM_TOO_LONG_TO_FIT.search(text)
        if found is not None:
            return _found(VLLM, "vllm_prompt_too_long_to_fit", _int(found[1]), _int(found[2]))
    return None


def _lm_studio(body: _Body) -> OverflowMatch | None:
    """LM Studio (llama.cpp underneath) cannot keep the prompt's protected prefix in
    the loaded context: "(n_keep: 10247 >= n_ctx: 4096)"."""
    text = body.text
    if (
        "tokens to keep from the initial prompt is greater than the context length" in text
        or "cannot truncate prompt with n_keep" in text
    ):
        found = _N_KEEP.search(text)
        if found is None:
            return _found(LM_STUDIO, "tokens_to_keep_exceed_context_length")
        return _found(
            LM_STUDIO, "tokens_to_keep_exceed_context_length", _int(found[1]), _int(found[2])
        )
    if "when context the overflows" in text:
        found = _KEEP_FIRST.search(text)
        if found is not None:
            return _found(
                LM_STUDIO, "keep_first_tokens_exceed_context_length", _int(found[1]), _int(found[2])
            )
    return None


def _ds4(body: _Body) -> OverflowMatch | None:
    if "the configured context size is" not in body.text:
        return None
    found = _DS4.search(body.text)
    if found is None:
        return None
    return _found(DS4, "prompt_exceeds_configured_context_size", _int(found[1]), _int(found[2]))


def _huggingface_tgi(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "inputs" not in text or "must" not in text:
        return None
    found = _TGI_TOTAL.search(text)
    if found is not None:
        limit = _int(found[1])
        if found[2] is None:
            return _found(HUGGINGFACE_TGI, "inputs_and_max_new_tokens_exceed_total", None, limit)
        return _with_reserved_output(
            HUGGINGFACE_TGI,
            "inputs_and_max_new_tokens_exceed_total",
            _int(found[2]),
            _int(found[3]),
            limit,
        )
    found = _TGI_INPUT.search(text)
    if found is not None:
        return _found(
            HUGGINGFACE_TGI, "inputs_exceed_max_input_length", _int(found[2]), _int(found[1])
        )
    return None


def _sglang(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "is longer than the model" in text:
        found = _SGLANG_INPUT.search(text)
        if found is not None:
            return _found(
                SGLANG, "input_longer_than_context_length", _int(found[1]), _int(found[2])
            )
    if "requested token count exceeds the model" in text:
        found = _SGLANG_TOTAL.search(text)
        if found is not None:
            limit = _int(found[1])
            if found[3] is None:
                return _found(SGLANG, "requested_token_count_exceeds_context_length", None, limit)
            return _with_reserved_output(
                SGLANG,
                "requested_token_count_exceeds_context_length",
                _int(found[3]),
                _int(found[4]),
                limit,
            )
    return None


def _anthropic(body: _Body) -> OverflowMatch | None:
    text = body.text
    relayed = _BEDROCK_HINT.search(text) is not None
    if "prompt is too long" in text:
        found = _PROMPT_TOO_LONG.search(text)
        if found is not None:
            provider = BEDROCK if relayed else ANTHROPIC
            return _found(provider, "prompt_is_too_long", _int(found[1]), _int(found[2]))
        # Bare "Prompt is too long" is Anthropic's word only with Anthropic's error type.
        bare = BEDROCK if relayed else ANTHROPIC if "invalid_request_error" in text else None
        return _found(bare, "prompt_is_too_long")
    if "exceed context limit" in text and "max_tokens" in text:
        found = _INPUT_AND_MAX_TOKENS.search(text)
        provider = BEDROCK if relayed else ANTHROPIC
        if found is None:
            return _found(provider, "input_and_max_tokens_exceed_context_limit")
        return _with_reserved_output(
            provider,
            "input_and_max_tokens_exceed_context_limit",
            _int(found[1]),
            _int(found[2]),
            _int(found[3]),
        )
    if "request size exceeds model context window" in text:
        return _found(ANTHROPIC, "request_size_exceeds_context_window")
    if "request_too_large" in text or "request exceeds the maximum size" in text:
        # 413: the request is over the byte limit (32 MB); shrinking it is the cure.
        return _found(ANTHROPIC, "request_too_large")
    return None


def _openai(body: _Body) -> OverflowMatch | None:
    text = body.text
    provider = AZURE_OPENAI if _AZURE_HINT.search(text) else OPENAI
    if "input tokens exceed the configured limit" in text:
        limit = _field(_CONFIGURED_LIMIT, text)
        requested = _field(_RESULTED_IN, text)
        return _found(provider, "input_tokens_exceed_configured_limit", requested, limit)
    if "exceeds the context window of this model" in text:
        return _found(provider, "input_exceeds_context_window")
    return None


def _gemini(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "input token count" not in text:
        return None
    found = _GEMINI_COUNT.search(text)
    if found is not None:
        return _found(GEMINI, "input_token_count_exceeds_maximum", _int(found[1]), _int(found[2]))
    found = _VERTEX_COUNT.search(text)
    if found is not None:
        return _found(GEMINI, "input_token_count_exceeds_model", _int(found[1]), _int(found[2]))
    return None


def _mistral(body: _Body) -> OverflowMatch | None:
    if "too large for model with" not in body.text:
        return None
    found = _MISTRAL.search(body.text)
    if found is None:
        return None
    requested = _add(_int(found[1]), _int(found[2]) or 0)
    return _found(MISTRAL, "prompt_too_large_for_model", requested, _int(found[3]))


def _xai(body: _Body) -> OverflowMatch | None:
    if "maximum prompt length is" not in body.text:
        return None
    found = _XAI.search(body.text)
    if found is None:
        return None
    return _found(XAI, "maximum_prompt_length", _int(found[2]), _int(found[1]))


def _bedrock(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "model maximum" in text:
        # Bedrock Mantle (its OpenAI-compatible endpoint). Without both counts (Codex
        # keeps "prompt tokens (many) exceed ..." an ordinary invalid request) it is
        # left to the other rules.
        found = _MANTLE.search(text)
        if found is not None:
            return _found(
                BEDROCK, "prompt_tokens_exceed_model_maximum", _int(found[1]), _int(found[2])
            )
    if "input is too long for requested model" in text:
        return _found(BEDROCK, "input_is_too_long_for_requested_model")
    if "too many input tokens" in text:
        provider = BEDROCK if _BEDROCK_HINT.search(text) else None
        requested = _field(_BEDROCK_INPUT_COUNT, text)
        limit = _field(_BEDROCK_MAX_INPUT, text)
        return _found(provider, "too_many_input_tokens", requested, limit)
    return None


def _ollama(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "input length exceeds" in text:
        found = _OLLAMA_INPUT.search(text)
        if found is not None:
            return _found(OLLAMA, "input_length_exceeds_context_length", None, _int(found[1]))
    if "prompt too long; exceeded" in text and "context length" in text:
        return _found(OLLAMA, "prompt_too_long_exceeded_context_length")
    return None


def _minimax(body: _Body) -> OverflowMatch | None:
    # "(2013)" after it is MiniMax's error code, not a token count: no sizes are read.
    if "context window exceeds limit" in body.text:
        return _found(MINIMAX, "context_window_exceeds_limit")
    return None


def _moonshot(body: _Body) -> OverflowMatch | None:
    if "exceeded model token limit" not in body.text:
        return None
    found = _MOONSHOT.search(body.text)
    if found is None:
        return _found(MOONSHOT, "exceeded_model_token_limit")
    return _found(MOONSHOT, "exceeded_model_token_limit", _int(found[2]), _int(found[1]))


def _github_copilot(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "exceeds the limit of" in text:
        found = _COPILOT.search(text)
        if found is not None:
            return _found(
                GITHUB_COPILOT, "prompt_token_count_exceeds_limit", _int(found[1]), _int(found[2])
            )
    if "model_max_prompt_tokens_exceeded" in text:
        return _found(GITHUB_COPILOT, "model_max_prompt_tokens_exceeded")
    return None


def _input_length_maximum(body: _Body) -> OverflowMatch | None:
    text = body.text
    if "maximum allowed input length" in text:
        found = _ALLOWED_INPUT_LENGTH.search(text)
        if found is not None:
            relayed = OPENROUTER if "provider returned error" in text else None
            return _found(
                relayed,
                "input_length_exceeds_maximum_allowed_input_length",
                _int(found[1]),
                _int(found[2]),
            )
    if "exceeds the maximum length" in text:
        found = _INPUT_LENGTH_MAXIMUM.search(text)
        if found is not None:
            return _found(
                None, "input_length_exceeds_maximum_length", _int(found[1]), _int(found[2])
            )
    if "maximum context length (" in text:
        found = _INPUT_LENGTH_PARENTHESISED.search(text)
        if found is not None:
            return _found(
                None, "input_length_exceeds_maximum_context_length", _int(found[1]), _int(found[2])
            )
    return None


def _maximum_context_length(body: _Body) -> OverflowMatch | None:
    """OpenAI's wording, shared by Azure, DeepSeek, vLLM, OpenRouter and many servers."""
    text = body.text
    if "maximum context length is" not in text:
        return None
    found = _MAX_CONTEXT.search(text)
    if found is None:
        return None
    # Bounded: the requested size follows the limit within the same sentence or two.
    requested = _field(_REQUESTED, text[found.end() : found.end() + 400])
    if "endpoint's maximum context length" in text:
        return _found(OPENROUTER, "endpoint_maximum_context_length", requested, _int(found[1]))
    return _found(_openai_family(text), "maximum_context_length", requested, _int(found[1]))


def _openai_family(text: str) -> str:
    if _BEDROCK_HINT.search(text):
        return BEDROCK
    if _AZURE_HINT.search(text):
        return AZURE_OPENAI
    if "deepseek" in text or _DEEPSEEK_CODE.search(text):
        return DEEPSEEK
    if _VLLM_TYPE.search(text) or _VLLM_REQUEST_HAS.search(text):
        return VLLM
    if "context_length_exceeded" in text:
        return OPENAI
    return OPENAI_COMPATIBLE


def _groq_cerebras(body: _Body) -> OverflowMatch | None:
    """Groq's and Cerebras's "Please reduce the length of the messages or completion".
    Tried after OpenAI's wording, which ends with the same sentence."""
    text = body.text
    if "current length is" in text:
        found = _CURRENT_LENGTH.search(text)
        if found is not None:
            return _found(CEREBRAS, "current_length_exceeds_limit", _int(found[1]), _int(found[2]))
    if "reduce the length of the messages or completion" in text:
        return _found(GROQ, "reduce_length_of_messages_or_completion")
    return None


def _context_length_exceeded_code(body: _Body) -> OverflowMatch | None:
    if "context_length_exceeded" not in body.text:
        return None
    provider = AZURE_OPENAI if _AZURE_HINT.search(body.text) else OPENAI
    return _found(provider, "context_length_exceeded")


# Generic rules, tried only when the text names no output cap


def _generic(body: _Body) -> OverflowMatch | None:
    if "context" not in body.text or _GENERIC.search(body.text) is None:
        return None
    return _found(None, "context_exceeded")


def _http_413(body: _Body) -> OverflowMatch | None:
    if body.status == 413 or _HTTP_413_TEXT.search(body.text):
        return _found(None, "http_413_too_large")
    return None


_Rule = Callable[[_Body], OverflowMatch | None]

_PROVIDER_RULES: Final[tuple[_Rule, ...]] = (
    _llama_cpp,
    _lm_studio,
    _ds4,
    _huggingface_tgi,
    _vllm,
    _sglang,
    _anthropic,
    _openai,
    _gemini,
    _mistral,
    _xai,
    _bedrock,
    _ollama,
    _minimax,
    _moonshot,
    _github_copilot,
    _input_length_maximum,
    _maximum_context_length,
    _groq_cerebras,
    _context_length_exceeded_code,
)
_GENERIC_RULES: Final[tuple[_Rule, ...]] = (_generic, _http_413)
