"""A pg_auto_failover formation for the failover tests (tests/ha/cluster.py), one per
test process, migrated through its primary with the service's own multi-host URL.

Without ``pg_autoctl`` (Debian's ``postgresql-15-auto-failover``) the tests are skipped,
except in CI (``CI=true``), where .ci/run installs it and its absence is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from app.core import migrations
from app.core.database import resolve_database_url
from tests.conftest import TEST_SETTINGS
from tests.e2e.server import free_port
from tests.ha.cluster import ROLE, Formation, pg_autoctl_binary, running_formation


def _binary() -> str:
    found = pg_autoctl_binary()
    if found is not None:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(
            "pg_autoctl is not installed in CI: .ci/run installs it "
            "(apt-get install postgresql-15 postgresql-15-auto-failover)"
        )
    pytest.skip(
        "pg_autoctl is not installed: `apt-get install postgresql-15-auto-failover` "
        "runs the failover tests"
    )


def service_uri(formation: Formation) -> str:
    """``pg_autoctl show uri`` for the service's role: every node, in the libpq
    multi-host form, with ``target_session_attrs=read-write``."""
    uri = formation.uri()
    assert "target_session_attrs=read-write" in uri, uri
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{ROLE}@{rest.split('@', 1)[-1]}"


@pytest.fixture(scope="session")
def formation() -> Iterator[Formation]:
    binary = _binary()
    with running_formation(binary, [free_port() for _ in range(3)]) as built:
        url = resolve_database_url(
            TEST_SETTINGS.model_copy(update={"database_url": service_uri(built)})
        )
        migrations.upgrade(url)
        yield built
