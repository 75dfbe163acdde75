"""What a newcomer meets first over HTTP: the service's URL (printed by the start-up
banner) opens the API's page; a body sent without a JSON Content-Type (curl's ``-d``
without ``-H``, or ``text/plain``) is a 415 that says so, not "Input should be a valid
dictionary"; JSON with a charset or an ``application/*+json`` type is JSON; and the
routes that take no input document no 422."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from app.cli import _openapi_document

BODY = orjson.dumps({"model": "gpt-4o"})


async def test_the_root_redirects_to_the_docs(client: httpx.AsyncClient) -> None:
    for method in ("GET", "HEAD"):
        r = await client.request(method, "/")
        assert r.status_code == 307, r.text
        assert r.headers["location"] == "/docs"
    followed = await client.get("/", follow_redirects=True)
    assert followed.status_code == 200
    assert followed.headers["content-type"].startswith("text/html")


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/xml", "json"],
)
async def test_a_body_that_is_not_sent_as_json_is_a_415_that_says_so(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = await client.post("/v1/sessions", content=BODY, headers=headers)
    assert r.status_code == 415, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["title"] == "Unsupported media type"
    assert "Content-Type: application/json" in problem["detail"]
    assert (content_type or "no Content-Type") in problem["detail"]
    assert "valid dictionary" not in r.text
    # Nothing was created.
    assert (await client.get("/v1/sessions")).json()["sessions"] == []


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        "application/vnd.compactd+json",
        "application/merge-patch+json",
    ],
)
async def test_json_with_parameters_or_a_json_suffix_is_json(
    client: httpx.AsyncClient, content_type: str
) -> None:
    r = await client.post("/v1/sessions", content=BODY, headers={"Content-Type": content_type})
    assert r.status_code == 201, r.text


async def test_a_route_without_a_body_takes_any_content_type(client: httpx.AsyncClient) -> None:
    """An empty body, or a route that reads none, has no media type to refuse."""
    created = await client.post("/v1/sessions", json={"model": "gpt-4o"})
    sid = created.json()["id"]
    r = await client.post("/v1/sessions", content=b"", headers={"Content-Type": "text/plain"})
    assert r.status_code == 422, r.text  # the body is missing: the route's own answer
    assert (await client.get("/healthz", headers={"Content-Type": "text/plain"})).status_code == 200
    assert (await client.get(f"/v1/sessions/{sid}")).status_code == 200


def test_routes_that_take_no_input_document_no_422() -> None:
    spec: dict[str, Any] = orjson.loads(_openapi_document())
    for path in ("/healthz", "/metrics", "/readyz"):
        assert "422" not in spec["paths"][path]["get"]["responses"], path
    # Those that take a body document the 415.
    appended = spec["paths"]["/v1/sessions/{session_id}/messages"]["post"]["responses"]
    assert appended["415"]["content"] == {
        "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
    }


async def test_a_query_on_a_route_without_input_is_not_refused(client: httpx.AsyncClient) -> None:
    """What the spec says: /healthz takes nothing, so nothing it is sent is a 422."""
    assert (await client.get("/healthz?x=%00")).status_code == 200
    assert (await client.get("/metrics?x=%00")).status_code == 200
