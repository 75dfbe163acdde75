"""Many server processes on one listening socket (``compactd serve --workers N``).

``serve`` binds its socket, reaches (or starts) the database and migrates in its own
process, as with one server. With ``--workers N`` that process then runs no server:
:class:`ServerProcesses` starts N children, each of which builds its own app (engine,
pool, event hub) and serves on the inherited socket; the kernel hands each new
connection to whichever child accepts it first. The parent:

- starts the children with multiprocessing's *spawn* method: each is a fresh
  interpreter. A *forked* child would inherit what the parent did before (an event
  loop it ran, its libraries' threads and locks, and the embedded PostgreSQL's
  ``atexit`` stop, which a child's exit would then run);
- restarts a child that dies (a crash, an OOM kill, a SIGKILL), at once if it had run a
  while, else after a pause that doubles up to :data:`MAX_RESTART_PAUSE_SECONDS`; a
  child that exits by itself (no signal killed it) before any child ever served means
  the configuration or the app is wrong, and ``serve`` stops with exit status 3, as one
  server that fails its start-up does;
- on SIGTERM or SIGINT sends each child SIGTERM (uvicorn's graceful stop: requests in
  flight finish, compaction jobs get their grace period), waits ``stop_seconds`` for
  them, then kills what is left. A second signal while they stop is passed on as
  SIGINT, which makes uvicorn stop at once.

The children run in a process group of their own, so that Ctrl-C on a terminal
reaches the parent only (which stops them once, in order) rather than every process
at the same moment; and each watches a pipe from the parent: if the parent dies
(SIGKILL), the pipe closes and the child stops itself gracefully.

Why not uvicorn's ``Multiprocess`` supervisor: it runs uvicorn's own ``Server`` in
each child (not :class:`app.serving.server._ServeServer`, which freezes the collector's
heap and ends event streams before waiting on connections), pickles the app with its
config, and restarts a child that keeps dying without a pause.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Protocol

log = logging.getLogger("compactd.serve")

# What a child whose start-up failed exits with (uvicorn's STARTUP_FAILURE).
STARTUP_FAILURE = 3
# A child that ran this long before it died is restarted at once.
STEADY_SECONDS = 10.0
FIRST_RESTART_PAUSE_SECONDS = 0.5
MAX_RESTART_PAUSE_SECONDS = 30.0

_spawn = multiprocessing.get_context("spawn")


class ChildTarget(Protocol):
    """What a child runs: ``index`` (0 … N-1, kept by a restarted child), the listening
    socket, and ``started``, to call once it serves. Must be picklable: a module-level
    function (or a ``functools.partial`` of one with picklable arguments)."""

    def __call__(self, index: int, sock: socket.socket, started: Callable[[], None]) -> None: ...


def _child_main(
    target: ChildTarget,
    index: int,
    sock: socket.socket,
    started: Connection,
    parent_alive: Connection,
) -> None:
    """A child's first code (in the spawned interpreter)."""
    os.setpgrp()  # Ctrl-C reaches the parent, which stops the children in order
    threading.Thread(
        target=_stop_with_parent, args=(parent_alive,), name="parent-watch", daemon=True
    ).start()

    def tell_started() -> None:
        with contextlib.suppress(OSError):
            started.send(index)

    target(index, sock, tell_started)


