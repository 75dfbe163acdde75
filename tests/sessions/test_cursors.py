"""Page cursors: one this service issued pages on; any other is a 422 naming ``cursor``.

A cursor is a client-held string that ends up as query parameters, so it is
forged here every way that once reached Postgres or the driver: times outside
the range a timestamp can hold once moved to UTC (year 1 at +14:00, year 9999
at -14:00), naive times, NULs, wrong shapes, bytes that are not base64 or JSON.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.core import cursors
from app.core.errors import ProblemError
from app.core.settings import Settings
from app.main import create_app
from app.sessions.schemas import SESSION_ID_PATTERN
from app.sessions.service import decode_cursor
from tests.conftest import make_session
from tests.e2e.server import running
from tests.helpers import assert_problem


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def session_cursor(value: object) -> str:
    """A sessions cursor in the issued shape (base64 of a JSON [time, id]) around any value."""
    return _b64(json.dumps(value).encode())


def compaction_cursor(created: str, job_id: str = "6f1c3c3e-8d4b-4c55-9c2e-0f7e2b1d9a10") -> str:
    return _b64(f"{created}|{job_id}".encode())


EDGE_TIMES = [
    "0001-01-01T00:00:00+14:00",  # before year 1 in UTC
    "0001-01-01T13:59:59.999999+14:00",
    "9999-12-31T23:59:59-14:00",  # after year 9999 in UTC
    "9999-12-31T10:00:00.000001-14:00",
    "0001-01-01T00:00:00+23:59:59.999999",
    "9999-12-31T23:59:59.999999-23:59",
]

FORGED_SESSION_CURSORS = [
    *(session_cursor([t, "one"]) for t in EDGE_TIMES),
    session_cursor(["2020-01-01T00:00:00", "one"]),  # naive
    session_cursor(["2020-01-01T00:00:00+00:00", "a\u0000b"]),
    session_cursor(["2020-01-01T00:00:00+00:00", "x" * 129]),
    session_cursor(["2020-01-01T00:00:00+00:00"]),
    session_cursor(["2020-01-01T00:00:00+00:00", "one", "two"]),
    session_cursor([20200101, "one"]),
    session_cursor(["2020-01-01T00:00:00+00:00", 7]),
    session_cursor({"2020-01-01T00:00:00+00:00": "one"}),
    session_cursor(None),
    session_cursor("just a string"),
    _b64(b"\xff\xfe\x00"),
    _b64(b'["2020-01-01T00:00:00+00:00", "one"'),  # cut JSON
    "garbage",
    "!!!",
    "====",
    "",
]

FORGED_COMPACTION_CURSORS = [
    *(compaction_cursor(t) for t in EDGE_TIMES),
    compaction_cursor("2020-01-01T00:00:00"),  # naive
    compaction_cursor("2020-01-01T00:00:00+00:00", "not-a-uuid"),
    compaction_cursor("2020-01-01T00:00:00+00:00|extra"),
    _b64(b"\xff\xfe\x00|\x00"),
    "garbage!",
    "====",
]


def _decoded(
    decode: Callable[[str], tuple[datetime, Any]], raw: str
) -> tuple[datetime, Any] | None:
    """What ``decode`` made of ``raw``, or None when it refused it as a 422 naming the cursor."""
    problem: ProblemError | None = None
    try:
        return decode(raw)
    except ProblemError as exc:
        problem = exc
    body = problem.body(None)
    assert problem.status == 422, body
    assert [e["field"] for e in body["errors"]] == ["cursor"], body
    return None


# --- the decoders: every string either decodes to what can be queried, or is a 422 ---


@hsettings(max_examples=400, deadline=None)
@given(
    raw=st.text(max_size=200)
    | st.binary(max_size=200).map(_b64)
    | st.builds(
        lambda t, sid: session_cursor([t, sid]),
        st.text(max_size=40) | st.datetimes().map(datetime.isoformat),
        st.text(max_size=40) | st.just("one"),
    )
    | st.builds(
        lambda d, minutes: session_cursor(
            [d.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat(), "one"]
        ),
        st.datetimes(),
        st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1),
    )
)
def test_a_sessions_cursor_decodes_to_a_utc_time_or_is_a_422(raw: str) -> None:
    decoded = _decoded(decode_cursor, raw)
    if decoded is None:
        return
    # What reaches Postgres: an aware UTC time (any year Python holds is one
    # Postgres holds) and an id that matches the session id pattern.
    after, sid = decoded
    assert after.utcoffset() == timedelta(0)
    assert re.fullmatch(SESSION_ID_PATTERN, sid)


@hsettings(max_examples=400, deadline=None)
@given(
    raw=st.text(max_size=200)
    | st.binary(max_size=200).map(_b64)
    | st.builds(
        lambda d, minutes, job: compaction_cursor(
            d.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat(), str(job)
        ),
        st.datetimes(),
        st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1),
        st.uuids(),
    )
)
def test_a_compactions_cursor_decodes_to_a_utc_time_or_is_a_422(raw: str) -> None:
    decoded = _decoded(cursors.decode, raw)
    if decoded is not None:
        assert decoded[0].utcoffset() == timedelta(0)


def test_issued_cursors_round_trip_at_the_ends_of_time() -> None:
    for t in ("0001-01-01T00:00:00+00:00", "9999-12-31T23:59:59.999999+00:00"):
        after, sid = decode_cursor(session_cursor([t, "one"]))
        assert (after, sid) == (datetime.fromisoformat(t), "one")
    # The same instant at another offset is the same cursor.
    after, _ = decode_cursor(session_cursor(["2020-01-01T14:00:00+14:00", "one"]))
    assert after == datetime(2020, 1, 1, tzinfo=UTC)


# --- through the API ----------------------------------------------------------


async def test_forged_cursors_are_422_naming_the_cursor(client: httpx.AsyncClient) -> None:
    await make_session(client, id="one")
    await make_session(client, id="two")
    failures = []
    for cursor in FORGED_SESSION_CURSORS:
        r = await client.get("/v1/sessions", params={"cursor": cursor, "limit": 1})
        if cursor == "":
            # An empty cursor is no cursor: the first page.
            assert r.status_code == 200, r.text
            continue
        try:
            assert_problem(r, 422, "cursor")
        except AssertionError as exc:
            failures.append(f"{cursor!r}: {exc}")
    for cursor in FORGED_COMPACTION_CURSORS:
        r = await client.get("/v1/sessions/one/compactions", params={"cursor": cursor})
        try:
            assert_problem(r, 422, "cursor")
        except AssertionError as exc:
            failures.append(f"compactions {cursor!r}: {exc}")
    assert not failures, "\n".join(failures)


async def test_cursors_at_the_ends_of_time_page_normally(client: httpx.AsyncClient) -> None:
    """Well-formed cursors at the edges of the range are not errors: they page."""
    await make_session(client, id="one")
    first = session_cursor(["0001-01-01T00:00:00+00:00", "0"])
    r = await client.get("/v1/sessions", params={"cursor": first})
    assert r.status_code == 200, r.text
    assert [s["id"] for s in r.json()["sessions"]] == ["one"]
    last = session_cursor(["9999-12-31T23:59:59.999999+00:00", "z"])
    r = await client.get("/v1/sessions", params={"cursor": last})
    assert r.status_code == 200, r.text
    assert r.json()["sessions"] == []


settings_for_http = hsettings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def test_any_cursor_over_http_is_a_page_or_a_422(db_url: str, settings: Settings) -> None:
    """Hypothesis against a real server: no cursor, however made, gets a 5xx."""
    with (
        running(create_app(settings, database_url=db_url)) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
    ):
        assert http.post("/v1/sessions", json={"model": "gpt-4o", "id": "one"}).status_code == 201
        seen: dict[int, int] = {}

        @settings_for_http
        @given(
            cursor=st.text(st.characters(exclude_categories=["Cs"]), max_size=120)
            | st.builds(
                lambda d, minutes, sid: session_cursor(
                    [d.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat(), sid]
                ),
                st.datetimes(),
                st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1),
                st.sampled_from(["one", "0", "z", "a\u0000"]),
            )
        )
        def check(cursor: str) -> None:
            r = http.get("/v1/sessions", params={"cursor": cursor})
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            if r.status_code != 200:
                doc: dict[str, Any] = assert_problem(r, 422)
                assert any("cursor" in e["field"] for e in doc["errors"]), doc

        check()
        print(f"\n  statuses over {sum(seen.values())} cursors: {seen}")
        assert set(seen) <= {200, 422}
