"""The committed OpenAPI document matches the app, and every route documents its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import _openapi_document
from app.main import create_app
from tests.conftest import TEST_SETTINGS

COMMITTED = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_openapi_document())
    return data


def test_committed_spec_is_current() -> None:
    assert COMMITTED.exists(), "openapi/openapi.json is missing: run `make openapi`"
    assert COMMITTED.read_text(encoding="utf-8") == _openapi_document(), (
        "openapi/openapi.json is out of date with the app: run `make openapi` and commit it"
    )


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if path.startswith("/v1/")
    ]


def test_every_v1_operation_documents_its_problems(spec: dict[str, Any]) -> None:
    ops = _operations(spec)
    assert len(ops) >= 8
    missing: list[str] = []
    for path, method, op in ops:
        responses = op["responses"]
        wanted = {"503"}
        if "{session_id}" in path:
            wanted.add("404")
        if method in ("post", "patch") or op.get("parameters"):
            wanted.add("422")
        if any(p["name"].lower() == "if-match" for p in op.get("parameters", [])):
            wanted.add("412")
        if method in ("post", "patch") and "requestBody" in op:
            wanted.add("413")
        for code in sorted(wanted - set(responses)):
            missing.append(f"{method.upper()} {path}: {code}")
        for code, response in responses.items():
            if code.startswith(("4", "5")):
                assert response["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }, f"{method} {path} {code}"
    assert not missing, "undocumented problem responses:\n" + "\n".join(missing)


def test_problem_schema_is_published(spec: dict[str, Any]) -> None:
    problem = spec["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail"} <= set(problem["required"])
    assert "errors" in problem["properties"]
    assert "current_version" in problem["properties"]


async def test_served_spec_is_the_committed_one() -> None:
    app = create_app(TEST_SETTINGS)  # no lifespan: the spec needs no database
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as client:
        r = await client.get("/openapi.json")
    assert r.status_code == 200
    assert r.json() == json.loads(_openapi_document())
    assert "HTTPValidationError" not in r.text
