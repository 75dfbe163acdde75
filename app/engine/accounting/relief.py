"""Relief: what a session does when its verdict says the window is filling.

One policy for every path that can raise the verdict: an append, a usage
report, a provider's overflow error. A verdict in, the steps out: prune first
(cheap, and it may be all the window needs), then, judged on the verdict after
the prune, compact (an emergency compaction on the spot, or a queued job).
Pure: the caller reads the session, runs the steps, and asks again between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.engine.accounting.budget import Action, should_auto_prune, urgent

Trigger = Literal["append", "usage", "overflow"]
CompactionReason = Literal["threshold", "emergency", "overflow"]

# Failed automatic compactions in a row that turn automatic compaction off
# until a manual one succeeds.
FAILURE_LIMIT = 3


@dataclass(frozen=True, slots=True)
class Guards:
    """What the policy reads of a session besides its verdict."""

    prune_auto: bool  # prune.enabled and prune.auto
    prune_minimum_tokens: int
    context_tool_tokens: int
    prune_checked_tool_tokens: int | None  # the tool tokens when a prune last looked
    prune_checked_urgent: bool | None
    compaction_auto: bool  # compaction.enabled and compaction.auto
    compaction_held_seq: int | None  # held until history reaches past it
    next_seq: int
    compaction_active: bool
    compaction_failures: int


@dataclass(frozen=True, slots=True)
class PruneStep:
    """A prune to run: ``urgent`` drops the protection of the last user turns;
    ``minimum_tokens`` 0 takes any saving (None: the session's minimum)."""

    urgent: bool
    minimum_tokens: int | None = None


def prune_step(trigger: Trigger, action: Action, guards: Guards) -> PruneStep | None:
    """Whether to prune now. A provider's overflow always prunes, with no minimum
    (any saving helps the retry); otherwise only when automatic pruning is on and
    the verdict asks for it with more tool output to find than when it last looked."""
    if trigger == "overflow":
        return PruneStep(urgent=True, minimum_tokens=0)
    if not guards.prune_auto:
        return None
    if not should_auto_prune(
        action,
        guards.context_tool_tokens,
        guards.prune_checked_tool_tokens,
        guards.prune_checked_urgent,
        guards.prune_minimum_tokens,
    ):
        return None
    return PruneStep(urgent=urgent(action))


def compaction_step(trigger: Trigger, action: Action, guards: Guards) -> CompactionReason | None:
    """Whether to compact now, and why.

    A provider's overflow compacts whatever the guards say (the provider refused
    the prompt). Otherwise: ``emergency`` compacts on the spot, ``threshold``
    queues a job unless one is active; and the loop guards hold: after a
    low-yield compaction nothing automatic happens until new history arrives,
    and after ``FAILURE_LIMIT`` failed automatic ones in a row only a manual
    success turns automatic compaction back on.
    """
    if not guards.compaction_auto:
        return None
    if trigger == "overflow":
        return "overflow"
    held = guards.compaction_held_seq
    if held is not None and guards.next_seq <= held:
        return None
    if action == "emergency":
        return "emergency"
    if (
        action == "compact"
        and not guards.compaction_active
        and guards.compaction_failures < FAILURE_LIMIT
    ):
        return "threshold"
    return None


def wanted(trigger: Trigger, action: Action, guards: Guards) -> bool:
    """Whether the verdict ``action`` asks for any relief at all."""
    return (
        prune_step(trigger, action, guards) is not None
        or compaction_step(trigger, action, guards) is not None
    )
