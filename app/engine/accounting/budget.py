"""Budget and overflow maths, from running totals only (docs/how-it-works.md, "Accounting").

The usable input budget is the model's ``input_limit`` when known, else
``context_window - min(max_output_tokens, 32000)``. The estimate is hybrid: the
prompt size the provider last reported is the exact base, and what was appended
since is added from stored counts, corrected by the calibration factor. With no
report yet, the whole stored context is estimated. Everything here is O(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OUTPUT_RESERVE_CAP = 32_000
MIN_TRIGGER_FRACTION = 0.1

Action = Literal["none", "prune", "compact", "emergency"]


@dataclass(frozen=True, slots=True)
class Window:
    context_window: int
    max_output_tokens: int
    input_limit: int | None = None

    @property
    def usable_tokens(self) -> int:
        if self.input_limit:
            return self.input_limit
        return max(1, self.context_window - min(self.max_output_tokens, OUTPUT_RESERVE_CAP))


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When to act. ``threshold`` (a fraction of the usable budget) wins over
    ``reserve_tokens`` when set; ``prune_fraction`` of the trigger starts pruning."""

    reserve_tokens: int = 16_384
    threshold: float | None = None
    emergency_fraction: float = 0.95
    prune_fraction: float = 0.8

    def trigger_tokens(self, usable: int) -> int:
        if self.threshold is not None:
            return max(int(usable * MIN_TRIGGER_FRACTION), int(usable * self.threshold))
        return max(int(usable * MIN_TRIGGER_FRACTION), usable - self.reserve_tokens)


@dataclass(frozen=True, slots=True)
class Accounting:
    """The running totals kept on the session."""

    context_tokens: int  # stored tokens of the entries in the current view
    calibration_factor: float = 1.0
    overhead_tokens: int = 0  # tool schemas and other per-request text never stored
    reported_prompt_tokens: int | None = None  # last exact prompt size from the provider
    context_tokens_at_report: int | None = None  # context_tokens when that report came


@dataclass(frozen=True, slots=True)
class Verdict:
    estimated_tokens: int
    usable_tokens: int
    threshold_tokens: int
    fraction: float
    calibration_factor: float
    overflow: bool
    action: Action


def estimate(acc: Accounting) -> int:
    """The estimated prompt size for the next call."""
    if acc.reported_prompt_tokens is not None and acc.context_tokens_at_report is not None:
        delta = acc.context_tokens - acc.context_tokens_at_report
        return max(0, acc.reported_prompt_tokens + round(delta * acc.calibration_factor))
    return round(acc.context_tokens * acc.calibration_factor) + acc.overhead_tokens


def verdict(acc: Accounting, window: Window, thresholds: Thresholds) -> Verdict:
    usable = window.usable_tokens
    trigger = thresholds.trigger_tokens(usable)
    est = estimate(acc)
    fraction = est / usable
    action: Action
    if fraction >= thresholds.emergency_fraction:
        action = "emergency"
    elif est >= trigger:
        action = "compact"
    elif est >= trigger * thresholds.prune_fraction:
        action = "prune"
    else:
        action = "none"
    return Verdict(
        estimated_tokens=est,
        usable_tokens=usable,
        threshold_tokens=trigger,
        fraction=round(fraction, 4),
        calibration_factor=acc.calibration_factor,
        overflow=est > usable,
        action=action,
    )


CALIBRATION_ALPHA = 0.2
CALIBRATION_MIN = 0.5
CALIBRATION_MAX = 3.0
# A report calibrates only when it can be compared with the counted context: at
# least this many counted tokens (below it, an unstored system prompt or the
# per-message framing is a large share of the prompt, and the ratio says more
# about that than about the tokenizer).
CALIBRATION_MIN_COUNTED = 1_000
# The ratio of reported to counted is clamped into this window before it is
# averaged, never ignored for lying outside it (docs/how-it-works.md): a larger discrepancy
# never gets less correction than a smaller one, one report moves the factor by
# one EMA step toward the window's edge at most, and a discrepancy that persists
# walks the factor to its clamp. The window is wider than the factor's clamp so
# that a persistent ratio beyond the clamp reaches it, not only approaches it.
CALIBRATION_RATIO_MIN = 0.25
CALIBRATION_RATIO_MAX = 4.0


def comparable(actual_tokens: int, counted_tokens: int) -> bool:
    """Whether a report of ``actual_tokens`` can calibrate against ``counted_tokens``."""
    return actual_tokens > 0 and counted_tokens >= CALIBRATION_MIN_COUNTED


def clamped_ratio(actual_tokens: int, counted_tokens: int) -> float:
    """Reported/counted, clamped into [CALIBRATION_RATIO_MIN, CALIBRATION_RATIO_MAX]."""
    ratio = actual_tokens / counted_tokens
    return min(CALIBRATION_RATIO_MAX, max(CALIBRATION_RATIO_MIN, ratio))


def _clamped(value: float) -> float:
    return min(CALIBRATION_MAX, max(CALIBRATION_MIN, value))


def calibrate(factor: float, actual_tokens: int, counted_tokens: int) -> float:
    """The calibration factor after a usage report (docs/how-it-works.md,
    "Accounting, verdicts and pruning").

    ``clamp(0.8 * factor + 0.2 * ratio, 0.5, 3.0)``: an exponential moving
    average (alpha 0.2), slow enough to ride out one odd turn, and bounded so an
    unusual payload cannot run the estimate away. The ratio (actual/counted) is
    clamped into [0.25, 4] first, never ignored for lying outside it: one report
    moves the factor by at most one EMA step toward that window's edge, a ratio
    that persists takes the factor to its clamp, and the factor is monotone in
    the ratio. A report that cannot be compared (see :func:`comparable`: too
    few counted tokens) leaves the factor as it is; its prompt size still
    serves as the estimate's exact base.
    """
    if not comparable(actual_tokens, counted_tokens):
        return factor
    target = clamped_ratio(actual_tokens, counted_tokens)
    updated = factor + CALIBRATION_ALPHA * (target - factor)
    return round(_clamped(updated), 6)


def urgent(action: Action) -> bool:
    """Past the compaction threshold: pruning no longer waits for user turns to end."""
    return action in ("compact", "emergency")


def should_auto_prune(
    action: Action,
    context_tool_tokens: int,
    checked_tool_tokens: int | None,
    checked_urgent: bool | None,
    minimum: int,
) -> bool:
    """Whether an append or usage report should look for tool outputs to prune.

    Only when the verdict asks for relief, and only once enough new tool output
    (``minimum`` tokens) arrived since the last look: with the same rules, what
    was below the minimum then can only have grown by what came since. That
    keeps automatic pruning amortized O(1) per append while the verdict stays.
    The rules loosen when the verdict turns urgent (see :func:`urgent`), so an
    escalation looks again at once.
    """
    if action == "none":
        return False
    if checked_tool_tokens is None:
        return True
    if urgent(action) and not checked_urgent:
        return True
    return context_tool_tokens - checked_tool_tokens >= max(1, minimum)
