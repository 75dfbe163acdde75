"""What a proxied call answers the agent with: a whole body, or a stream of events,
and what each leaves to do once the response has ended (docs/proxy.md, "Inside a
call")."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass


class EventStream:
    """A streamed reply's events, closed exactly once however the response ends: its
    events iterated to the end, abandoned midway (the agent hung up), or never started
    (the agent hung up before the first). Closing it runs what the stream leaves to do
    (``on_unstarted`` when it never started)."""

    def __init__(
        self, events: AsyncGenerator[bytes, None], on_unstarted: Callable[[], Awaitable[None]]
    ) -> None:
        self._events = events
        self._on_unstarted = on_unstarted
        self._started = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> bytes:
        self._started = True
        return await self._events.__anext__()

    async def aclose(self) -> None:
        if self._started:
            await self._events.aclose()  # runs its cleanup if it stopped midway
        else:
            self._started = True
            await self._on_unstarted()


class Delivery:
    """What a whole reply leaves to do once its response has ended, told exactly once
    whether its body went out to an agent still connected (only then is it stored)."""

    def __init__(self, then: Callable[[bool], None]) -> None:
        self._then: Callable[[bool], None] | None = then

    def __call__(self, sent: bool) -> None:
        then, self._then = self._then, None
        if then is not None:
            then(sent)


@dataclass(slots=True)
class Answer:
    """What goes back to the agent: a whole body, or a stream of events (close it once
    the response has ended). A whole reply to store comes with its ``delivery``: tell it,
    once the response has ended, whether the body was sent."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: EventStream | None = None
    media_type: str = "application/json"
    # The session's turn passed on to what the call left to do (storing its reply).
    holds_turn: bool = False
    delivery: Delivery | None = None
