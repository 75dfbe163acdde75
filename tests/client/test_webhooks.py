"""The client's webhook methods against a real compactd over HTTP (each test once with
:class:`AsyncCompactd` and once with :class:`Compactd`), its dispatcher delivering to a
real receiver the test starts; and :func:`verify_webhook` on signatures made as
compactd makes them (``app.upstream.signing``) and on real deliveries."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import datetime
from typing import Any, cast

import pytest
from compactd_client import (
    AsyncCompactd,
    Compactd,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    verify_webhook,
)
from compactd_client.types import Delivery, Webhook, WebhookCreated

from app.upstream import signing
from tests.client.receiver import Receiver, receiving
from tests.client.streams import close, take_until
from tests.client.test_client import CONVERSATION, MANUAL, Awaited


@pytest.fixture(params=["async", "sync"])
async def api(request: pytest.FixtureRequest, compactd_url: str) -> AsyncIterator[AsyncCompactd]:
    """A client of this test's compactd: the async one, or the sync one awaited."""
    if request.param == "async":
        async with AsyncCompactd(compactd_url) as client:
            yield client
    else:
        with Compactd(compactd_url) as sync:
            yield cast(AsyncCompactd, Awaited(sync))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as running:
        yield running


def without_secret(created: WebhookCreated) -> Webhook:
    return cast(Webhook, {k: v for k, v in created.items() if k != "secret"})


def same_time(event: Mapping[str, Any]) -> dict[str, Any]:
    """The event with its time as a datetime, to compare the instant."""
    return {**event, "created_at": datetime.fromisoformat(event["created_at"])}


async def settled(api: AsyncCompactd, webhook_id: str, count: int) -> list[Delivery]:
    """The webhook's delivery log once its newest ``count`` deliveries are done."""
    deadline = time.monotonic() + 20
    while True:
        log = (await api.list_deliveries(webhook_id, limit=count))["deliveries"]
        if len(log) == count and all(d["status"] != "pending" for d in log):
            return log
        assert time.monotonic() < deadline, log
        await asyncio.sleep(0.1)


async def test_a_webhook_is_created_read_paused_tested_and_deleted(
    api: AsyncCompactd, receiver: Receiver
) -> None:
    created = await api.create_webhook(
        receiver.url + "/compactd",
        types=["compaction.*", "session.pruned"],
        description="the client's test",
        timeout_seconds=3,
    )
    assert created["secret"].startswith("whsec_")
    assert len(base64.b64decode(created["secret"].removeprefix("whsec_"))) == 32
    assert created["url"] == receiver.url + "/compactd"
    assert created["types"] == ["compaction.*", "session.pruned"]
    assert (created["session_id"], created["hook"], created["timeout_seconds"]) == (None, False, 3)
    assert (created["enabled"], created["failures"], created["disabled_reason"]) == (True, 0, None)
    assert created["description"] == "the client's test"
    webhook = without_secret(created)
    assert await api.get_webhook(created["id"]) == webhook
    assert (await api.list_webhooks())["webhooks"] == [webhook]

    paused = await api.update_webhook(created["id"], enabled=False)
    assert paused["enabled"] is False
    assert paused["disabled_reason"]
    assert {**paused, "enabled": True, "disabled_reason": None} == webhook
    with pytest.raises(ConflictError) as disabled:
        await api.test_webhook(created["id"])
    assert "disabled" in (disabled.value.detail or "")
    assert await api.update_webhook(created["id"], enabled=True) == webhook

    queued = await api.test_webhook(created["id"])
    assert (queued["type"], queued["status"], queued["session_id"]) == (
        "webhook.test",
        "pending",
        None,
    )
    assert queued["payload"]["data"]["webhook_id"] == created["id"]
    (delivered,) = receiver.wait_for(1)
    assert delivered.path == "/compactd"
    assert json.loads(delivered.body) == queued["payload"]
    assert delivered.headers["webhook-id"] == queued["event_id"]
    assert verify_webhook(created["secret"], delivered.headers, delivered.body)
    assert not verify_webhook(created["secret"], delivered.headers, delivered.body + b" ")
    (done,) = await settled(api, created["id"], 1)
    assert done["id"] == queued["id"]
    assert (done["status"], done["attempts"], done["last_status"]) == ("succeeded", 1, 200)
    assert done["last_error"] is None
    assert done["last_attempt_at"] is not None

    await api.delete_webhook(created["id"])
    with pytest.raises(NotFoundError):
        await api.get_webhook(created["id"])
    with pytest.raises(NotFoundError):
        await api.list_deliveries(created["id"])
    assert (await api.list_webhooks())["webhooks"] == []
    with pytest.raises(NotFoundError):
        await api.delete_webhook(created["id"])


async def test_the_delivery_log_comes_a_page_at_a_time(
    api: AsyncCompactd, receiver: Receiver
) -> None:
    webhook = await api.create_webhook(receiver.url, hook=True, types=["compaction.before"])
    assert (webhook["hook"], webhook["types"]) == (True, ["compaction.before"])
    queued = [await api.test_webhook(webhook["id"]) for _ in range(3)]
    first = await api.list_deliveries(webhook["id"], limit=2)
    assert len(first["deliveries"]) == 2
    assert first["next_cursor"] is not None
    rest = await api.list_deliveries(webhook["id"], limit=2, cursor=first["next_cursor"])
    assert rest["next_cursor"] is None
    log = first["deliveries"] + rest["deliveries"]
    assert sorted(d["id"] for d in log) == sorted(d["id"] for d in queued)
    newest_first = [(d["created_at"], d["id"]) for d in log]
    assert newest_first == sorted(newest_first, reverse=True)
    with pytest.raises(InvalidRequestError) as bad:
        await api.list_deliveries(webhook["id"], cursor="not-a-cursor")
    assert [e["field"] for e in bad.value.errors] == ["cursor"], bad.value.body


