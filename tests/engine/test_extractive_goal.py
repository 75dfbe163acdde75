"""The extractive summary's Goal when the summary's ``<user-requests>`` block quotes
the first request (issue 14): said in short, not quoted a second time."""

from __future__ import annotations

from app.engine.compaction.extractive import (
    GOAL_CHARS,
    GOAL_SHORT_CHARS,
    QUOTED_NOTE,
    extractive_summary,
    parse_summary,
)
from app.engine.model import Entry

LONG = (
    "Make the date parser in `src/dates.py` accept ISO week dates such as 2024-W05-3. "
    + "Keep the public API of `parse_date` unchanged and add tests under tests/dates/. " * 30
)


def user(text: str) -> Entry:
    return Entry(role="user", parts=[{"type": "text", "text": text}])


def goal(summary: str) -> str:
    original = parse_summary(summary).original
    assert original is not None
    return original


def test_a_quoted_first_request_is_named_in_short_in_goal() -> None:
    entries = [user(LONG), user("Also handle time zones.")]
    whole = extractive_summary(entries)
    short = extractive_summary(entries, first_request_quoted=True)
    # Without the block the request is quoted at length; with it, only its head.
    assert len(goal(whole)) > GOAL_CHARS - 100
    said = goal(short)
    assert said.endswith(QUOTED_NOTE)
    head = said.removesuffix(QUOTED_NOTE).rstrip()
    assert len(head) <= GOAL_SHORT_CHARS
    assert head.startswith("Make the date parser in `src/dates.py` accept ISO week dates")
    assert head.endswith("…")
    assert len(short) < len(whole) - 1_000
    # The latest request is untouched.
    assert parse_summary(short).latest == ["Also handle time zones."]


def test_a_short_request_is_whole_and_still_pointed_at_the_block() -> None:
    said = goal(
        extractive_summary([user("Fix the crash in app/parser.py.")], first_request_quoted=True)
    )
    assert said == f"Fix the crash in app/parser.py. {QUOTED_NOTE}"


def test_the_short_goal_is_carried_unchanged_across_compactions() -> None:
    previous = extractive_summary([user(LONG)], first_request_quoted=True)
    for n in range(4):
        later = [user(f"Step {n}: go on with week {n}.")]
        summary = extractive_summary(later, previous_summary=previous, first_request_quoted=True)
        assert goal(summary) == goal(previous)
        assert summary.count(QUOTED_NOTE) == 1
        previous = summary


def test_without_the_block_the_note_is_dropped_not_left_pointing_at_nothing() -> None:
    previous = extractive_summary(
        [user("Fix the crash in app/parser.py.")], first_request_quoted=True
    )
    summary = extractive_summary([user("Go on.")], previous_summary=previous)
    assert goal(summary) == "Fix the crash in app/parser.py."
    assert QUOTED_NOTE not in summary


def test_the_note_never_reads_as_the_block_it_points_at() -> None:
    """The next compaction strips the summary's <user-requests> block: a note naming
    the tag would be taken for the block's start and take the sections with it."""
    from app.engine.compaction.summary import KeptRequest, render_user_requests, with_user_requests

    body = extractive_summary([user(LONG)], first_request_quoted=True)
    block = render_user_requests([KeptRequest(1, LONG, first=True)])
    summary = with_user_requests(body, block)
    assert "<user-requests>" not in body
    assert with_user_requests(summary, "") == body.strip()
