"""What the schemathesis run found, pinned as plain tests."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import make_session
from tests.helpers import assert_problem


async def test_an_empty_idempotency_key_is_refused_naming_the_header(
    client: httpx.AsyncClient,
) -> None:
    # It was stored as a key with no request hash: a NOT NULL violation, a 500.
    session = await make_session(client)
    r = await client.post(
        f"/v1/sessions/{session['id']}/messages",
        json={"messages": [{"role": "system", "content": ""}]},
        headers={"Idempotency-Key": ""},
    )
    assert_problem(r, 422, "idempotency-key")
    r = await client.get(f"/v1/sessions/{session['id']}/messages")
    assert r.json()["entries"] == []


async def test_app_wide_refusals_are_documented_on_every_operation(
    client: httpx.AsyncClient,
) -> None:
    # Any route that takes input refuses a NUL in any query parameter (declared or
    # not), and any POST/PATCH a body that is not UTF-8: the spec lists those answers
    # everywhere. A route that takes no input (/healthz) refuses nothing, and its
    # operation lists no 422.
    r = await client.get("/v1/sessions", params={"x": "\x00"})
    assert_problem(r, 422, "x")
    assert (await client.get("/healthz", params={"x": "\x00"})).status_code == 200
    session = await make_session(client)
    r = await client.post(
        f"/v1/sessions/{session['id']}/prune",
        content=b'{"x": "\xbd"}',
        headers={"content-type": "application/json"},
    )
    assert_problem(r, 400, "body")
    spec: dict[str, Any] = (await client.get("/openapi.json")).json()
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            codes = set(operation["responses"])
            takes_input = "parameters" in operation or "requestBody" in operation
            assert ("422" in codes) == takes_input, (method, path)
            if method in ("post", "put", "patch"):
                assert {"400", "413"} <= codes, (method, path)
