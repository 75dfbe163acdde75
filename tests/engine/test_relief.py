"""The relief policy: a verdict and a session's guards in, the steps out."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.accounting.budget import Action, should_auto_prune, urgent
from app.engine.accounting.relief import (
    FAILURE_LIMIT,
    Guards,
    PruneStep,
    Trigger,
    compaction_step,
    prune_step,
    wanted,
)

ACTIONS: tuple[Action, ...] = get_args(Action)

CALM = Guards(
    prune_auto=True,
    prune_minimum_tokens=20_000,
    context_tool_tokens=50_000,
    prune_checked_tool_tokens=None,
    prune_checked_urgent=None,
    compaction_auto=True,
    compaction_held_seq=None,
    next_seq=10,
    compaction_active=False,
    compaction_failures=0,
)

guards = st.builds(
    Guards,
    prune_auto=st.booleans(),
    prune_minimum_tokens=st.integers(0, 50_000),
    context_tool_tokens=st.integers(0, 200_000),
    prune_checked_tool_tokens=st.none() | st.integers(0, 200_000),
    prune_checked_urgent=st.none() | st.booleans(),
    compaction_auto=st.booleans(),
    compaction_held_seq=st.none() | st.integers(1, 20),
    next_seq=st.integers(1, 20),
    compaction_active=st.booleans(),
    compaction_failures=st.integers(0, FAILURE_LIMIT + 1),
)


def test_a_provider_overflow_always_prunes_with_no_minimum() -> None:
    off = dataclasses.replace(CALM, prune_auto=False, context_tool_tokens=0)
    for action in ACTIONS:
        assert prune_step("overflow", action, off) == PruneStep(urgent=True, minimum_tokens=0)


def test_a_provider_overflow_compacts_whatever_the_guards_say() -> None:
    stuck = dataclasses.replace(
        CALM,
        compaction_held_seq=99,
        compaction_active=True,
        compaction_failures=FAILURE_LIMIT,
    )
    assert compaction_step("overflow", "none", stuck) == "overflow"
    assert (
        compaction_step("overflow", "none", dataclasses.replace(stuck, compaction_auto=False))
        is None
    )


@pytest.mark.parametrize("trigger", ["append", "usage"])
def test_the_verdict_picks_the_compaction(trigger: Trigger) -> None:
    assert compaction_step(trigger, "none", CALM) is None
    assert compaction_step(trigger, "prune", CALM) is None
    assert compaction_step(trigger, "compact", CALM) == "threshold"
    assert compaction_step(trigger, "emergency", CALM) == "emergency"


@pytest.mark.parametrize(
    ("change", "compact", "emergency"),
    [
        ({"compaction_auto": False}, None, None),
        ({"compaction_held_seq": 10}, None, None),  # held until history passes seq 10
        ({"compaction_held_seq": 9}, "threshold", "emergency"),  # history has passed it
        ({"compaction_active": True}, None, "emergency"),
        ({"compaction_failures": FAILURE_LIMIT}, None, "emergency"),
        ({"compaction_failures": FAILURE_LIMIT - 1}, "threshold", "emergency"),
    ],
)
def test_the_loop_guards(
    change: dict[str, object], compact: str | None, emergency: str | None
) -> None:
    g = dataclasses.replace(CALM, **change)  # type: ignore[arg-type]
    assert compaction_step("append", "compact", g) == compact
    assert compaction_step("append", "emergency", g) == emergency


@given(guards, st.sampled_from(ACTIONS), st.sampled_from(["append", "usage"]))
def test_an_automatic_prune_is_the_budgets_rule(
    g: Guards, action: Action, trigger: Trigger
) -> None:
    step = prune_step(trigger, action, g)
    asked = g.prune_auto and should_auto_prune(
        action,
        g.context_tool_tokens,
        g.prune_checked_tool_tokens,
        g.prune_checked_urgent,
        g.prune_minimum_tokens,
    )
    assert (step is not None) == asked
    if step is not None:
        assert step == PruneStep(urgent=urgent(action))


@given(guards, st.sampled_from(ACTIONS), st.sampled_from(["append", "usage", "overflow"]))
def test_relief_is_wanted_when_a_step_is(g: Guards, action: Action, trigger: Trigger) -> None:
    steps = prune_step(trigger, action, g), compaction_step(trigger, action, g)
    assert wanted(trigger, action, g) == any(s is not None for s in steps)
    if action == "none" and trigger != "overflow":
        assert not wanted(trigger, action, g)
