"""The /v1/webhooks routes: what they accept and refuse (each refusal a 4xx problem
naming the problem), the secret shown once, 404s, the 100-webhook limit, pause and
enable, delete, the delivery log's pages, and POST .../test."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.helpers import assert_problem
from tests.webhooks.receiver import Inbox
from tests.webhooks.support import (
    create_webhook,
    delivery_log,
    dispatch,
    documented_verify,
)

URL = "https://hooks.example.com/compactd"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"url": "ftp://hooks.example.com/x"}, ["url", "http"]),
        ({"url": "hooks.example.com/compactd"}, ["url"]),
        ({"url": "https:///no-host"}, ["url"]),
        ({"url": "http://"}, ["url"]),
        ({"url": "http://hooks.example.com:abc/x"}, ["url"]),
        ({"url": "http://hooks.example.com:99999/x"}, ["url"]),
        ({"url": "http://hooks\x00.example.com/x"}, ["url"]),
        ({"url": "https://hooks.example.com/" + "x" * 2100}, ["url"]),
        ({}, ["url"]),
        ({"url": URL, "types": ["compaction.done"]}, ["types", "compaction.done"]),
        ({"url": URL, "types": ["session.*", "sessions.*"]}, ["types", "sessions.*"]),
        ({"url": URL, "types": ["*"]}, ["types"]),
        ({"url": URL, "types": "compaction.*"}, ["types"]),
        # A hook's types are points: an event type or a family is no point.
        ({"url": URL, "hook": True, "types": ["compaction.queued"]}, ["types", "hook point"]),
        ({"url": URL, "hook": True, "types": ["compaction.*"]}, ["types", "hook point"]),
        ({"url": URL, "hook": True, "types": ["navigation.after"]}, ["types", "hook point"]),
        ({"url": URL, "hook": True, "timeout_seconds": 0}, ["timeout_seconds"]),
        ({"url": URL, "hook": True, "timeout_seconds": 31}, ["timeout_seconds"]),
        ({"url": URL, "session_id": "no spaces allowed"}, ["session_id"]),
        ({"url": URL, "secret": "whsec_mine"}, ["secret"]),
        ({"url": URL, "types": [f"t{i}" for i in range(40)]}, ["types"]),
    ],
    ids=[
        "ftp",
        "no-scheme",
        "no-host",
        "scheme-only",
        "bad-port",
        "port-out-of-range",
        "nul",
        "too-long",
        "no-url",
        "unknown-type",
        "unknown-family",
        "star",
        "types-not-a-list",
        "hook-event-type",
        "hook-family",
        "unknown-point",
        "timeout-zero",
        "timeout-over-30",
        "bad-session-id",
        "own-secret",
        "too-many-types",
    ],
)
async def test_a_bad_webhook_is_refused_naming_the_problem(
    client: httpx.AsyncClient, body: dict[str, Any], names: list[str]
) -> None:
    r = await client.post("/v1/webhooks", json=body)
    assert_problem(r, 422, *names)
    r = await client.get("/v1/webhooks")
    assert r.json() == {"webhooks": []}


async def test_created_listed_read_and_the_secret_shown_once(client: httpx.AsyncClient) -> None:
    made = await create_webhook(
        client,
        url=URL,
        types=["session.pruned", "compaction.*", "compaction.*"],
        session_id="agent-1",
        description="the dashboard",
    )
    assert made["secret"].startswith("whsec_")
    assert made["types"] == ["compaction.*", "session.pruned"]
    assert (made["url"], made["session_id"], made["description"]) == (
        URL,
        "agent-1",
        "the dashboard",
    )
    assert (made["enabled"], made["failures"], made["hook"], made["disabled_reason"]) == (
        True,
        0,
        False,
        None,
    )
    hook = await create_webhook(client, url=URL + "/hook", hook=True, timeout_seconds=2.5)
    assert hook["hook"] is True
    assert hook["timeout_seconds"] == 2.5
    assert hook["types"] == []
    assert hook["secret"] != made["secret"]

    r = await client.get(f"/v1/webhooks/{made['id']}")
    assert r.status_code == 200, r.text
    shown = r.json()
    assert "secret" not in shown
    assert shown == {k: v for k, v in made.items() if k != "secret"}
    listed = (await client.get("/v1/webhooks")).json()["webhooks"]
    assert [w["id"] for w in listed] == [made["id"], hook["id"]]  # oldest first
    assert all("secret" not in w for w in listed)
    assert made["secret"] not in (await client.get("/v1/webhooks")).text
    for path in ("", f"/{made['id']}", f"/{made['id']}/deliveries"):
        r = await client.get(f"/v1/webhooks{path}")
        assert made["secret"] not in r.text
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={"enabled": False})
    assert r.status_code == 200, r.text
    assert "secret" not in r.json()


async def test_unknown_webhooks_are_404(client: httpx.AsyncClient) -> None:
    missing = uuid.uuid4()
    for method, path, body in [
        ("GET", f"/v1/webhooks/{missing}", None),
        ("PATCH", f"/v1/webhooks/{missing}", {"enabled": True}),
        ("DELETE", f"/v1/webhooks/{missing}", None),
        ("POST", f"/v1/webhooks/{missing}/test", None),
        ("GET", f"/v1/webhooks/{missing}/deliveries", None),
    ]:
        r = await client.request(method, path, json=body)
        assert_problem(r, 404, str(missing))
    # Not an id at all: a 422 naming it, not a 500.
    assert_problem(await client.get("/v1/webhooks/not-a-uuid"), 422, "webhook_id")
    made = await create_webhook(client, url=URL)
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={"enabled": "maybe"})
    assert_problem(r, 422, "enabled")
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={})
    assert_problem(r, 422, "enabled")
    r = await client.get(f"/v1/webhooks/{made['id']}/deliveries", params={"cursor": "nope"})
    assert_problem(r, 422, "cursor")
    r = await client.get(f"/v1/webhooks/{made['id']}/deliveries", params={"limit": 0})
    assert_problem(r, 422, "limit")


async def test_at_most_100_webhooks_a_tenant(client: httpx.AsyncClient) -> None:
    made = [await create_webhook(client, url=f"{URL}/{i}") for i in range(100)]
    r = await client.post("/v1/webhooks", json={"url": URL})
    doc = assert_problem(r, 409, "100")
    assert "delete one" in doc["detail"]
    listed = (await client.get("/v1/webhooks")).json()["webhooks"]
    assert [w["id"] for w in listed] == [w["id"] for w in made]
    r = await client.delete(f"/v1/webhooks/{made[0]['id']}")
    assert r.status_code == 204
    await create_webhook(client, url=URL)
    assert_problem(await client.post("/v1/webhooks", json={"url": URL}), 409, "100")


async def test_delete_skips_what_was_pending(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    made = await create_webhook(client, url=inbox.url("w"))
    kept = await create_webhook(client, url=inbox.url("kept"))
    for webhook in (made, kept):
        r = await client.post(f"/v1/webhooks/{webhook['id']}/test")
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "pending"
    r = await client.delete(f"/v1/webhooks/{made['id']}")
    assert r.status_code == 204, r.text
    assert r.content == b""
    assert_problem(await client.get(f"/v1/webhooks/{made['id']}"), 404)
    assert_problem(await client.delete(f"/v1/webhooks/{made['id']}"), 404)
    await dispatch(app)
    assert inbox.received("w") == []
    assert len(inbox.received("kept")) == 1


async def test_paused_then_enabled(app: Any, client: httpx.AsyncClient, inbox: Inbox) -> None:
    made = await create_webhook(client, url=inbox.url("w"))
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={"enabled": False})
    assert r.status_code == 200, r.text
    assert (r.json()["enabled"], r.json()["disabled_reason"]) == (
        False,
        "disabled through the API",
    )
    # A paused webhook is not sent a test.
    assert_problem(await client.post(f"/v1/webhooks/{made['id']}/test"), 409, "enable")
    r = await client.patch(f"/v1/webhooks/{made['id']}", json={"enabled": True})
    assert (r.json()["enabled"], r.json()["disabled_reason"]) == (True, None)
    r = await client.post(f"/v1/webhooks/{made['id']}/test")
    assert r.status_code == 202, r.text
    await dispatch(app)
    assert len(inbox.received("w")) == 1


async def test_a_test_delivery_is_signed_and_logged(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    verify = documented_verify()
    made = await create_webhook(client, url=inbox.url("w"), types=["session.pruned"])
    r = await client.post(f"/v1/webhooks/{made['id']}/test")
    assert r.status_code == 202, r.text
    queued = r.json()
    assert (queued["type"], queued["status"], queued["attempts"]) == ("webhook.test", "pending", 0)
    assert queued["payload"]["type"] == "webhook.test"
    await dispatch(app)
    [got] = inbox.received("w")
    assert verify(made["secret"], got.headers, got.body)
    assert got.headers["webhook-id"] == queued["event_id"] == got.json["id"]
    assert got.json["type"] == "webhook.test"
    assert got.json["data"] == {"webhook_id": made["id"], "hook": False}
    [logged] = await delivery_log(client, made["id"])
    assert logged["id"] == queued["id"]
    assert (logged["status"], logged["attempts"], logged["last_status"], logged["last_error"]) == (
        "succeeded",
        1,
        200,
        None,
    )
    assert logged["last_attempt_at"] is not None
    assert logged["next_attempt_at"] is None


async def test_the_delivery_log_pages_newest_first(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    made = await create_webhook(client, url=inbox.url("w"))
    queued = []
    for _ in range(7):
        r = await client.post(f"/v1/webhooks/{made['id']}/test")
        assert r.status_code == 202, r.text
        queued.append(r.json()["id"])
    paged = await delivery_log(client, made["id"], limit=2)
    assert [d["id"] for d in paged] == queued[::-1]
    r = await client.get(f"/v1/webhooks/{made['id']}/deliveries", params={"limit": 7})
    assert r.json()["next_cursor"] is None
    await dispatch(app)
    assert {d["status"] for d in await delivery_log(client, made["id"], limit=3)} == {"succeeded"}
