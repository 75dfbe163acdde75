"""A check of an append lives in one place (app.messages.intake), and every way in makes
it: the FastAPI route, its fast path and the proxy. The test adds a row to the intake's
table of message checks and sends the refused message each way."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.core.database import get_engine
from app.core.direct import route_of
from app.core.errors import ProblemError
from app.core.settings import Settings
from app.core.tenancy import get_tenant
from app.main import create_app, reject_unstorable_text
from app.messages import intake
from app.messages.router import append_messages, batch_in_bounds, router
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import direct_and_fastapi, history

WORD = "the word this test refuses"
USER = {"role": "user", "content": "List the files."}
REFUSED = {"role": "user", "content": WORD}


def _no_word(messages: list[Any], fmt: str, settings: Settings) -> tuple[str, str] | None:
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("content") == WORD:
            return f"messages[{i}].content", "is the word this test refuses"
    return None


@pytest.fixture
def added_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check added where a new one goes: one more row of the intake's table."""
    monkeypatch.setattr(intake, "MESSAGE_CHECKS", (*intake.MESSAGE_CHECKS, _no_word))


@pytest.mark.usefixtures("added_check")
async def test_a_check_added_to_the_intake_refuses_on_the_route_and_its_fast_path(
    db_url: str,
) -> None:
    async with direct_and_fastapi(db_url, TEST_SETTINGS) as clients:
        for client, sid in zip(clients, ("fast", "route"), strict=True):
            await make_session(client, id=sid)
            r = await client.post(
                f"/v1/sessions/{sid}/messages", json={"messages": [USER, REFUSED]}
            )
            assert r.status_code == 422, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["errors"] == [
                {"field": "messages[1].content", "detail": "is the word this test refuses"}
            ]
            assert await history(client, sid) == []
            r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": [USER]})
            assert r.status_code == 201, r.text


@pytest.mark.usefixtures("added_check")
async def test_the_fast_paths_reading_refuses_it_itself() -> None:
    """The fast path's own reading refuses it (the route then answers), so no form of
    the request can store what the check refuses."""
    route = route_of(router.routes, append_messages)
    raw = b'{"messages": [{"role": "user", "content": "%s"}]}' % WORD.encode()
    with pytest.raises(ProblemError) as refused:
        await intake.read_append(
            raw,
            route=route,
            content_type="application/json",
            query_format=None,
            idempotency_key=None,
            if_match=None,
            settings=TEST_SETTINGS,
        )
    assert refused.value.status == 422


@pytest.mark.usefixtures("added_check")
async def test_a_check_added_to_the_intake_refuses_on_the_proxy(db_url: str) -> None:
    # An upstream that is never asked: the proxy refuses what it would store first.
    settings = TEST_SETTINGS.model_copy(update={"proxy_openai_url": "http://127.0.0.1:9/v1"})
    app = create_app(settings, database_url=db_url)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as client,
    ):
        r = await client.post(
            "/proxy/openai/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [USER, REFUSED]},
            headers={"X-Compactd-Session": "p1", "Authorization": "Bearer sk-test"},
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages[1].content", error
        assert "is the word this test refuses" in error["message"]
        assert await history(client, "p1") == []


def test_the_fast_path_reads_every_input_and_check_of_the_route() -> None:
    """The fast path reads what the route declares and runs the checks it depends on;
    a parameter or check given to the route alone would not be made there (it would
    fail open), so one added fails here until the intake makes it too."""
    dependant = route_of(router.routes, append_messages).dependant
    assert [p.alias for p in dependant.path_params] == ["session_id"]
    assert [p.alias for p in dependant.query_params] == ["format"]
    assert [p.alias for p in dependant.header_params] == ["idempotency-key", "if-match"]
    assert [p.name for p in dependant.body_params] == ["body"]
    assert [d.call for d in dependant.dependencies] == [batch_in_bounds, get_engine, get_tenant]
    app = create_app(TEST_SETTINGS)
    assert [d.dependency for d in app.router.dependencies] == [reject_unstorable_text]
