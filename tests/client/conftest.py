"""A real compactd (uvicorn, its compaction workers inside, as ``compactd serve`` runs
it) on its own database for each test, summarizing with the test's scripted upstream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.e2e.server import running
from tests.upstream_server import Upstream


def serving(settings: Settings, upstream: Upstream) -> Settings:
    return settings.model_copy(
        update={
            "compaction_workers": 1,
            "compaction_poll_seconds": 0.2,
            "compaction_shutdown_grace_seconds": 1.0,
            "upstream_base_url": upstream.url,
            "upstream_api": "openai",
            "upstream_timeout_seconds": 30.0,
        }
    )


@pytest.fixture
def compactd_url(db_url: str, settings: Settings, upstream: Upstream) -> Iterator[str]:
    """The base URL of this test's compactd."""
    with running(create_app(serving(settings, upstream), database_url=db_url)) as base:
        yield base
