"""Fixtures of the agent tier: the installed agents (a failure under CI=true when one is
missing, a skip naming the install command elsewhere) and the closed proxy port."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import pytest

from tests.agents.agents import closed_port
from tests.agents.install import AGENTS, INSTALL_COMMAND, Agent, version_of


@functools.cache
def _installed(name: str) -> tuple[Agent, str | None]:
    agent = next(a for a in AGENTS if a.name == name)
    return agent, version_of(agent)


def require(name: str) -> Agent:
    """The agent ``name``, installed at its pinned version: CI fails without it (its
    .ci/run installs them), a developer's run skips, saying how to install it."""
    agent, version = _installed(name)
    if version is None:
        reason = f"{agent.spec} is not installed in {agent.folder}: run {INSTALL_COMMAND}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return agent


@pytest.fixture(scope="session")
def dead_port() -> Iterator[int]:
    """Where every agent's HTTP(S) proxy points: a loopback port that refuses."""
    with closed_port() as port:
        yield port
