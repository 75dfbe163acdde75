"""What the workers of a parallel run share (pytest-xdist: ``make test``, ``make test-fast``).

* **One Postgres for the run.** The controller (the process that starts the workers)
  finds the Postgres (:func:`tests.postgres.postgres_server`) and hands its URL to
  every worker; each worker migrates a template database of its own and clones it,
  under a database-name prefix of its own. The controller stops the server, or drops
  the run's databases on a ``DATABASE_URL`` server, after the last worker is gone, even
  one that crashed.
* **Work handed out in an order that keeps the workers busy to the end**
  (:func:`in_run_order` and :func:`scheduler`, for ``--dist loadfile
  --no-loadscope-reorder``). A module is one unit of work, so that its tests run
  together and in their order, as in a serial run, except that each slow test (a trace
  replay takes a minute or more) is a unit of its own. The slow ones go first, to
  whichever worker is free; the quick modules fill in around them; the modules with
  ``alone`` tests come last.
* **A lock for the tests that must run alone** (marked ``alone``): a test whose timing
  windows a neighbour would squeeze (a step that must fit while an upstream call hangs,
  a kill that must catch some appends in flight) holds the lock exclusively, from the
  first such test of its module to the last, and every other test holds it shared, so
  it runs while no other test of the run does, as in a serial run. It waits for the
  other workers to finish what they were handed, and they wait only while it runs.

A run without xdist (``pytest`` alone, ``-n 0``) uses none of this: its one process
starts the Postgres itself and takes no lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

# The key of what the controller hands each worker in ``workerinput``.
WORKER_INPUT = "compactd"


def is_controller(config: Any) -> bool:
    """True in the controller of an xdist run (``-n N`` with N > 0)."""
    if hasattr(config, "workerinput"):
        return False
    workers = getattr(config.option, "numprocesses", None)
    return bool(workers) and getattr(config.option, "dist", "no") != "no"


def from_controller(config: Any) -> dict[str, str] | None:
    """What the controller handed this worker, or None outside an xdist worker."""
    workerinput: dict[str, Any] = getattr(config, "workerinput", {})
    shared: dict[str, str] | None = workerinput.get(WORKER_INPUT)
    return shared


class RunLock:
    """A readers-writer lock between the processes of one run: ``flock`` on one file,
    shared by ordinary tests, exclusive for ``alone`` ones. A waiting writer does not
    hold the readers back (no turnstile): the other workers go on with the tests already
    handed to them, so none stands idle behind an ``alone`` test that waits for a long
    one to end, and the writer gets the lock once they are through. That wait is
    bounded, since the ``alone`` modules are handed out last (:func:`in_run_order`): by
    then nothing else is left to hand out. The kernel drops the lock of a process that
    dies."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "run.lock"
        self._held: int | None = None  # the file descriptor while held
        self.exclusive = False

    @property
    def held(self) -> bool:
        return self._held is not None

    def take(self, *, exclusive: bool) -> None:
        assert self._held is None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        self._held, self.exclusive = fd, exclusive

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)  # closing the file releases its lock
            self._held = None


def in_run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests in the order the run hands them out: the modules with slow tests first,
    the modules with an ``alone`` test last, the others in between, each part in
    collection order. Every worker collects, and comes to the same order."""
    slow = {_module(i) for i in items if i.get_closest_marker("slow") is not None}
    alone = {_module(i) for i in items if i.get_closest_marker("alone") is not None}

    def part(item: pytest.Item) -> int:
        module = _module(item)
        return 2 if module in alone else 0 if module in slow else 1

    return sorted(items, key=part)  # sorted() is stable


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def note_slow_tests(folder: Path, items: list[pytest.Item]) -> None:
    """Tell the controller's scheduler which tests are slow (a worker's collection knows
    the marks, the controller only sees test ids). Every worker writes the same list."""
    slow = [i.nodeid for i in items if i.get_closest_marker("slow") is not None]
    part = folder / f"slow.{os.getpid()}.tmp"
    part.write_text("\n".join(slow))
    part.replace(folder / "slow.txt")


def scheduler(config: pytest.Config, log: Any, folder: Path) -> Any:
    """xdist's ``loadfile`` scheduling (a module is one unit of work), except that each
    slow test is a unit of its own: a module of several long tests (two trace replays
    of a minute and a half each) is spread over the workers instead of holding one."""
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class SlowTestsApart(LoadFileScheduling):  # type: ignore[misc]
        slow: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.slow is None:  # read once the workers have collected
                noted = folder / "slow.txt"
                self.slow = frozenset(noted.read_text().splitlines() if noted.exists() else ())
            if nodeid in self.slow:
                return nodeid
            scope: str = super()._split_scope(nodeid)
            return scope

    return SlowTestsApart(config, log)
