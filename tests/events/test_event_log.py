"""The event log through a real server: a session's compaction lifecycle, prunes and
verdict changes come out of its stream in order; a reconnect with Last-Event-ID
resumes exactly after; nothing crosses tenants."""

from __future__ import annotations

from typing import Any

import httpx

from app.core.settings import Settings
from app.main import create_app
from tests.compactions.helpers import conversation
from tests.e2e.server import running
from tests.events.support import read_events


async def test_a_compaction_s_lifecycle_streams_in_order_and_resumes(
    db_url: str, settings: Settings
) -> None:
    # A worker in the server: it runs the compaction, and the webhook dispatcher.
    app = create_app(settings.model_copy(update={"compaction_workers": 1}), database_url=db_url)
    with running(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            r = await client.post(
                "/v1/sessions",
                json={
                    "id": "s",
                    "model": "gpt-4o",
                    "config": {"compaction": {"auto": False, "keep_recent_tokens": 500}},
                },
            )
            assert r.status_code == 201, r.text
            for batch in conversation(12):
                r = await client.post("/v1/sessions/s/messages", json={"messages": batch})
                assert r.status_code == 201, r.text
            r = await client.post("/v1/sessions/s/compactions", json={"summarizer": "extractive"})
            assert r.status_code == 202, r.text
            got = await read_events(base, "/v1/sessions/s/events", 3)
            types = [e["event"] for e in got]
            assert types == ["compaction.queued", "compaction.started", "compaction.succeeded"]
            done: dict[str, Any] = got[2]["data"]
            assert done["data"]["tokens_before"] > done["data"]["tokens_after"] > 0
            assert done["data"]["reason"] == "manual"
            assert [e["id"] for e in got] == [e["data"]["id"] for e in got]
            # Resume after the first: the other two, and nothing again.
            rest = await read_events(
                base, "/v1/sessions/s/events", 2, headers={"Last-Event-ID": got[0]["id"]}
            )
            assert [e["id"] for e in rest] == [e["id"] for e in got[1:]]
            everything = await read_events(base, "/v1/events", 3)
            assert [e["id"] for e in everything] == [e["id"] for e in got]
