"""``GET /v1/events``: every event of the tenant's sessions and the tenant's own (no
session), filtered by ``type`` (repeatable; an unknown type is a 422 naming it), and
never one of another tenant's, whatever the session ids, the event ids a client
sends, or what happens while its stream is open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.core.tenancy import DEFAULT_TENANT
from app.main import create_app
from app.store import events
from tests.compactions.helpers import conversation
from tests.e2e.server import running
from tests.events.sse import (
    MARK,
    Frame,
    check_frames,
    connect,
    ids,
    logged,
    mark,
    open_stream,
    types,
)
from tests.helpers import assert_problem
from tests.ops.conftest import AUTH_SETTINGS, bearer, create_key

MANUAL = {"compaction": {"auto": False, "keep_recent_tokens": 500}, "prune": {"auto": False}}
TENANTS = ("tenant-a", "tenant-b")


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """A real server that asks for API keys once any exists."""
    with running(create_app(AUTH_SETTINGS, database_url=db_url)) as base:
        yield base


async def seed(http: httpx.AsyncClient, sid: str, headers: dict[str, str]) -> None:
    r = await http.post(
        "/v1/sessions", json={"id": sid, "model": "gpt-4o", "config": MANUAL}, headers=headers
    )
    assert r.status_code == 201, r.text
    for batch in conversation(6):
        r = await http.post(
            f"/v1/sessions/{sid}/messages", json={"messages": batch}, headers=headers
        )
        assert r.status_code == 201, r.text


async def cycle(http: httpx.AsyncClient, sid: str, headers: dict[str, str], times: int = 1) -> None:
    """``compaction.queued`` then ``compaction.cancelled``, ``times`` times."""
    for _ in range(times):
        r = await http.post(f"/v1/sessions/{sid}/compactions", json={}, headers=headers)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        r = await http.post(f"/v1/sessions/{sid}/compactions/{job}/cancel", headers=headers)
        assert r.status_code == 200, r.text


async def tenant_event(db_url: str, tenant: str, **data: Any) -> str:
    """A tenant's own event, of no session (as a webhook disabled is)."""
    conn = await connect(db_url)
    try:
        async with conn.transaction():
            place = await events.emit(conn, tenant, events.TENANT, "webhook.disabled", data)
        return str(place)
    finally:
        await conn.close()


async def read_to_mark(
    base: str, path: str, db_url: str, sid: str, tenant: str, **kw: Any
) -> list[Frame]:
    last = await mark(db_url, sid, tenant)
    async with open_stream(base, path, **kw) as stream:
        frames = await stream.until(last)
    check_frames(frames)
    return frames


# --- filters ----------------------------------------------------------------------------


async def test_type_filters_pick_the_types_asked_in_the_log_s_order(
    server: str, db_url: str
) -> None:
    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        for sid in ("s", "t"):
            await seed(http, sid, {})
        await cycle(http, "s", {})
        await cycle(http, "t", {}, 2)
        own = await tenant_event(db_url, DEFAULT_TENANT, webhook_id="w", reason="test")
        await cycle(http, "s", {})
        log = await logged(db_url)
        cancelled = [e for e, t, _ in log if t == "compaction.cancelled"]
        assert len(cancelled) == 4
        one = await read_to_mark(
            server,
            "/v1/events",
            db_url,
            "s",
            DEFAULT_TENANT,
            params=[("type", "compaction.cancelled"), ("type", MARK)],
        )
        assert types(one[:-1]) == ["compaction.cancelled"] * 4
        assert ids(one[:-1]) == cancelled
        two = await read_to_mark(
            server,
            "/v1/events",
            db_url,
            "t",
            DEFAULT_TENANT,
            params=[("type", "webhook.disabled"), ("type", "compaction.queued"), ("type", MARK)],
        )
        wanted = {"webhook.disabled", "compaction.queued"}
        assert ids([f for f in two if f.event != MARK]) == [e for e, t, _ in log if t in wanted]
        (tenant_own,) = [f for f in two if f.event == "webhook.disabled"]
        assert tenant_own.id == own
        assert tenant_own.data["session_id"] is None
        assert tenant_own.data["data"] == {"webhook_id": "w", "reason": "test"}
        # A filtered stream resumes like any other: after the id given, the types asked.
        resumed = await read_to_mark(
            server,
            "/v1/events",
            db_url,
            "s",
            DEFAULT_TENANT,
            params=[("type", "compaction.cancelled"), ("type", MARK)],
            headers={"Last-Event-ID": cancelled[1]},
        )
        assert ids(resumed)[:2] == cancelled[2:]
        assert types(resumed)[2:] == [MARK] * 3  # the earlier reads' marks and its own
        # The tenant's own event is in no session's stream.
        for sid in ("s", "t"):
            frames = await read_to_mark(
                server, f"/v1/sessions/{sid}/events", db_url, sid, DEFAULT_TENANT
            )
            assert own not in ids(frames)
            assert {f.data["session_id"] for f in frames} == {sid}


