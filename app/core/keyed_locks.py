"""One asyncio lock per key, in this process, kept only while someone holds or awaits
it: how appends to one session, and proxied calls on one session, take turns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable


class KeyedLocks:
    """A lock per key, made when the first caller asks for it and dropped when the last
    one leaves, so that the table holds only the keys in use."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def busy(self, key: Hashable) -> bool:
        """Whether someone holds the key's lock or waits for it."""
        return key in self._locks

    async def acquire(self, key: Hashable, wait_seconds: float | None = None) -> Callable[[], None]:
        """Wait for the key's lock (at most ``wait_seconds``, then TimeoutError);
        returns the function that releases it (call it exactly once)."""
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
        except BaseException:
            leave()
            raise

        def release() -> None:
            lock.release()
            leave()

        return release

    @contextlib.asynccontextmanager
    async def held(self, key: Hashable) -> AsyncIterator[None]:
        """The key's lock, held for the block."""
        release = await self.acquire(key)
        try:
            yield
        finally:
            release()
