"""One proxied call at a time per session in this process: a second call waits for the
first to end, then is matched against the history the first left (docs/proxy.md, "One
call at a time per session")."""

from __future__ import annotations

from collections.abc import Callable

from app.core.errors import Conflict
from app.core.keyed_locks import KeyedLocks


class Turns:
    """The sessions' turns in this process, each taken by one call at a time."""

    def __init__(self) -> None:
        self._locks = KeyedLocks()

    def busy(self, key: tuple[str, str]) -> bool:
        """Whether a call has the session's turn, or waits for it."""
        return self._locks.busy(key)

    async def take(self, key: tuple[str, str], wait_seconds: float) -> Callable[[], None]:
        """Wait for the session's turn (at most ``wait_seconds``, then 409); returns the
        function that gives it back (call it exactly once)."""
        try:
            return await self._locks.acquire(key, wait_seconds)
        except TimeoutError:
            raise Conflict(
                f"another call on session {key[1]!r} has been in progress for {wait_seconds:g} s; "
                "calls on one session are served one at a time"
            ) from None


turns = Turns()