def _stop_with_parent(parent_alive: Connection) -> None:
    """Blocks until the parent's end of the pipe closes (the parent is gone, however it
    ended), then stops this process as SIGTERM does."""
    with contextlib.suppress(EOFError, OSError):
        while True:
            parent_alive.recv()
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class _Slot:
    """One of the N places a child runs in; a restarted child takes its dead one's."""

    index: int
    process: BaseProcess | None = None
    started: Connection | None = None  # the child says it serves
    alive: Connection | None = None  # held open while the parent lives
    began_at: float = 0.0
    served: bool = False
    quick_deaths: int = 0
    restart_at: float | None = None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class ServerProcesses:
    """``count`` children running ``target`` on ``sock``, kept running until a signal.

    ``on_serving``: called once, when every child has started serving for the first
    time. ``on_exit``: called with the pid of each child that has ended (its metrics
    files are then dead, see :func:`app.core.metrics.process_ended`)."""

    def __init__(
        self,
        target: ChildTarget,
        count: int,
        sock: socket.socket,
        *,
        stop_seconds: float,
        on_serving: Callable[[], None] | None = None,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self.target = target
        self.sock = sock
        self.stop_seconds = stop_seconds
        self.on_serving = on_serving
        self.on_exit = on_exit
        self.slots = [_Slot(i) for i in range(count)]
        self.signals: list[int] = []
        self.stop_signal: int | None = None
        self.stopping = False
        self.status = 0
        self.announced = False
        self.restarts = 0

    # ---------------------------------------------------------------- running

    def run(self) -> int:
        """Start the children and supervise them until a signal (or a failed start)
        stops them all. Returns the exit status for the command: 0 after SIGINT,
        128 + 15 after SIGTERM (as one server does), 3 when no child ever started."""
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        previous_wakeup = signal.set_wakeup_fd(wake_w.fileno())
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            try:
                for slot in self.slots:
                    self._start(slot)
                while not self.stopping:
                    self._step(wake_r)
            finally:
                self._stop_all(wake_r)  # whatever ended the loop, no child outlives it
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_wakeup)
            wake_r.close()
            wake_w.close()
        return self.status

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)

    def _start(self, slot: _Slot) -> None:
        started_r, started_w = _spawn.Pipe(duplex=False)
        alive_r, alive_w = _spawn.Pipe(duplex=False)
        process = _spawn.Process(
            target=_child_main,
            args=(self.target, slot.index, self.sock, started_w, alive_r),
            name=f"compactd-serve-{slot.index}",
            # Daemonic: should the parent end without stopping them (a bug), its exit
            # still sends them SIGTERM instead of waiting for them forever.
            daemon=True,
        )
        process.start()
        # The child has its own copies now; the parent keeps the ends it reads or holds.
        started_w.close()
        alive_r.close()
        slot.process, slot.started, slot.alive = process, started_r, alive_w
        slot.began_at = time.monotonic()
        slot.served = False
        slot.restart_at = None
        log.info("server process %d started (pid %s)", slot.index, process.pid)

    def _step(self, wake: socket.socket) -> None:
        now = time.monotonic()
        pending = [s.restart_at for s in self.slots if s.restart_at is not None]
        timeout = max(0.0, min(pending) - now) if pending else None
        waiting: list[object] = [wake]
        for slot in self.slots:
            if slot.process is not None:
                waiting.append(slot.process.sentinel)
            if slot.started is not None:
                waiting.append(slot.started)
        wait(waiting, timeout)  # type: ignore[arg-type]
        _drain(wake)
        if self.signals:
            self.stop_signal = self.signals[0]
            self.signals.clear()
            self.stopping = True
            return
        for slot in self.slots:
            self._read_started(slot)
        for slot in self.slots:
            if slot.process is not None and slot.process.exitcode is not None:
                self._ended(slot)
                if self.stopping:
                    return
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                self.restarts += 1
                self._start(slot)

    def _read_started(self, slot: _Slot) -> None:
        if slot.started is None:
            return
        try:
            if not slot.started.poll():
                return
            slot.started.recv()
        except (EOFError, OSError):
            slot.started.close()
            slot.started = None
            return
        slot.served = True
        if not self.announced and all(s.served for s in self.slots):
            self.announced = True
            if self.on_serving is not None:
                self.on_serving()

    def _ended(self, slot: _Slot) -> None:
        """A child has exited while the parent runs on: restart it, or give up."""
        assert slot.process is not None
        process = slot.process
        process.join()
        pid, code = process.pid, process.exitcode
        self._forget(slot)
        self._read_started(slot)  # it may have said it served just before it died
        if slot.started is not None:
            slot.started.close()
            slot.started = None
        served = slot.served
        gave_up = code is not None and code >= 0  # it exited by itself, killed by none
        if gave_up and not self.announced and not any(s.served for s in self.slots):
            log.error(
                "server process %d %s before it could serve; stopping",
                slot.index,
                describe_exit(code),
            )
            self.status = STARTUP_FAILURE
            self.stopping = True
            return
        ran = time.monotonic() - slot.began_at
        if served and ran >= STEADY_SECONDS:
            slot.quick_deaths = 0
        else:
            slot.quick_deaths += 1
        pause = (
            0.0
            if slot.quick_deaths == 0
            else min(
                MAX_RESTART_PAUSE_SECONDS,
                FIRST_RESTART_PAUSE_SECONDS * 2 ** (slot.quick_deaths - 1),
            )
        )
        log.warning(
            "server process %d (pid %s) %s; starting another in %.1f s",
            slot.index,
            pid,
            describe_exit(code),
            pause,
        )
        slot.restart_at = time.monotonic() + pause

    def _forget(self, slot: _Slot) -> None:
        """Close what the parent held for a child that has ended."""
        assert slot.process is not None
        pid = slot.process.pid
        if slot.alive is not None:
            slot.alive.close()
            slot.alive = None
        slot.process.close()
        slot.process = None
        if pid is not None and self.on_exit is not None:
            self.on_exit(pid)

    # --------------------------------------------------------------- stopping

    def _stop_all(self, wake: socket.socket) -> None:
        """SIGTERM to every child; a second signal meanwhile is passed on as SIGINT
        (stop now); whatever still runs after ``stop_seconds`` is killed."""
        if self.stop_signal == signal.SIGTERM:
            self.status = 128 + signal.SIGTERM
        self._send(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_seconds
        while self._running() and time.monotonic() < deadline:
            wait(
                [wake, *(p.sentinel for p in self._running())],
                max(0.0, deadline - time.monotonic()),
            )
            _drain(wake)
            if self.signals:
                self.signals.clear()
                log.warning("stopping the server processes now (a second signal)")
                self._send(signal.SIGINT)
        for process in self._running():
            log.warning(
                "server process pid %s did not stop within %.0f s: killing it",
                process.pid,
                self.stop_seconds,
            )
            process.kill()
        for slot in self.slots:
            if slot.process is not None:
                slot.process.join()
                self._forget(slot)
            if slot.started is not None:
                slot.started.close()
                slot.started = None
            slot.restart_at = None

    def _running(self) -> list[BaseProcess]:
        return [
            s.process for s in self.slots if s.process is not None and s.process.exitcode is None
        ]

    def _send(self, sig: int) -> None:
        for process in self._running():
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)


def _drain(wake: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while wake.recv(512):
            pass
