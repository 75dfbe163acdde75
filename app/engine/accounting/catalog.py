"""The model catalog: context window, max output and tokenizer per model family.

Lookup is by longest matching prefix of the model name, after dropping a
provider prefix (``openai/``, ``anthropic/``, ``bedrock/…``) and lower-casing,
so dated snapshots (``claude-sonnet-4-20250514``) and provider spellings
(``openrouter/anthropic/claude-sonnet-4``) find their family. Unknown models
get a 128,000-token window, or the operator's default.

An operator's overrides (:class:`Catalog`, built from a file by the service:
``COMPACTD_MODEL_CATALOG``) come first: windows and output caps per model name
or name prefix, matched the same way, longest prefix first. They are data here;
the engine reads no file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from app.engine.accounting.tokens import EncodingName, ImageRule

UNKNOWN_CONTEXT_WINDOW = 128_000
UNKNOWN_MAX_OUTPUT = 16_384
MAX_WINDOW = 100_000_000  # as a session's own context_window


@dataclass(frozen=True, slots=True)
class ModelSpec:
    context_window: int
    max_output_tokens: int
    input_limit: int | None = None
    encoding: EncodingName = "o200k_base"
    known: bool = True
    # Whose rule the model's images are counted by (app.engine.accounting.tokens.image_tokens).
    images: ImageRule = "openai"


# (prefix, context window, max output[, input limit][, encoding])
_CATALOG: list[tuple[str, int, int, int | None, EncodingName]] = [
    # OpenAI
    ("gpt-5", 400_000, 128_000, 272_000, "o200k_base"),
    ("gpt-4.1", 1_047_576, 32_768, None, "o200k_base"),
    ("gpt-4o", 128_000, 16_384, None, "o200k_base"),
    ("chatgpt-4o", 128_000, 16_384, None, "o200k_base"),
    ("gpt-4.5", 128_000, 16_384, None, "o200k_base"),
    ("gpt-oss", 131_072, 32_768, None, "o200k_base"),
    ("o1-mini", 128_000, 65_536, None, "o200k_base"),
    ("o1", 200_000, 100_000, None, "o200k_base"),
    ("o3", 200_000, 100_000, None, "o200k_base"),
    ("o4-mini", 200_000, 100_000, None, "o200k_base"),
    ("codex-mini", 200_000, 100_000, None, "o200k_base"),
    ("gpt-4-turbo", 128_000, 4_096, None, "cl100k_base"),
    ("gpt-4-1106", 128_000, 4_096, None, "cl100k_base"),
    ("gpt-4-0125", 128_000, 4_096, None, "cl100k_base"),
    ("gpt-4-32k", 32_768, 4_096, None, "cl100k_base"),
    ("gpt-4", 8_192, 4_096, None, "cl100k_base"),
    ("gpt-3.5-turbo-16k", 16_385, 4_096, None, "cl100k_base"),
    ("gpt-3.5-turbo", 16_385, 4_096, None, "cl100k_base"),
    # Anthropic
    ("claude-opus-4", 200_000, 32_000, None, "o200k_base"),
    ("claude-sonnet-4", 200_000, 64_000, None, "o200k_base"),
    ("claude-haiku-4", 200_000, 64_000, None, "o200k_base"),
    ("claude-3-7-sonnet", 200_000, 64_000, None, "o200k_base"),
    ("claude-3-5-sonnet", 200_000, 8_192, None, "o200k_base"),
    ("claude-3-5-haiku", 200_000, 8_192, None, "o200k_base"),
    ("claude-3-opus", 200_000, 4_096, None, "o200k_base"),
    ("claude-3-haiku", 200_000, 4_096, None, "o200k_base"),
    ("claude-haiku-3", 200_000, 4_096, None, "o200k_base"),
    ("claude", 200_000, 8_192, None, "o200k_base"),
    # Google
    ("gemini-2.5-pro", 1_048_576, 65_536, None, "o200k_base"),
    ("gemini-2.5-flash", 1_048_576, 65_536, None, "o200k_base"),
    ("gemini-2.0-flash", 1_048_576, 8_192, None, "o200k_base"),
    ("gemini-1.5-pro", 2_097_152, 8_192, None, "o200k_base"),
    ("gemini-1.5-flash", 1_048_576, 8_192, None, "o200k_base"),
    ("gemini-3", 1_048_576, 65_536, None, "o200k_base"),
    ("gemini", 1_048_576, 8_192, None, "o200k_base"),
    ("gemma-3", 131_072, 8_192, None, "o200k_base"),
    ("gemma3", 131_072, 8_192, None, "o200k_base"),  # Ollama's spelling
    # DeepSeek
    ("deepseek-reasoner", 128_000, 64_000, None, "o200k_base"),
    ("deepseek-chat", 128_000, 8_192, None, "o200k_base"),
    ("deepseek-r1", 128_000, 32_768, None, "o200k_base"),
    ("deepseek-v3", 128_000, 8_192, None, "o200k_base"),
    ("deepseek-coder", 128_000, 8_192, None, "o200k_base"),
    ("deepseek", 128_000, 8_192, None, "o200k_base"),
    # Qwen
    ("qwen3-coder", 262_144, 65_536, None, "o200k_base"),
    ("qwen3", 131_072, 32_768, None, "o200k_base"),
    ("qwen2.5-coder", 131_072, 8_192, None, "o200k_base"),
    ("qwen2.5", 131_072, 8_192, None, "o200k_base"),
    ("qwen-max", 32_768, 8_192, None, "o200k_base"),
    ("qwen-plus", 131_072, 8_192, None, "o200k_base"),
    ("qwen-turbo", 1_000_000, 8_192, None, "o200k_base"),
    ("qwq", 131_072, 32_768, None, "o200k_base"),
    # Meta Llama
    ("llama-4-scout", 10_000_000, 16_384, None, "o200k_base"),
    ("llama-4-maverick", 1_048_576, 16_384, None, "o200k_base"),
    ("llama-3.3", 131_072, 8_192, None, "o200k_base"),
    ("llama-3.2", 131_072, 8_192, None, "o200k_base"),
    ("llama-3.1", 131_072, 8_192, None, "o200k_base"),
    ("llama3.3", 131_072, 8_192, None, "o200k_base"),
    ("llama3.2", 131_072, 8_192, None, "o200k_base"),
    ("llama3.1", 131_072, 8_192, None, "o200k_base"),
    ("llama3-3", 131_072, 8_192, None, "o200k_base"),  # Bedrock's spelling
    ("llama3-2", 131_072, 8_192, None, "o200k_base"),
    ("llama3-1", 131_072, 8_192, None, "o200k_base"),
    ("llama-3", 8_192, 4_096, None, "o200k_base"),
    ("llama3", 8_192, 4_096, None, "o200k_base"),
    # Mistral
    ("mistral-large", 131_072, 8_192, None, "o200k_base"),
    ("mistral-medium", 131_072, 8_192, None, "o200k_base"),
    ("mistral-small", 131_072, 8_192, None, "o200k_base"),
    ("codestral", 262_144, 8_192, None, "o200k_base"),
    ("devstral", 131_072, 8_192, None, "o200k_base"),
    ("magistral", 40_000, 40_000, None, "o200k_base"),
    ("ministral", 131_072, 8_192, None, "o200k_base"),
    ("mixtral-8x22b", 65_536, 8_192, None, "o200k_base"),
    ("mixtral", 32_768, 8_192, None, "o200k_base"),
    ("mistral-nemo", 131_072, 8_192, None, "o200k_base"),
    ("mistral", 32_768, 8_192, None, "o200k_base"),
    # Others commonly served through OpenAI-compatible endpoints
    ("grok-4", 256_000, 32_768, None, "o200k_base"),
    ("grok-3", 131_072, 16_384, None, "o200k_base"),
    ("kimi-k2", 131_072, 16_384, None, "o200k_base"),
    ("glm-4", 131_072, 16_384, None, "o200k_base"),
]
_CATALOG.sort(key=lambda row: len(row[0]), reverse=True)

# The providers whose image rule differs from OpenAI's, by normalized name prefix
# (longest first); every other model, known or not, is counted by OpenAI's tiles.
_IMAGE_RULES: tuple[tuple[str, ImageRule], ...] = (
    ("gpt-4o-mini", "openai-mini"),
    ("claude", "anthropic"),
    ("gemini", "gemini"),
    ("gemma", "gemini"),
)


def image_rule(model: str) -> ImageRule:
    """Whose rule ``model``'s images are counted by: Anthropic's for Claude, Google's
    for Gemini and Gemma, gpt-4o-mini's own tile figures, else OpenAI's tiles."""
    name = normalize(model)
    return next((rule for prefix, rule in _IMAGE_RULES if name.startswith(prefix)), "openai")


_BEDROCK_VENDOR = re.compile(r"^(?:[a-z]{2,6}(?:-[a-z]+)?\.)?(?:anthropic|meta|mistral)\.")


def normalize(model: str) -> str:
    """Lower-case, drop provider prefixes (``a/b/model`` → ``model``) and Bedrock's vendor dot."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    # Bedrock: ``anthropic.claude-…``, or with a cross-region inference profile
    # (``us.``, ``eu.``, ``apac.``, ``us-gov.``, ``global.``…) in front.
    name = _BEDROCK_VENDOR.sub("", name, count=1)
    return (
        name.split(":", 1)[0]
        if name.startswith(("llama", "qwen", "mistral", "gemma", "deepseek"))
        else name
    )


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's entry: the window (and output cap, input limit) of the models
    whose normalized name starts with ``prefix``."""

    prefix: str
    context_window: int
    max_output_tokens: int | None = None
    input_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Catalog:
    """The operator's additions to the built-in catalog: ``overrides`` (longest
    prefix first, see :func:`parse_overrides`) win over the built-in entries, and
    ``default_context_window`` is the window of a model found in neither."""

    overrides: tuple[Override, ...] = ()
    default_context_window: int = UNKNOWN_CONTEXT_WINDOW


BUILT_IN = Catalog()

_OVERRIDE_FIELDS = ("context_window", "max_output_tokens", "input_limit")


def _count(entry: str, field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WINDOW:
        raise ValueError(
            f"{entry}: {field} must be a whole number of tokens from 1 to {MAX_WINDOW}"
        )
    return value


def parse_overrides(data: object) -> tuple[Override, ...]:
    """Overrides from a mapping of model name or prefix to ``{"context_window": n,
    "max_output_tokens": m, "input_limit": k}`` (the last two optional), as a JSON
    or TOML file holds them. Raises ValueError naming the first bad entry."""
    if not isinstance(data, Mapping):
        raise ValueError("the catalog must map model names (or prefixes) to their windows")
    found: dict[str, Override] = {}
    for key, spec in data.items():
        entry = repr(key)
        prefix = normalize(key) if isinstance(key, str) else ""
        if not prefix:
            raise ValueError(f"{entry}: not a model name")
        if prefix in found:
            raise ValueError(f"{entry}: names the same models as another entry ({prefix!r})")
        if not isinstance(spec, Mapping):
            raise ValueError(f"{entry}: expected a table such as {{context_window = 8192}}")
        unknown = sorted(str(k) for k in spec if k not in _OVERRIDE_FIELDS)
        if unknown:
            raise ValueError(
                f"{entry}: unknown field {unknown[0]!r} (known: {', '.join(_OVERRIDE_FIELDS)})"
            )
        if "context_window" not in spec:
            raise ValueError(f"{entry}: context_window is required")
        window = _count(entry, "context_window", spec["context_window"])
        max_output = spec.get("max_output_tokens")
        if max_output is not None:
            max_output = _count(entry, "max_output_tokens", max_output)
            if max_output >= window:
                raise ValueError(f"{entry}: max_output_tokens must be smaller than context_window")
        input_limit = spec.get("input_limit")
        if input_limit is not None:
            input_limit = _count(entry, "input_limit", input_limit)
            if input_limit > window:
                raise ValueError(f"{entry}: input_limit must not exceed context_window")
        found[prefix] = Override(prefix, window, max_output, input_limit)
    return tuple(sorted(found.values(), key=lambda o: len(o.prefix), reverse=True))


def unknown_max_output(context_window: int) -> int:
    """The output cap assumed for a window whose model's cap is unknown: 16,384,
    or a quarter of a smaller window (an 8k model keeps most of it for input)."""
    return max(1, min(UNKNOWN_MAX_OUTPUT, context_window // 4))


def _built_in(name: str) -> ModelSpec | None:
    for prefix, window, max_output, input_limit, encoding in _CATALOG:
        if name.startswith(prefix):
            return ModelSpec(window, max_output, input_limit, encoding, images=image_rule(name))
    return None


@functools.lru_cache(maxsize=1024)
def lookup(model: str, catalog: Catalog = BUILT_IN) -> ModelSpec:
    """The catalog entry for ``model``: the operator's override when one matches,
    else the built-in entry, else the default window (``known`` False).
    Remembered (a few times per request, a scan of the catalog each)."""
    name = normalize(model)
    built_in = _built_in(name)
    for override in catalog.overrides:
        if name.startswith(override.prefix):
            window = override.context_window
            max_output = override.max_output_tokens
            if max_output is None:
                if built_in is not None and built_in.max_output_tokens < window:
                    max_output = built_in.max_output_tokens
                else:
                    max_output = unknown_max_output(window)
            encoding = built_in.encoding if built_in is not None else "o200k_base"
            return ModelSpec(
                window, max_output, override.input_limit, encoding, images=image_rule(name)
            )
    if built_in is not None:
        return built_in
    window = catalog.default_context_window
    return ModelSpec(
        window,
        unknown_max_output(window),
        None,
        "o200k_base",
        known=False,
        images=image_rule(name),
    )