async def test_a_compaction_s_events_are_delivered_signed(
    api: AsyncCompactd, receiver: Receiver
) -> None:
    await api.create_session("gpt-4o", id="watched", config=MANUAL)
    await api.create_session("gpt-4o", id="other", config=MANUAL)
    webhook = await api.create_webhook(receiver.url, types=["compaction.*"], session_id="watched")
    for sid in ("other", "watched"):
        await api.append_messages(sid, CONVERSATION)
        job = await api.request_compaction(sid, summarizer="extractive", wait=60)
        assert job["status"] == "succeeded", job

    stream = await api.events("watched")
    try:
        logged = await take_until(stream, lambda e: e["type"] == "compaction.succeeded")
    finally:
        await close(stream)
    wanted = [e for e in logged if e["type"].startswith("compaction.")]
    assert [e["type"] for e in wanted] == [
        "compaction.queued",
        "compaction.started",
        "compaction.succeeded",
    ]
    delivered = receiver.wait_for(3)
    for one in delivered:
        assert verify_webhook(webhook["secret"], one.headers, one.body)
    # Each event once (at least once is the promise; nothing failed here), as the
    # stream has it, and only the watched session's. (The same time, but not always
    # written alike: a delivery's is Postgres's JSON, which drops trailing zeros.)
    bodies = sorted((json.loads(d.body) for d in delivered), key=lambda e: e["id"])
    assert [same_time(e) for e in bodies] == [same_time(e) for e in wanted]
    assert sorted(d.headers["webhook-id"] for d in delivered) == [e["id"] for e in wanted]
    log = await settled(api, webhook["id"], 3)
    assert {d["status"] for d in log} == {"succeeded"}
    assert sorted(d["event_id"] for d in log) == [e["id"] for e in wanted]


async def test_a_webhook_the_api_refuses_raises_what_is_wrong(api: AsyncCompactd) -> None:
    with pytest.raises(InvalidRequestError) as not_http:
        await api.create_webhook("ftp://example.com/hook")
    assert any("url" in e["field"] for e in not_http.value.errors), not_http.value.body
    with pytest.raises(InvalidRequestError) as unknown:
        await api.create_webhook("http://127.0.0.1:9/hook", types=["compaction.exploded"])
    assert [e["field"] for e in unknown.value.errors] == ["types"], unknown.value.body
    with pytest.raises(InvalidRequestError) as too_long:
        await api.create_webhook("http://127.0.0.1:9/hook", hook=True, timeout_seconds=31)
    assert any("timeout_seconds" in e["field"] for e in too_long.value.errors)
    with pytest.raises(NotFoundError):
        await api.get_webhook(str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await api.test_webhook(str(uuid.uuid4()))
    with pytest.raises(InvalidRequestError):
        await api.update_webhook("not-a-webhook-id", enabled=True)
    assert (await api.list_webhooks())["webhooks"] == []


# verify_webhook, on signatures made the way compactd makes them.

SECRET = signing.new_secret()
BODY = b'{"id":"812-3","type":"compaction.succeeded","data":{"note":"caf\xc3\xa9 \xe2\x80\xa8"}}'


def test_verify_webhook_accepts_compactd_s_signature_and_nothing_else() -> None:
    headers = signing.headers(SECRET, "812-3", BODY)
    assert verify_webhook(SECRET, headers, BODY)
    assert verify_webhook(SECRET, {k.title(): v for k, v in headers.items()}, BODY)
    assert not verify_webhook(SECRET, headers, BODY.replace(b"812-3", b"812-4"))
    assert not verify_webhook(signing.new_secret(), headers, BODY)
    assert not verify_webhook(SECRET, {**headers, "webhook-id": "812-4"}, BODY)
    # The timestamp is signed: moving it breaks the signature.
    later = str(int(headers["webhook-timestamp"]) + 1)
    assert not verify_webhook(SECRET, {**headers, "webhook-timestamp": later}, BODY)


def test_verify_webhook_refuses_an_old_delivery_and_a_malformed_one() -> None:
    old = signing.headers(SECRET, "812-3", BODY, now=time.time() - 400)
    assert not verify_webhook(SECRET, old, BODY)
    assert verify_webhook(SECRET, old, BODY, tolerance=600)
    future = signing.headers(SECRET, "812-3", BODY, now=time.time() + 400)
    assert not verify_webhook(SECRET, future, BODY)
    headers = signing.headers(SECRET, "812-3", BODY)
    for missing in ("webhook-id", "webhook-timestamp", "webhook-signature"):
        assert not verify_webhook(SECRET, {k: v for k, v in headers.items() if k != missing}, BODY)
    assert not verify_webhook(SECRET, {**headers, "webhook-timestamp": "yesterday"}, BODY)
    assert not verify_webhook(SECRET, {**headers, "webhook-signature": "v1,é"}, BODY)
    assert not verify_webhook(SECRET, {**headers, "webhook-signature": ""}, BODY)
    # A v2 signature with the right digest is not a v1 signature.
    v2 = headers["webhook-signature"].replace("v1,", "v2,")
    assert not verify_webhook(SECRET, {**headers, "webhook-signature": v2}, BODY)


def test_verify_webhook_takes_any_of_several_signatures() -> None:
    """A receiver rotating its secret gets several signatures, space-separated."""
    headers = signing.headers(SECRET, "812-3", BODY)
    rotated = {
        **headers,
        "webhook-signature": f"v1,bm90IGl0 {headers['webhook-signature']} v1a,x",
    }
    assert verify_webhook(SECRET, rotated, BODY)
    assert not verify_webhook(SECRET, {**headers, "webhook-signature": "v1,bm90IGl0"}, BODY)
