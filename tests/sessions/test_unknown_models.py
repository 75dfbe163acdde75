"""No silent default for a model in no catalog: the session document warns, the model
is logged once per process, and the operator's settings fix it
(COMPACTD_DEFAULT_CONTEXT_WINDOW, COMPACTD_MODEL_CATALOG)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import httpx
import pytest

from app.core.settings import Settings
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import get_session

CATALOG = """
["my-local-8k"]
context_window = 8192
max_output_tokens = 2048

["gpt-4o"]
context_window = 64000
"""


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "models.toml"
    path.write_text(CATALOG, encoding="utf-8")
    # Read and checked as at start (a copy would not read the file).
    changes = {"model_catalog": path, "default_context_window": 16_384}
    return Settings(**{**TEST_SETTINGS.model_dump(exclude={"upstream_api_key"}), **changes})


def unknown_model() -> str:
    """A name no earlier test of this process has used (each is logged once)."""
    return f"zeta-llm-{uuid.uuid4().hex[:8]}"


async def test_an_unknown_model_is_answered_with_a_warning(client: httpx.AsyncClient) -> None:
    model = unknown_model()
    created = await make_session(client, id="unknown", model=model)
    assert created["model_known"] is False
    assert created["context_window"] == 16_384  # COMPACTD_DEFAULT_CONTEXT_WINDOW
    assert created["max_output_tokens"] == 4096  # a quarter of a small default window
    assert created["usable_tokens"] == 16_384 - 4096
    [warning] = created["warnings"]
    assert warning["code"] == "unknown_model"
    assert model in warning["detail"]
    assert "16384" in warning["detail"]
    assert "COMPACTD_MODEL_CATALOG" in warning["detail"]
    assert (await get_session(client, "unknown"))["warnings"] == created["warnings"]
    listed = (await client.get("/v1/sessions")).json()["sessions"]
    assert [s["warnings"] for s in listed if s["id"] == "unknown"] == [created["warnings"]]


async def test_an_unknown_model_is_logged_once(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    model, other = unknown_model(), unknown_model()
    with caplog.at_level(logging.WARNING, logger="compactd.catalog"):
        for k in range(3):
            await make_session(client, id=f"once-{k}", model=model)
            await get_session(client, f"once-{k}")
        await make_session(client, id="other", model=other)
    logged = [r.getMessage() for r in caplog.records if r.name == "compactd.catalog"]
    assert len([m for m in logged if repr(model) in m]) == 1, logged
    assert len([m for m in logged if repr(other) in m]) == 1, logged
    assert "16384" in logged[0]


async def test_a_session_with_its_own_window_is_not_warned(client: httpx.AsyncClient) -> None:
    s = await make_session(client, model=unknown_model(), context_window=8000)
    assert s["model_known"] is False
    assert s["warnings"] == []
    # The default output cap is the default window's: a quarter of a smaller one.
    assert (s["context_window"], s["max_output_tokens"], s["usable_tokens"]) == (8000, 2000, 6000)


async def test_the_operators_catalog_names_and_overrides_models(
    client: httpx.AsyncClient,
) -> None:
    local = await make_session(client, model="ollama/my-local-8k:q4")
    assert local["model_known"] is True
    assert local["warnings"] == []
    assert (local["context_window"], local["max_output_tokens"]) == (8192, 2048)
    assert local["usable_tokens"] == 8192 - 2048
    gpt = await make_session(client, model="gpt-4o-mini")
    assert (gpt["context_window"], gpt["max_output_tokens"]) == (64_000, 16_384)
    claude = await make_session(client, model="claude-sonnet-4")  # the built-in entry
    assert (claude["context_window"], claude["model_known"]) == (200_000, True)
