"""Webhook deliveries through a real dispatcher to a real receiver: every event type
reaches every subscription that wants it exactly once, signed so that the snippet
docs/events.md publishes accepts it; session-scoped webhooks get their session's
events only; hooks get no deliveries."""

from __future__ import annotations

import asyncio
import base64
import time
from collections import Counter
from typing import Any

import httpx
import orjson

from app.main import create_app
from app.store.events import TYPES
from app.upstream import signing
from tests.compactions.helpers import conversation, drain, worker_config
from tests.compactions.worker_support import SHORT, SUMMARY, request_compaction, seeded
from tests.conftest import make_session
from tests.e2e.server import running
from tests.helpers import append_ok
from tests.upstream_server import Reply, Status, Upstream
from tests.webhooks.receiver import Answer, Inbox, Received
from tests.webhooks.support import (
    create_webhook,
    delivery_log,
    dispatch,
    documented_verify,
    event_log,
    fast,
)

MANUAL = {"compaction": {"auto": False}, "prune": {"auto": False}}


def _family_match(types: list[str], event_type: str) -> bool:
    family = event_type.split(".")[0] + ".*"
    return not types or event_type in types or family in types


async def _every_kind_of_event(client: httpx.AsyncClient, app: Any, upstream: Upstream) -> None:
    """Session ``a``: verdict changes, a prune, a compaction retried once (a hook
    called on each attempt); session ``b``: a compaction cancelled, one that fails,
    a navigation."""
    sid = await seeded(client, 12, id="a", context_window=20_000, config=MANUAL)
    r = await client.post(
        f"/v1/sessions/{sid}/prune",
        json={"protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 0},
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens_saved"] > 0
    upstream.script([Status(500), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 2
    r = await client.get(f"/v1/sessions/{sid}/compactions/{job['id']}")
    assert r.json()["status"] == "succeeded", r.text

    b = {"compaction": {"auto": False, "keep_recent_tokens": 500}, "prune": {"auto": False}}
    await make_session(client, id="b", config=b)
    for batch in conversation(4):
        await append_ok(client, "b", batch)
    queued = await request_compaction(client, "b")
    r = await client.post(f"/v1/sessions/b/compactions/{queued['id']}/cancel")
    assert r.status_code == 200, r.text
    await request_compaction(client, "b")
    # By the time the worker runs it, nothing is left to compact: it fails.
    r = await client.patch(
        "/v1/sessions/b", json={"config": {"compaction": {"keep_recent_tokens": 1_000_000}}}
    )
    assert r.status_code == 200, r.text
    assert await drain(app) == 1
    r = await client.post("/v1/sessions/b/navigate", json={"seq": 2})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "moved"


async def test_every_event_reaches_each_subscription_once_signed(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    verify = documented_verify()
    wanted: dict[str, dict[str, Any]] = {
        "all": {},
        "comp": {"types": ["compaction.*", "session.pruned"]},
        # Its own filters overlap: an event both match is still delivered once.
        "overlap": {"types": ["compaction.*", "compaction.succeeded", "hook.called"]},
        "only-a": {"session_id": "a"},
        # Fails until it is disabled: the webhook.disabled event.
        "dead": {"types": ["session.pruned"]},
    }
    inbox.always("dead", Answer(500, {"error": "down"}))
    hooks = await create_webhook(
        client, url=inbox.url("hook"), hook=True, types=["compaction.before"], session_id="a"
    )
    made = {
        name: await create_webhook(client, url=inbox.url(name), **body)
        for name, body in wanted.items()
    }

    await _every_kind_of_event(client, app, upstream)
    r = await client.post(f"/v1/webhooks/{made['all']['id']}/test")
    assert r.status_code == 202, r.text
    test_id = r.json()["event_id"]
    await dispatch(app, fast(webhook_disable_after_failures=2, webhook_max_attempts=5))

    log = await event_log(app)
    # The scenario made every type there is (webhook.test is not an event: it is
    # made for one webhook by POST .../test).
    assert {e["type"] for e in log} == set(TYPES) - {"webhook.test"}
    assert Counter(e["type"] for e in log)["hook.called"] == 2  # once per attempt
    [disabled] = [e for e in log if e["type"] == "webhook.disabled"]
    assert disabled["session_id"] is None
    assert disabled["data"]["webhook_id"] == made["dead"]["id"]
    by_id = {e["id"]: e for e in log}

    for name in ("all", "comp", "overlap", "only-a"):
        body = wanted[name]
        expected = [
            e["id"]
            for e in log
            if _family_match(body.get("types", []), e["type"])
            and (body.get("session_id") is None or e["session_id"] == body["session_id"])
        ]
        if name == "all":
            expected.append(test_id)
        got = inbox.received(name)
        ids = [r.headers["webhook-id"] for r in got]
        assert Counter(ids) == Counter(expected), name  # each exactly once
        secret = made[name]["secret"]
        other = made["comp" if name != "comp" else "all"]["secret"]
        for request in got:
            assert verify(secret, request.headers, request.body), (name, request.headers)
            assert not verify(other, request.headers, request.body)
            _check_body(request, by_id, test_id)
        deliveries = await delivery_log(client, made[name]["id"])
        assert sorted(d["event_id"] for d in deliveries) == sorted(expected)
        assert {(d["status"], d["attempts"], d["last_status"]) for d in deliveries} == {
            ("succeeded", 1, 200)
        }, name
    assert {r.json["session_id"] for r in inbox.received("only-a")} == {"a"}

    # The dead one: its one event tried twice, then it was disabled and the delivery
    # skipped; nothing after that reached it.
    dead = inbox.received("dead")
    assert len(dead) == 2
    assert {r.headers["webhook-id"] for r in dead} == {
        e["id"] for e in log if e["type"] == "session.pruned"
    }
    [delivery] = await delivery_log(client, made["dead"]["id"])
    assert delivery["status"] == "skipped"
    assert delivery["attempts"] == 2
    r = await client.get(f"/v1/webhooks/{made['dead']['id']}")
    assert r.json()["enabled"] is False

    # A hook is called, never delivered to.
    assert {r.json["type"] for r in inbox.received("hook")} == {"compaction.before"}
    assert len(inbox.received("hook")) == 2
    assert await delivery_log(client, hooks["id"]) == []


def _check_body(request: Received, by_id: dict[str, dict[str, Any]], test_id: str) -> None:
    """A delivery's body is the event as the streams give it: id, type, session,
    time and data; its webhook-id is the event's id."""
    body = request.json
    assert set(body) == {"id", "type", "session_id", "created_at", "data"}
    assert body["id"] == request.headers["webhook-id"]
    assert request.headers["content-type"] == "application/json"
    if body["id"] == test_id:
        assert body["type"] == "webhook.test"
        return
    event = by_id[body["id"]]
    assert (body["type"], body["session_id"], body["data"]) == (
        event["type"],
        event["session_id"],
        event["data"],
    )


async def test_the_documented_check_refuses_what_was_not_signed_so(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    verify = documented_verify()
    made = await create_webhook(client, url=inbox.url("w"))
    r = await client.post(f"/v1/webhooks/{made['id']}/test")
    assert r.status_code == 202, r.text
    await dispatch(app)
    [got] = inbox.received("w")
    secret, headers, body = made["secret"], got.headers, got.body
    assert body == orjson.dumps(orjson.loads(body))  # what was signed is what was sent
    assert verify(secret, headers, body)
    assert got.json["data"] == {"webhook_id": made["id"], "hook": False}
    tampered = body.replace(b'"hook":false', b'"hook":true')
    assert tampered != body
    assert not verify(secret, headers, tampered)
    assert not verify(secret, {**headers, "webhook-id": headers["webhook-id"] + "x"}, body)
    # Another timestamp, or one past the tolerance: refused.
    later = str(int(headers["webhook-timestamp"]) + 1)
    assert not verify(secret, {**headers, "webhook-timestamp": later}, body)
    assert not verify(secret, headers, body, tolerance=-1)
    old = int(time.time()) - 3600
    stale = signing.headers(secret, headers["webhook-id"], body, now=old)
    assert not verify(secret, stale, body)
    assert verify(secret, stale, body, tolerance=7200)
    # Another secret (a well-formed one): refused.
    other = "whsec_" + base64.b64encode(b"k" * 32).decode()
    assert not verify(other, headers, body)
    # A signature list (key rotation) is accepted when one of them matches.
    rotated = {**headers, "webhook-signature": "v1,bm90IGl0 " + headers["webhook-signature"]}
    assert verify(secret, rotated, body)
    assert not verify(secret, {**headers, "webhook-signature": "v1,bm90IGl0"}, body)


async def test_the_dispatcher_in_serve_delivers_as_events_happen(db_url: str, inbox: Inbox) -> None:
    # Workers in the server, polling only every 30 s: what arrives sooner was woken
    # by the event's NOTIFY, and the retry by its own short backoff.
    settings = fast(compaction_workers=1, compaction_poll_seconds=30.0)
    app = create_app(settings, database_url=db_url)
    inbox.script("w", [Answer(500, {"error": "cold start"})])
    with running(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            made = await create_webhook(client, url=inbox.url("w"), types=["session.*"])
            await make_session(client, id="s", config=MANUAL)
            for batch in conversation(6):
                await append_ok(client, "s", batch)
            r = await client.post(
                "/v1/sessions/s/prune",
                json={"protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 0},
            )
            assert r.json()["tokens_saved"] > 0, r.text
            started = time.monotonic()
            await inbox.wait_for(2, "w", within=5)  # the 500, then the retry
            assert time.monotonic() - started < 5
            first, retry = inbox.received("w")
            assert first.headers["webhook-id"] == retry.headers["webhook-id"]
            assert retry.json["type"] == "session.pruned"
            assert documented_verify()(made["secret"], retry.headers, retry.body)
            deadline = time.monotonic() + 5
            while (done := (await delivery_log(client, made["id"]))[0])["status"] == "pending":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert (done["status"], done["attempts"], done["last_status"]) == (
                "succeeded",
                2,
                200,
            )
