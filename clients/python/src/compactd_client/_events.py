"""Event streams: compactd's server-sent events, read and parsed, and resumed after a
dropped connection.

:class:`EventStream` (sync) and :class:`AsyncEventStream` (async) iterate over a
stream's events as :class:`~compactd_client.types.Event` dicts. Comments (the server's
keep-alives) are skipped. When the connection drops, or the server ends the stream
(it does when it shuts down), the stream connects again with ``Last-Event-ID`` (the
last event it read), so the events go on after that one, none lost or repeated. It
waits before each new connection as the client waits between retries (capped
exponential backoff, and at least the server's ``retry:`` and ``Retry-After``), and
gives up after ``max_retries`` connections in a row that brought nothing, raising
:class:`~compactd_client.CompactdConnectionError` (or the
:class:`~compactd_client.ProblemError` the server answered: a session deleted meanwhile
is a ``NotFoundError``).

A stream holds a connection until it is closed: use it as a context manager, or call
``close()`` (``aclose()``). Nothing runs in the background: when the caller stops
iterating, nothing more is read or retried.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, cast

import httpx

from compactd_client import types as t
from compactd_client._base import RETRYABLE_ERRORS, BaseClient
from compactd_client._calls import Call
from compactd_client.errors import CompactdError

# The SSE line ends: CRLF, LF or a lone CR. (Not str.splitlines(): an event's JSON may
# hold U+2028 and other characters it splits on.)
_LINE_END = re.compile(rb"\r\n|\r|\n")


class StreamEnded(Exception):
    """The server ended the stream (it does when it shuts down): connect again."""


@dataclass(frozen=True, slots=True)
class Message:
    """One server-sent event as it came: its id, event type and data."""

    id: str | None
    type: str
    data: str


class SSEParser:
    """The event stream format of the HTML standard, fed bytes as they arrive.

    ``last_event_id`` is the id of the last event dispatched (or the one the stream
    resumes after), ``retry_seconds`` the reconnection time the server asked for.
    ``heard`` turns true when an event or a comment arrives (the reader clears it).
    """

    def __init__(self, last_event_id: str | None = None) -> None:
        self.last_event_id = last_event_id
        self.retry_seconds: float | None = None
        self.heard = False
        self.restart()

    def restart(self) -> None:
        """A new connection: whatever the old one left unfinished is dropped."""
        self._rest = b""
        self._first = True
        self._data: list[str] = []
        self._type = ""
        self._id = self.last_event_id

    def feed(self, chunk: bytes) -> list[Message]:
        """The events that ``chunk`` completes (an unfinished one waits for more)."""
        buffer = self._rest + chunk
        # The rest holds no line end, but maybe a last CR whose LF is in this chunk.
        scan = max(0, len(self._rest) - 1)
        messages: list[Message] = []
        start = 0
        for end in _LINE_END.finditer(buffer, scan):
            if end.group() == b"\r" and end.end() == len(buffer):
                break  # a CR at the end: its LF may come next
            message = self._line(buffer[start : end.start()].decode("utf-8", "replace"))
            start = end.end()
            if message is not None:
                messages.append(message)
        self._rest = buffer[start:]
        return messages

    def _line(self, line: str) -> Message | None:
        if self._first:
            line = line.removeprefix("\ufeff")
            self._first = False
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.heard = True
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_seconds = int(value) / 1000
        return None

    def _dispatch(self) -> Message | None:
        self.last_event_id = self._id
        data, kind = self._data, self._type or "message"
        self._data, self._type = [], ""
        if not data:
            return None
        self.heard = True
        return Message(self._id, kind, "\n".join(data))


def event_of(message: Message) -> t.Event:
    """The event a message carries (its data is the event's JSON)."""
    try:
        doc: Any = json.loads(message.data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or "id" not in doc or "type" not in doc:
        raise CompactdError(
            f"event {message.id!r} ({message.type}) is not an event: {message.data[:200]!r}"
        )
    return cast(t.Event, doc)


class _Stream:
    """What both streams share: where to resume, the events read but not yet taken,
    and how long to wait before connecting again."""

    def __init__(self, client: BaseClient, call: Call[None], last_event_id: str | None) -> None:
        self._client = client
        self._call = call
        self._parser = SSEParser(last_event_id)
        self._ready: deque[t.Event] = deque()
        self._failures = 0  # connections in a row that brought nothing
        self._closed = False
        self.last_event_id = last_event_id
        """The id of the last event taken from the stream (or the one it started after):
        a new stream given it as ``last_event_id`` goes on from there."""

    @property
    def closed(self) -> bool:
        return self._closed

    def _request_call(self) -> Call[None]:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self._parser.last_event_id:
            headers["Last-Event-ID"] = self._parser.last_event_id
        return replace(self._call, headers=headers)

    def _check(self, response: httpx.Response) -> None:
        kind = response.headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            raise CompactdError(
                f"{self._call.method} {self._call.path} answered {kind or 'no content type'}, "
                "not an event stream"
            )

    def _feed(self, chunk: bytes) -> None:
        self._ready.extend(event_of(m) for m in self._parser.feed(chunk))
        if self._parser.heard:
            self._parser.heard = False
            self._failures = 0

    def _wait(self, failure: httpx.Response | Exception) -> float:
        """Seconds to wait before connecting again after ``failure``; raises it when it
        is final (not retryable, or ``max_retries`` failures in a row)."""
        delay = self._client._retry_delay(self._call, self._failures, failure)
        self._failures += 1
        return max(delay, self._parser.retry_seconds or 0.0)

    def _take(self) -> t.Event:
        event = self._ready.popleft()
        self.last_event_id = event["id"]
        return event


class EventStream(_Stream, Iterator[t.Event]):
    """A stream of compactd's events (``Compactd.events``, ``Compactd.tenant_events``):
    iterate over it; close it (or use ``with``) when done."""

    def __init__(
        self,
        client: BaseClient,
        http: httpx.Client,
        call: Call[None],
        last_event_id: str | None,
    ) -> None:
        super().__init__(client, call, last_event_id)
        self._http = http
        self._response: httpx.Response | None = None
        self._chunks: Iterator[bytes] | None = None

    def open(self) -> None:
        """Connect (retrying as the client does); a problem answer raises now."""
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        while True:
            request = self._client._stream_request(self._http, self._request_call())
            try:
                response = self._http.send(request, stream=True)
            except RETRYABLE_ERRORS as exc:
                failure: httpx.Response | Exception = exc
            else:
                if response.is_success:
                    self._response = response
                    self._check(response)
                    self._parser.restart()
                    self._chunks = response.iter_bytes()
                    return
                try:
                    response.read()
                finally:
                    response.close()
                failure = response
            time.sleep(self._wait(failure))

    def _disconnect(self) -> None:
        self._chunks = None
        if self._response is not None:
            self._response.close()
            self._response = None

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> t.Event:
        try:
            while not self._ready:
                if self._closed:
                    raise StopIteration
                if self._chunks is None:
                    self._connect()
                    continue
                try:
                    chunk = next(self._chunks)
                except StopIteration:
                    failure: Exception = StreamEnded("the server ended the event stream")
                except RETRYABLE_ERRORS as exc:
                    failure = exc
                else:
                    self._feed(chunk)
                    continue
                self._disconnect()
                time.sleep(self._wait(failure))
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise
        return self._take()

    def close(self) -> None:
        """Close the connection; the iteration ends."""
        self._closed = True
        self._ready.clear()
        self._disconnect()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncEventStream(_Stream, AsyncIterator[t.Event]):
    """A stream of compactd's events (``AsyncCompactd.events``,
    ``AsyncCompactd.tenant_events``): ``async for`` over it; ``aclose()`` it (or use
    ``async with``) when done."""

    def __init__(
        self,
        client: BaseClient,
        http: httpx.AsyncClient,
        call: Call[None],
        last_event_id: str | None,
    ) -> None:
        super().__init__(client, call, last_event_id)
        self._http = http
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None

    async def open(self) -> None:
        """Connect (retrying as the client does); a problem answer raises now."""
        try:
            await self._connect()
        except BaseException:
            await self.aclose()
            raise

    async def _connect(self) -> None:
        while True:
            request = self._client._stream_request(self._http, self._request_call())
            try:
                response = await self._http.send(request, stream=True)
            except RETRYABLE_ERRORS as exc:
                failure: httpx.Response | Exception = exc
            else:
                if response.is_success:
                    self._response = response
                    self._check(response)
                    self._parser.restart()
                    self._chunks = response.aiter_bytes()
                    return
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                failure = response
            await asyncio.sleep(self._wait(failure))

    async def _disconnect(self) -> None:
        chunks, self._chunks = self._chunks, None
        response, self._response = self._response, None
        # The body's generator first: left to the garbage collector, the event loop
        # would close it later (or complain that it could not).
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
        if response is not None:
            await response.aclose()

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> t.Event:
        try:
            while not self._ready:
                if self._closed:
                    raise StopAsyncIteration
                if self._chunks is None:
                    await self._connect()
                    continue
                try:
                    chunk = await anext(self._chunks)
                except StopAsyncIteration:
                    failure: Exception = StreamEnded("the server ended the event stream")
                except RETRYABLE_ERRORS as exc:
                    failure = exc
                else:
                    self._feed(chunk)
                    continue
                await self._disconnect()
                await asyncio.sleep(self._wait(failure))
        except StopAsyncIteration:
            raise
        except BaseException:
            await self.aclose()
            raise
        return self._take()

    async def aclose(self) -> None:
        """Close the connection; the iteration ends."""
        self._closed = True
        self._ready.clear()
        await self._disconnect()

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
