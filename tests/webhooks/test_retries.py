"""A receiver that fails: deliveries retried after a 500, a timeout or a refused
connection, with the same webhook-id and a fresh signature, the log showing each
attempt; ``failed`` after the last attempt; a webhook that keeps failing disabled
(a ``webhook.disabled`` event, its pending deliveries skipped), enabled again by
PATCH; a success starts the count over."""

from __future__ import annotations

import asyncio
import socket
import time
from datetime import datetime
from typing import Any

import httpx

from app.core.outbound import Outbound
from app.core.settings import Settings
from app.upstream import signing
from app.webhooks.dispatcher import Dispatcher
from tests.webhooks.receiver import Answer, Hang, Inbox
from tests.webhooks.support import (
    create_webhook,
    delivery_log,
    dispatch,
    documented_verify,
    event_log,
    fast,
)


async def _test(client: httpx.AsyncClient, webhook: dict[str, Any]) -> str:
    """Queue a webhook.test delivery; its id."""
    r = await client.post(f"/v1/webhooks/{webhook['id']}/test")
    assert r.status_code == 202, r.text
    delivery_id: str = r.json()["id"]
    return delivery_id


async def _one(client: httpx.AsyncClient, webhook: dict[str, Any]) -> dict[str, Any]:
    [delivery] = await delivery_log(client, webhook["id"])
    return delivery


async def _attempt(dispatcher: Dispatcher, within: float = 10.0) -> None:
    """Run the dispatcher until it has made one more attempt (a retry is due after
    its backoff)."""
    deadline = time.monotonic() + within
    while not await dispatcher.run_once():
        assert time.monotonic() < deadline, "no delivery came due"
        await asyncio.sleep(0.01)


