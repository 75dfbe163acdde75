"""One proxied call at a time per session in this process: a second call waits for the
first to end, then is matched against the history the first left (docs/proxy.md, "One
call at a time per session")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app.core.errors import Conflict


class Turns:
    """The sessions' turns in this process, each taken by one call at a time."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    def busy(self, key: tuple[str, str]) -> bool:
        """Whether a call has the session's turn, or waits for it."""
        return key in self._locks

    async def take(self, key: tuple[str, str], wait_seconds: float) -> Callable[[], None]:
        """Wait for the session's turn (at most ``wait_seconds``, then 409); returns the
        function that gives it back (call it exactly once)."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)

        def leave() -> None:
            held, count = self._locks[key]
            if count == 1:
                del self._locks[key]
            else:
                self._locks[key] = (held, count - 1)

        try:
            async with asyncio.timeout(wait_seconds):
                await lock.acquire()
        except TimeoutError:
            leave()
            raise Conflict(
                f"another call on session {key[1]!r} has been in progress for {wait_seconds:g} s; "
                "calls on one session are served one at a time"
            ) from None
        except BaseException:
            leave()
            raise

        def release() -> None:
            lock.release()
            leave()

        return release


turns = Turns()
