"""A session's window, accounting and verdict, from the figures its row stores.

The budget maths (:mod:`app.engine.accounting.budget`) reads plain windows and
totals; a session stores its own window figures (each may be unset, the model's
catalog entry then gives it) and its running totals. :class:`SessionFigures` is
that part of the session row, which the store's session state extends, so every
reader of a session hands the same shape to these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.accounting import budget, catalog
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS


@dataclass(slots=True)
class SessionFigures:
    """What the budget maths reads of a session: its model, its own window figures
    (None: the catalog's) and its running totals."""

    model: str
    context_window: int | None
    max_output_tokens: int | None
    input_limit: int | None
    context_tokens: int
    calibration_factor: float
    overhead_tokens: int
    reported_prompt_tokens: int | None
    context_tokens_at_report: int | None


def window_of(session: SessionFigures, spec: catalog.ModelSpec) -> budget.Window:
    """The session's window: its own figures, else those of ``spec`` (its model's
    entry in the catalog in use)."""
    max_output = session.max_output_tokens or spec.max_output_tokens
    if not spec.known and session.context_window and not session.max_output_tokens:
        # The default cap is the default window's: a quarter of a smaller window.
        max_output = catalog.unknown_max_output(session.context_window)
    return budget.Window(
        context_window=session.context_window or spec.context_window,
        max_output_tokens=max_output,
        input_limit=session.input_limit
        if session.input_limit is not None
        else (spec.input_limit if session.context_window is None else None),
    )


def assumed_window(session: SessionFigures, spec: catalog.ModelSpec) -> bool:
    """Whether the session's window is a default: its model is in no catalog and
    the session does not give its own window."""
    return not spec.known and not session.context_window and not session.input_limit


def accounting_of(session: SessionFigures) -> budget.Accounting:
    """The session's totals as the budget maths reads them. The one source of
    the estimate: ``/overflow``, ``/context``, appends, usage reports and
    compactions all go through here. Every request also carries the reply's
    priming, which the provider counts in its prompt (and the calibration
    compares against), so it is overhead too."""
    return budget.Accounting(
        context_tokens=session.context_tokens,
        calibration_factor=session.calibration_factor,
        overhead_tokens=session.overhead_tokens + REPLY_PRIMING_TOKENS,
        reported_prompt_tokens=session.reported_prompt_tokens,
        context_tokens_at_report=session.context_tokens_at_report,
    )


def verdict_of(
    session: SessionFigures, window: budget.Window, thresholds: budget.Thresholds
) -> budget.Verdict:
    """The verdict from the session's totals, in ``window`` (:func:`window_of`)."""
    return budget.verdict(accounting_of(session), window, thresholds)
