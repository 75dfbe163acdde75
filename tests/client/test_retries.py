"""The client's retries, against real failures: a relay (tests/client/relay.py) between
the client and a real compactd drops connections and answers 429 and 503, and the
server behind it does what it would do. A retried append is stored once because each
retry carries the first attempt's ``Idempotency-Key``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from compactd_client import AsyncCompactd, Compactd, InvalidRequestError, ProblemError

from tests.client.relay import Answer, Drop, Relay, relay_to

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Run the tests."},
    {"role": "assistant", "content": "All 12 pass."},
]
FAST = 0.01  # seconds of backoff: the waits are not under test (Retry-After is)


@pytest.fixture
def relay(compactd_url: str) -> Iterator[Relay]:
    with relay_to(compactd_url) as r:
        yield r


@pytest.fixture
def direct(compactd_url: str) -> Iterator[Compactd]:
    """A client that talks to compactd itself, to see what it stored."""
    with Compactd(compactd_url, max_retries=0) as api:
        yield api


def stored(direct: Compactd, sid: str) -> list[dict[str, Any]]:
    return [e["message"] for e in direct.list_messages(sid)["entries"]]


def keys(relay: Relay) -> list[str | None]:
    return [seen.headers.get("idempotency-key") for seen in relay.seen]


def test_an_append_whose_connection_dropped_is_stored_once(relay: Relay, direct: Compactd) -> None:
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Drop()])  # compactd stores it; the client never hears back
    with Compactd(relay.url, backoff=FAST) as api:
        result = api.append_messages(sid, MESSAGES)
    assert stored(direct, sid) == MESSAGES  # once, not twice
    history = direct.list_messages(sid)["entries"]
    assert [e["id"] for e in result["entries"]] == [e["id"] for e in history]
    assert [s.method for s in relay.seen] == ["POST", "POST"]
    first, retry = keys(relay)
    assert first is not None
    assert retry == first


async def test_an_async_append_answered_503_after_it_was_stored_is_stored_once(
    relay: Relay, direct: Compactd
) -> None:
    """A gateway in front gave up on the answer (503, Retry-After: 1) after compactd
    had stored the append: the retry waits the second, then gets the first answer."""
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Answer(503, {"Retry-After": "1"}, forwarded=True)])
    async with AsyncCompactd(relay.url, backoff=FAST) as api:
        result = await api.append_messages(sid, MESSAGES)
    assert stored(direct, sid) == MESSAGES
    assert [e["seq"] for e in result["entries"]] == [1, 2]
    first, retry = relay.seen
    assert retry.headers["idempotency-key"] == first.headers["idempotency-key"]
    waited = retry.at - first.at
    print(f"\n[retry] waited {waited:.2f} s after a 503 with Retry-After: 1")
    assert waited >= 1.0  # the client slept at least Retry-After before retrying


async def test_an_async_append_whose_connection_dropped_is_stored_once(
    relay: Relay, direct: Compactd
) -> None:
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Drop(), Drop()])
    async with AsyncCompactd(relay.url, backoff=FAST) as api:
        await api.append_messages(sid, MESSAGES)
    assert stored(direct, sid) == MESSAGES
    assert len(set(keys(relay))) == 1
    assert len(relay.seen) == 3


def test_a_429_is_retried_and_each_logical_call_has_its_own_key(
    relay: Relay, direct: Compactd
) -> None:
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Answer(429, {"Retry-After": "0"})])  # refused before compactd saw it
    with Compactd(relay.url, backoff=FAST) as api:
        api.append_messages(sid, MESSAGES[:1])
        api.append_messages(sid, MESSAGES[1:])
    assert stored(direct, sid) == MESSAGES
    first, retry, second = keys(relay)
    assert first == retry
    assert second not in (None, first)


def test_a_key_given_by_the_caller_is_used_for_every_attempt(
    relay: Relay, direct: Compactd
) -> None:
    """The caller's own key spans its own retries too: the same append sent twice
    with one key (an agent that restarted mid-turn) is stored once."""
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Drop()])
    with Compactd(relay.url, backoff=FAST) as api:
        once = api.append_messages(sid, MESSAGES, idempotency_key="turn-7")
        again = api.append_messages(sid, MESSAGES, idempotency_key="turn-7")
    assert again == once
    assert stored(direct, sid) == MESSAGES
    assert keys(relay) == ["turn-7"] * 3


def test_retries_end_with_the_last_problem(relay: Relay, direct: Compactd) -> None:
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Answer(503)] * 3)
    with (
        Compactd(relay.url, max_retries=2, backoff=FAST) as api,
        pytest.raises(ProblemError) as failed,
    ):
        api.append_messages(sid, MESSAGES)
    assert failed.value.status == 503
    assert len(relay.seen) == 3
    assert stored(direct, sid) == []  # never reached compactd


def test_a_retry_after_longer_than_the_client_waits_is_not_waited(relay: Relay) -> None:
    relay.script([Answer(503, {"Retry-After": "3600"})])
    with (
        Compactd(relay.url, max_retry_after=30, backoff=FAST) as api,
        pytest.raises(ProblemError) as e,
    ):
        api.healthz()
    assert e.value.status == 503
    assert e.value.headers["retry-after"] == "3600"
    assert len(relay.seen) == 1


def test_a_client_error_is_not_retried(relay: Relay, direct: Compactd) -> None:
    sid = direct.create_session("gpt-4o")["id"]
    with Compactd(relay.url, backoff=FAST) as api, pytest.raises(InvalidRequestError):
        api.append_messages(sid, [{"role": "wizard", "content": "hi"}])
    assert len(relay.seen) == 1


def test_reads_are_retried_after_a_dropped_connection_and_send_no_key(
    relay: Relay, direct: Compactd
) -> None:
    sid = direct.create_session("gpt-4o")["id"]
    relay.script([Drop()])
    with Compactd(relay.url, backoff=FAST) as api:
        assert api.get_session(sid)["id"] == sid
    assert [s.method for s in relay.seen] == ["GET", "GET"]
    assert keys(relay) == [None, None]