@pytest.mark.parametrize(
    "asked",
    [
        ["compaction"],
        ["compaction.*"],
        ["session.verdict", "nope"],
        ["Compaction.Queued"],
        [""],
    ],
)
async def test_an_unknown_type_is_a_422_naming_the_parameter(server: str, asked: list[str]) -> None:
    async with httpx.AsyncClient(base_url=server, timeout=10) as http:
        r = await http.get("/v1/events", params=[("type", t) for t in asked])
        doc = assert_problem(r, 422, "type")
        assert asked[-1] in doc["detail"]


async def test_every_known_type_is_accepted(server: str) -> None:
    params = [("type", t) for t in events.TYPES]
    async with open_stream(server, "/v1/events", params=params):
        pass


# --- tenants ----------------------------------------------------------------------------


async def test_no_tenant_ever_sees_another_s_events(server: str, db_url: str) -> None:
    keys = {t: bearer(await create_key(db_url, t)) for t in TENANTS}
    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        for tenant, key in keys.items():
            await seed(http, "same", key)  # the same session id in both
            await seed(http, f"only-{tenant}", key)
        # Each tenant's stream is open (from now) while both work.
        async with (
            open_stream(
                server, "/v1/events", headers=keys["tenant-a"], params={"after": "now"}
            ) as live_a,
            open_stream(
                server,
                "/v1/sessions/same/events",
                headers=keys["tenant-b"],
                params={"after": "now"},
            ) as live_b,
        ):
            await cycle(http, "same", keys["tenant-b"], 2)
            await cycle(http, "only-tenant-b", keys["tenant-b"])
            await tenant_event(db_url, "tenant-b", webhook_id="b", reason="b's")
            await live_a.nothing_for(1.5)  # b's work is not a's
            await cycle(http, "same", keys["tenant-a"])
            got_a = await live_a.take(2)
            assert {f.data["session_id"] for f in got_a} == {"same"}
            assert ids(got_a) == [e for e, _, _ in await logged(db_url, tenant="tenant-a")]
            got_b = await live_b.take(4)
            assert ids(got_b) == [
                e for e, _, s in await logged(db_url, tenant="tenant-b") if s == "same"
            ]
        await cycle(http, "only-tenant-a", keys["tenant-a"])
        await tenant_event(db_url, "tenant-a", webhook_id="a", reason="a's")
        for tenant, key in keys.items():
            log = await logged(db_url, tenant=tenant)
            other = {
                e for t in TENANTS if t != tenant for e, _, _ in await logged(db_url, tenant=t)
            }
            assert log
            assert other
            everything = await read_to_mark(
                server, "/v1/events", db_url, "same", tenant, headers=key
            )
            assert ids(everything) == [e for e, _, _ in await logged(db_url, tenant=tenant)]
            assert not set(ids(everything)) & other
            assert {f.data["session_id"] for f in everything} == {
                "same",
                f"only-{tenant}",
                None,
            }
            same = await read_to_mark(
                server, "/v1/sessions/same/events", db_url, "same", tenant, headers=key
            )
            assert ids(same) == [
                e for e, _, s in await logged(db_url, tenant=tenant, session_id="same")
            ]
            assert not set(ids(same)) & other
            # Another tenant's event id is a place in the log, not a way into it.
            for theirs in sorted(other)[:3]:
                resumed = await read_to_mark(
                    server,
                    "/v1/events",
                    db_url,
                    "same",
                    tenant,
                    headers={**key, "Last-Event-ID": theirs},
                )
                assert not set(ids(resumed)) & other
            # Another tenant's session is not there at all.
            for sid in (f"only-{t}" for t in TENANTS if t != tenant):
                r = await http.get(f"/v1/sessions/{sid}/events", headers=key)
                assert_problem(r, 404, sid)
        # Without a key, no stream.
        for path in ("/v1/events", "/v1/sessions/same/events"):
            r = await http.get(path)
            assert r.status_code == 401, r.text
            r = await http.get(path, headers=bearer("ck_not-a-key"))
            assert r.status_code == 401, r.text


async def test_a_tenant_past_its_share_of_streams_is_refused_and_another_is_not(
    db_url: str,
) -> None:
    keys = {t: bearer(await create_key(db_url, t)) for t in TENANTS}
    settings = AUTH_SETTINGS.model_copy(update={"event_streams_per_tenant_max": 1})
    app = create_app(settings, database_url=db_url)
    with running(app) as base:
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as http,
            open_stream(base, "/v1/events", headers=keys["tenant-a"]),
        ):
            r = await http.get("/v1/events", headers=keys["tenant-a"])
            assert_problem(r, 503, "tenant")
            assert r.headers["retry-after"] == "5"
            async with open_stream(base, "/v1/events", headers=keys["tenant-b"]):
                assert app.state.event_hub.streams == 2
