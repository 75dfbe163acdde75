"""Targets for app.serving.supervisor's children in tests (module-level, so that a spawned
child finds them by name)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable


def exits_at_once(index: int, sock: socket.socket, started: Callable[[], None]) -> None:
    """A server that cannot start: it exits with status 1 before it serves."""
    sys.exit(1)