async def test_retried_after_a_500_and_a_timeout_then_delivered(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    verify = documented_verify()
    settings = fast(webhook_timeout_seconds=0.5, webhook_max_attempts=4)
    inbox.script("w", [Answer(500, {"error": "busy"}), Hang(5), Answer(204, None)])
    made = await create_webhook(client, url=inbox.url("w"))
    await _test(client, made)
    async with Outbound(settings) as http:
        dispatcher = Dispatcher(app.state.engine, http.webhooks, settings)

        await _attempt(dispatcher)
        first = await _one(client, made)
        assert (first["status"], first["attempts"], first["last_status"]) == ("pending", 1, 500)
        assert first["last_error"] == 'answered 500: {"error":"busy"}'
        # Due again after the backoff (capped at 0.05 s here).
        retry_in = _at(first["next_attempt_at"]) - _at(first["last_attempt_at"])
        assert 0 <= retry_in.total_seconds() <= 0.06, retry_in

        started = time.monotonic()
        await _attempt(dispatcher)
        assert time.monotonic() - started < 3  # given up at the timeout, not the hang's 5 s
        second = await _one(client, made)
        assert (second["status"], second["attempts"], second["last_status"]) == ("pending", 2, None)
        assert second["last_error"] == "no answer within 0.5 s"

        await _attempt(dispatcher)
    third = await _one(client, made)
    assert (third["status"], third["attempts"], third["last_status"], third["last_error"]) == (
        "succeeded",
        3,
        204,
        None,
    )
    assert third["next_attempt_at"] is None
    got = inbox.received("w")
    assert len(got) == 3
    # The same message every time (a receiver drops repeats by webhook-id), each
    # signed as sent.
    assert len({r.headers["webhook-id"] for r in got}) == 1
    assert len({r.body for r in got}) == 1
    assert all(verify(made["secret"], r.headers, r.body) for r in got)
    r = await client.get(f"/v1/webhooks/{made['id']}")
    assert (r.json()["failures"], r.json()["enabled"]) == (0, True)  # the success reset it


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_failed_after_the_last_attempt(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    inbox.always("down", Answer(503, {"error": "maintenance"}))
    made = await create_webhook(client, url=inbox.url("down"))
    await _test(client, made)
    await dispatch(app, fast(webhook_max_attempts=3))
    assert len(inbox.received("down")) == 3
    done = await _one(client, made)
    assert (done["status"], done["attempts"], done["last_status"]) == ("failed", 3, 503)
    assert done["last_error"] == 'answered 503: {"error":"maintenance"}'
    assert done["next_attempt_at"] is None
    r = await client.get(f"/v1/webhooks/{made['id']}")
    # Below webhook_disable_after_failures: counted, still enabled.
    assert (r.json()["failures"], r.json()["enabled"]) == (3, True)
    # Nothing more is sent for it.
    assert await dispatch(app, fast(webhook_max_attempts=3)) == 0
    assert len(inbox.received("down")) == 3


async def test_a_refused_connection_is_retried_then_failed(
    app: Any, client: httpx.AsyncClient
) -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    made = await create_webhook(client, url=f"http://127.0.0.1:{port}/hook")
    await _test(client, made)
    await dispatch(app, fast(webhook_max_attempts=2))
    done = await _one(client, made)
    assert (done["status"], done["attempts"], done["last_status"]) == ("failed", 2, None)
    assert done["last_error"].startswith("ConnectError"), done["last_error"]


async def test_disabled_after_persistent_failure_then_enabled_again(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    settings = fast(webhook_disable_after_failures=3, webhook_max_attempts=5)
    inbox.always("down", Answer(500, {"error": "down"}))
    made = await create_webhook(client, url=inbox.url("down"))
    watcher = await create_webhook(client, url=inbox.url("watch"), types=["webhook.*"])
    for _ in range(2):
        await _test(client, made)
    await dispatch(app, settings)

    # Disabled at the third failed attempt in a row: the two deliveries were tried
    # side by side, so one more may have been in flight then; nothing after.
    sent = len(inbox.received("down"))
    assert 3 <= sent <= 4
    r = await client.get(f"/v1/webhooks/{made['id']}")
    shown = r.json()
    assert shown["enabled"] is False
    assert shown["disabled_reason"] == "3 failed attempts in a row"
    deliveries = await delivery_log(client, made["id"])
    assert [d["status"] for d in deliveries] == ["skipped", "skipped"]
    assert all(d["last_error"] == "the webhook is disabled" for d in deliveries)
    # The log counts the attempts made, no more.
    assert sum(d["attempts"] for d in deliveries) == sent
    assert await dispatch(app, settings) == 0
    assert len(inbox.received("down")) == sent
    # One webhook.disabled event, for the tenant, delivered to who wants it.
    disabled = [e for e in await event_log(app) if e["type"] == "webhook.disabled"]
    assert [(e["session_id"], e["data"]) for e in disabled] == [
        (None, {"webhook_id": made["id"], "reason": "3 failed attempts in a row"})
    ]
    [told] = inbox.received("watch")
    assert told.json["type"] == "webhook.disabled"
    assert told.json["data"]["webhook_id"] == made["id"]
    assert documented_verify()(watcher["secret"], told.headers, told.body)
    # Disabled: no test, no new deliveries.
    r = await client.post(f"/v1/webhooks/{made['id']}/test")
    assert r.status_code == 409, r.text

    # Enabled again: the count starts over, and deliveries flow.
    inbox.always("down", Answer(200, {}))
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={"enabled": True})
    assert r.status_code == 200, r.text
    shown = r.json()
    assert (shown["enabled"], shown["failures"], shown["disabled_reason"]) == (True, 0, None)
    await _test(client, made)
    await dispatch(app, settings)
    assert len(inbox.received("down")) == sent + 1
    newest = (await delivery_log(client, made["id"]))[0]
    assert (newest["status"], newest["attempts"], newest["last_status"]) == ("succeeded", 1, 200)
    # Still one webhook.disabled event.
    assert len(inbox.received("watch")) == 1


async def test_a_success_starts_the_count_over(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    settings = fast(webhook_disable_after_failures=3, webhook_max_attempts=2)
    # fail, ok, fail, fail: three failures, never three in a row.
    inbox.script("w", [Answer(500), Answer(200), Answer(500), Answer(500)])
    made = await create_webhook(client, url=inbox.url("w"))
    for _ in range(2):
        await _test(client, made)
        await dispatch(app, settings)
    assert len(inbox.received("w")) == 4
    shown = (await client.get(f"/v1/webhooks/{made['id']}")).json()
    assert (shown["enabled"], shown["failures"]) == (True, 2)
    statuses = [d["status"] for d in await delivery_log(client, made["id"])]
    assert statuses == ["failed", "succeeded"]
    assert not [e for e in await event_log(app) if e["type"] == "webhook.disabled"]


async def test_a_slow_receiver_does_not_hold_the_others(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    settings: Settings = fast(webhook_timeout_seconds=2.0)
    inbox.script("slow", [Hang(1.0)])
    slow = await create_webhook(client, url=inbox.url("slow"))
    quick = await create_webhook(client, url=inbox.url("quick"))
    await _test(client, slow)
    await _test(client, quick)
    async with Outbound(settings) as http:
        dispatcher = Dispatcher(app.state.engine, http.webhooks, settings)
        task = asyncio.ensure_future(dispatcher.run_once())
        await inbox.wait_for(1, "quick", within=0.8)  # sent beside the slow one
        assert not task.done()
        assert await task == 2
    assert (await _one(client, slow))["status"] == "succeeded"


async def test_a_url_the_client_cannot_send_to_fails_the_attempt_and_raises_nothing() -> None:
    # Refused at creation (test_webhook_api); a row from before that check, or a host
    # IDNA refuses, is an attempt that fails, not an exception out of the dispatcher's
    # pass or a hook's call.
    async with httpx.AsyncClient() as http:
        for url in ("http://example.com:abc/", "http://xn--/", "http://a\x00b.example/"):
            sent = await signing.post(http, url, signing.new_secret(), "m1", b"{}", 1.0)
            assert not sent.ok
            assert (sent.status, sent.body) == (None, b"")
            assert sent.error is not None
            assert sent.error.split(":")[0] in ("InvalidURL", "IDNAError"), (url, sent.error)


async def test_old_events_and_finished_deliveries_expire_pending_ones_stay(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    inbox.always("down", Answer(500))
    done = await create_webhook(client, url=inbox.url("ok"), types=["webhook.test"])
    waiting = await create_webhook(client, url=inbox.url("down"), types=["webhook.test"])
    await _test(client, done)
    await _test(client, waiting)
    r = await client.post(
        "/v1/sessions", json={"id": "s", "model": "gpt-4o", "context_window": 4000}
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        "/v1/sessions/s/messages",
        json={"messages": [{"role": "user", "content": "word " * 3000}]},
    )
    assert r.status_code == 201, r.text
    assert await event_log(app)  # what the overflowing append did
    # The failing one is retried in an hour: pending, and old by then.
    settings = fast(
        events_retention_seconds=0.5,
        webhook_backoff_base_seconds=3600,
        webhook_backoff_cap_seconds=3600,
    )
    async with Outbound(settings) as http:
        dispatcher = Dispatcher(app.state.engine, http.webhooks, settings)
        assert await dispatcher.run_once() == 2
        await asyncio.sleep(0.6)
        stop = asyncio.Event()
        loop = asyncio.ensure_future(dispatcher.run(stop))  # a pass, then the expiry
        await asyncio.sleep(0.3)
        stop.set()
        await loop
    assert await event_log(app) == []
    assert await delivery_log(client, done["id"]) == []
    [kept] = await delivery_log(client, waiting["id"])
    assert (kept["status"], kept["attempts"]) == ("pending", 1)
