"""Fixtures of the resilience tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.resilience.support import DedicatedPostgres, dedicated_postgres


@pytest.fixture
def pg() -> Iterator[DedicatedPostgres]:
    """A dedicated Postgres of the test's own, that it may stop, freeze and restart."""
    with dedicated_postgres() as server:
        yield server
