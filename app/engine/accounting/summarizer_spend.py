"""What the summarizer costs: its usage in one shape, added up, and the hourly limit.

The upstream clients (:class:`app.upstream.client.Completion`) report each call's
usage as ``input_tokens`` (the whole prompt, cached parts included: Anthropic's
``cache_read_input_tokens`` and ``cache_creation_input_tokens`` are added to its
``input_tokens``), ``output_tokens``, and ``cache_read_tokens`` (OpenAI's
``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``)
when reported. A compaction's usage is those summed over its calls, and ``calls``
the number of requests sent (counted apart: the usage stays as reported).
:class:`Spend` is that in the shape the API shows.

The operator's limit (``COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR``) is on input
plus output tokens in the current hour bucket: the hour of the clock in UTC, so a
new hour starts from zero (a fixed window, not a sliding one: simple to read back
and to explain, at the price of a burst across an hour's edge).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

CACHED_KEY = "cache_read_tokens"


@dataclass(frozen=True, slots=True)
class Spend:
    """Summarizer usage: requests sent, prompt tokens (cached ones included),
    output tokens, and the prompt tokens the provider read from its cache."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def of(cls, usage: Mapping[str, object] | None, calls: int = 0) -> Spend:
        """The spend of ``calls`` requests whose usage, summed, is ``usage``."""
        if not usage:
            return cls(calls=calls)

        def count(key: str) -> int:
            value = usage.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        return cls(
            calls=calls,
            input_tokens=count("input_tokens"),
            output_tokens=count("output_tokens"),
            cached_tokens=count(CACHED_KEY),
        )

    @property
    def tokens(self) -> int:
        """What the hourly limit counts: input plus output tokens."""
        return self.input_tokens + self.output_tokens

    @property
    def empty(self) -> bool:
        return self == Spend()


def add_usage(total: Mapping[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """``total`` and ``more`` summed key by key."""
    out = dict(total)
    for key, value in more.items():
        out[key] = out.get(key, 0) + value
    return out


def hour_of(now: datetime) -> datetime:
    """The hour bucket ``now`` falls in: its hour's first instant, in UTC."""
    if now.tzinfo is None:
        raise ValueError("an hour bucket needs an aware time")
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def over_limit(spent_tokens: int, limit: int) -> bool:
    """Whether a tenant that spent ``spent_tokens`` this hour may not call the
    summarizer model again until the next hour (``limit`` 0: no limit)."""
    return limit > 0 and spent_tokens >= limit


def limit_note(spent_tokens: int, limit: int, hour: datetime) -> str:
    """Why a compaction used the extractive summarizer, for its notes."""
    return (
        f"summarizer spend limit: the tenant used {spent_tokens} of its {limit} summarizer "
        f"tokens (input + output) in the hour from {hour:%Y-%m-%dT%H:00Z} "
        "(COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR); extractive summary, the model was not "
        "asked"
    )
