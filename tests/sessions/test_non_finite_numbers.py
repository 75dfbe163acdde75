"""Numbers JSON cannot carry (NaN, Infinity, -Infinity, 1e400) in a session's
metadata or config are a 422 naming the field, and nothing changes: they were
once stored as null. Finite numbers are stored as sent."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import make_session
from tests.helpers import assert_problem, get_session

JSON = {"content-type": "application/json"}
NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.mark.parametrize("literal", NOT_FINITE)
async def test_create_with_a_number_that_is_not_finite_is_422(
    client: httpx.AsyncClient, literal: str
) -> None:
    cases = [
        (f'{{"model": "gpt-4o", "id": "s", "metadata": {{"x": {literal}}}}}', "metadata.x"),
        (
            f'{{"model": "gpt-4o", "id": "s", "metadata": {{"runs": [1, {{"score": {literal}}}]}}}}',
            "metadata.runs[1].score",
        ),
        (
            f'{{"model": "gpt-4o", "id": "s", "config": {{"compaction": {{"threshold": {literal}}}}}}}',
            "config.compaction.threshold",
        ),
    ]
    for raw, field in cases:
        r = await client.post("/v1/sessions", content=raw, headers=JSON)
        doc = assert_problem(r, 422, field, "not a finite number")
        assert [e["field"] for e in doc["errors"]] == [field]
        assert_problem(await client.get("/v1/sessions/s"), 404)


async def test_patch_with_a_number_that_is_not_finite_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", metadata={"team": "a", "n": 1.5})
    before = await get_session(client, "s")
    for literal in NOT_FINITE:
        for raw, field in [
            (f'{{"metadata": {{"y": {literal}}}}}', "metadata.y"),
            (
                f'{{"config": {{"prune": {{"protect_tokens": {literal}}}}}}}',
                "config.prune.protect_tokens",
            ),
        ]:
            r = await client.patch("/v1/sessions/s", content=raw, headers=JSON)
            assert_problem(r, 422, field, "not a finite number")
    after = await get_session(client, "s")
    assert after["version"] == before["version"]
    assert after["metadata"] == {"team": "a", "n": 1.5}
    assert after["config"] == before["config"]


async def test_finite_numbers_are_stored_as_sent(client: httpx.AsyncClient) -> None:
    raw = (
        '{"model": "gpt-4o", "id": "s", "metadata":'
        ' {"big": 1e308, "small": 5e-324, "neg": -0.5, "int": 9223372036854775807}}'
    )
    r = await client.post("/v1/sessions", content=raw, headers=JSON)
    assert r.status_code == 201, r.text
    metadata = (await get_session(client, "s"))["metadata"]
    assert metadata == {"big": 1e308, "small": 5e-324, "neg": -0.5, "int": 2**63 - 1}
