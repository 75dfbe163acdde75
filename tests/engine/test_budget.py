"""Budget and overflow maths."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.accounting import budget
from app.engine.accounting.budget import Accounting, Thresholds, Window, estimate, verdict


@pytest.mark.parametrize(
    ("window", "usable"),
    [
        (Window(200_000, 64_000), 168_000),  # min(64000, 32000) reserved
        (Window(200_000, 8_192), 191_808),
        (Window(128_000, 16_384), 111_616),
        (Window(400_000, 128_000, input_limit=272_000), 272_000),  # input_limit wins
        (Window(8_192, 4_096, input_limit=6_000), 6_000),
        (Window(1_000, 5_000), 1),  # never zero or negative
    ],
)
def test_usable_tokens(window: Window, usable: int) -> None:
    assert window.usable_tokens == usable


USABLE = Window(context_window=200_000, max_output_tokens=8_192, input_limit=100_000)


def act(estimated: int, thresholds: Thresholds | None = None) -> budget.Verdict:
    return verdict(Accounting(context_tokens=estimated), USABLE, thresholds or Thresholds())


@pytest.mark.parametrize(
    ("estimated", "action"),
    [
        (0, "none"),
        (66_892, "none"),  # trigger 100000-16384=83616; prune from 0.8 of it = 66892.8
        (66_893, "prune"),
        (83_615, "prune"),
        (83_616, "compact"),
        (94_999, "compact"),
        (95_000, "emergency"),  # 0.95 of the usable budget
        (150_000, "emergency"),
    ],
)
def test_verdict_actions_at_boundaries(estimated: int, action: str) -> None:
    v = act(estimated)
    assert v.action == action
    assert v.threshold_tokens == 83_616
    assert v.usable_tokens == 100_000
    assert v.estimated_tokens == estimated


def test_overflow_is_beyond_the_usable_budget() -> None:
    assert not act(100_000).overflow
    assert act(100_001).overflow
    assert act(100_001).fraction == 1.0
    assert act(12_345).fraction == 0.1235


def test_threshold_fraction_wins_over_reserve() -> None:
    t = Thresholds(reserve_tokens=1_000, threshold=0.5)
    assert act(49_999, t).action == "prune"
    assert act(50_000, t).action == "compact"
    assert act(50_000, t).threshold_tokens == 50_000
    assert act(39_999, t).action == "none"
    assert act(40_000, t).action == "prune"
    # Without the fraction, the reserve decides.
    assert act(50_000, Thresholds(reserve_tokens=1_000)).action == "none"
    assert act(99_000, Thresholds(reserve_tokens=1_000, emergency_fraction=1.0)).action == "compact"


def test_trigger_never_falls_below_a_tenth_of_the_budget() -> None:
    assert Thresholds(reserve_tokens=99_000).trigger_tokens(100_000) == 10_000
    assert Thresholds(threshold=0.01).trigger_tokens(100_000) == 10_000


def test_estimate_without_a_report_is_calibrated_stored_tokens_plus_overhead() -> None:
    assert estimate(Accounting(context_tokens=1_000)) == 1_000
    assert (
        estimate(Accounting(context_tokens=1_000, calibration_factor=1.25, overhead_tokens=300))
        == 1_550
    )


def test_estimate_with_a_report_uses_it_as_the_base() -> None:
    acc = Accounting(
        context_tokens=1_200,
        calibration_factor=1.5,
        overhead_tokens=999,  # already inside the reported prompt
        reported_prompt_tokens=5_000,
        context_tokens_at_report=1_000,
    )
    assert estimate(acc) == 5_000 + 300
    shrunk = dataclasses.replace(acc, context_tokens=200)
    assert estimate(shrunk) == 5_000 - 1_200
    gone = dataclasses.replace(acc, context_tokens=0, reported_prompt_tokens=100)
    assert estimate(gone) == 0
    # A report alone, without the count it was taken at, is not a base.
    half = dataclasses.replace(acc, context_tokens_at_report=None)
    assert estimate(half) == round(1_200 * 1.5) + 999


def test_estimate_is_constant_time_over_running_totals() -> None:
    params = list(inspect.signature(estimate).parameters)
    assert params == ["acc"]
    for f in dataclasses.fields(Accounting):
        assert f.type in ("int", "float", "int | None"), f"{f.name} is {f.type}"


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 300_000),
    st.integers(0, 300_000),
    st.integers(1_000, 2_000_000),
    st.floats(0.05, 1.0),
)
def test_actions_grow_with_the_estimate(low: int, high: int, usable: int, threshold: float) -> None:
    low, high = sorted((low, high))
    window = Window(usable, 0)
    thresholds = Thresholds(threshold=threshold)
    order = ["none", "prune", "compact", "emergency"]
    a = verdict(Accounting(context_tokens=low), window, thresholds)
    b = verdict(Accounting(context_tokens=high), window, thresholds)
    assert order.index(a.action) <= order.index(b.action)
    assert b.overflow == (high > usable)
    if b.overflow:
        assert b.action == "emergency"
