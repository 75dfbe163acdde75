"""Which of a proxied request's messages are new: its history matched against the stored one.

An agent behind the proxy re-sends its whole history on every call. compactd stores each
message once, so on every call it must find where the stored history ends in the
request, and check that everything before that point is what it stored. Comparing the
messages themselves would read the whole stored history on every call; instead each
stored message entry has a digest of its *canonical form*, and the session keeps a
running chain of them (``chain = sha256(chain || digest)``). A request matches when the
chain of its first N entries equals the stored chain over N entries: one comparison,
whatever the history's length.

The canonical form is what an SDK keeps when it sends a message back, and only that:
the role, the name, the tool call id a result answers, whether it is an error, the text
(a string and a list holding one text block are the same; empty text is nothing), tool
calls with their arguments as sorted JSON, images. Left out: keys the stored history
keeps but SDKs add or drop (``refusal``, ``annotations``, ``audio``, ``function_call``
as null, ``cache_control``, ``citations``...), key order, and reasoning (thinking blocks,
``reasoning_content``), which providers ask agents to drop from earlier turns.

Hashing every re-sent message on every call would still cost CPU in proportion to the
history, so there is a faster path first: the raw digest of the request's messages as the
agent serialized them (compact JSON, in its key order) up to a point of the previous call.
When the new request's messages up to that point serialize to the same bytes (the agent
sends its history back untouched, as agents do), only the messages after it are parsed
and hashed. The point stops :data:`RAW_TAIL_MESSAGES` short of the end of the previous
request, where agents move their cache markers.

Pruning adds marks and leaves the stored messages as they were, so the chain (made of
what was stored, and what the agent sends) is not touched by it. ``prune.erase`` does
clear a stored tool output: the chain the proxy recorded before still holds its digest,
and an erased entry that must be read again (the proxy catching up on entries it did not
store, or locating a divergence) is matched *blind*, by what erasing leaves (its role, its
name, the call it answers, whether it is an error): compactd no longer has the text to
compare, and the chain goes on with the digest of what the agent sent.

Pure: the caller reads the stored chain, and writes the new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from app.engine.formats import opaque
from app.engine.model import Entry

DIGEST_BYTES = 32
EMPTY_CHAIN = bytes(DIGEST_BYTES)
# Messages at the end of a request that the next call's raw fast path hashes again as
# canonical forms: agents move prompt-cache markers on their last messages.
RAW_TAIL_MESSAGES = 4

ParseMessage = Callable[[Any, str], list[Entry]]
"""A format's parser: one wire message to its entries (raises ``InvalidMessage``)."""


def _arguments(arguments: str) -> Any:
    try:
        return orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        return arguments.strip()


def _canonical_parts(entry: Entry) -> list[Any]:
    parts: list[Any] = []
    for part in entry.parts:
        kind = part["type"]
        if kind == "text":
            if part["text"]:
                parts.append(["text", part["text"]])
        elif kind == "tool_call":
            parts.append(["call", part["id"], part["name"], _arguments(part["arguments"])])
        elif kind == "image":
            parts.append(["image", part.get("url"), part.get("media_type"), part.get("data")])
        elif kind == "opaque":
            parts.append(["opaque", opaque.comparable(part)])
        elif kind != "reasoning":
            parts.append([kind, {k: v for k, v in part.items() if k != "extra"}])
    return parts


def canonical(entry: Entry) -> bytes:
    """The entry as SDKs send it back (see the module's docstring), as JSON bytes."""
    return orjson.dumps(
        [entry.role, entry.name, entry.tool_call_id, entry.is_error, _canonical_parts(entry)],
        option=orjson.OPT_SORT_KEYS,
    )


def contentless(entry: Entry) -> bool:
    """An assistant entry with nothing an SDK sends back: no text, no tool call (an empty
    reply, or one of reasoning only). Agents keep such a reply in their history, or drop
    it (Anthropic refuses an empty assistant message before the last)."""
    return entry.role == "assistant" and not _canonical_parts(entry)


def digest(entry: Entry) -> bytes:
    return hashlib.sha256(canonical(entry)).digest()


def blind_digest(entry: Entry) -> bytes:
    """What is left to compare of an entry whose content ``prune.erase`` cleared."""
    return hashlib.sha256(
        orjson.dumps(["erased", entry.role, entry.name, entry.tool_call_id, entry.is_error])
    ).digest()


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored message entry read back for matching: its digest, or, when pruning erased
    its content, its :func:`blind_digest`."""

    digest: bytes
    erased: bool = False

    @classmethod
    def of(cls, entry: Entry, erased: bool = False) -> Stored:
        return cls(blind_digest(entry), True) if erased else cls(digest(entry))

    def matches(self, entry: Entry, entry_digest: bytes | None = None) -> bool:
        """Whether the request's ``entry`` (its digest if already made) is this one."""
        if self.erased:
            return blind_digest(entry) == self.digest
        return (entry_digest or digest(entry)) == self.digest


def extend(chain: bytes, digests: Iterable[bytes]) -> bytes:
    """The chain after the entries with these digests."""
    for d in digests:
        chain = hashlib.sha256(chain + d).digest()
    return chain


class RawDigest:
    """A digest of a list of messages as compact JSON, extended a slice at a time: the
    digest after ``add(a); add(b)`` is the one of ``a + b``."""

    __slots__ = ("_hash", "count")

    def __init__(self) -> None:
        self._hash = hashlib.sha256(b"[")  # SHA-NI: the fastest hashlib has here
        self.count = 0

    def add(self, messages: Sequence[Any]) -> None:
        if not messages:
            return
        inner = orjson.dumps(messages)[1:-1]
        if self.count:
            self._hash.update(b",")
        self._hash.update(inner)
        self.count += len(messages)

    def digest(self) -> bytes:
        return self._hash.digest()


def raw_digest(messages: Sequence[Any]) -> bytes:
    raw = RawDigest()
    raw.add(messages)
    return raw.digest()


@dataclass(frozen=True, slots=True)
class Known:
    """What is known of a session's stored history: the chain over its first
    ``entry_count`` message entries and, from the previous call, the raw digest of that
    request's first ``raw_count`` messages, which made ``raw_entry_count`` entries whose
    chain is ``raw_chain``."""

    entry_count: int = 0
    chain: bytes = EMPTY_CHAIN
    raw_count: int = 0
    raw_digest: bytes | None = None
    raw_entry_count: int = 0
    raw_chain: bytes = EMPTY_CHAIN


@dataclass(frozen=True, slots=True)
class Boundary:
    """After ``messages`` of the request's messages: its ``entries`` entries, and their chain."""

    messages: int
    entries: int
    chain: bytes


@dataclass(slots=True)
class Matched:
    """The request extends the stored history: its messages from ``new_from`` on are new."""

    new_from: int
    # From the first message hashed (the raw fast path skips a prefix) to the last.
    boundaries: list[Boundary]
    fast: bool  # whether the raw fast path skipped a prefix
    raw: RawDigest = field(repr=False)

    @property
    def end(self) -> Boundary:
        """The chain over all the request's entries: the stored one once the new are stored."""
        return self.boundaries[-1]

    def boundary(self, messages: int) -> Boundary:
        """The boundary after ``messages`` messages (at least the first one hashed)."""
        first = self.boundaries[0].messages
        return self.boundaries[max(messages, first) - first]


@dataclass(frozen=True, slots=True)
class Diverged:
    """The request's history is not the stored one (``stored_entries`` message entries)
    followed by new messages: ``shorter``, the request ended before the stored history
    did (then ``entries`` and ``chain`` are its own: all of it matched the stored
    history's first entries); ``inside_message``, the stored history ends inside that
    request message (which cannot be stored in part); else an entry differs."""

    stored_entries: int
    shorter: bool = False
    inside_message: int | None = None
    entries: int = field(default=0, compare=False)
    chain: bytes = field(default=EMPTY_CHAIN, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Start:
    """Where matching starts: after the request's first ``messages`` messages, which
    make ``entries`` entries whose chain is ``chain``, their raw digest in ``raw``
    (from 0, or past the prefix the raw fast path skipped: ``fast``)."""

    messages: int
    entries: int
    chain: bytes
    raw: RawDigest
    fast: bool


def start(messages: Sequence[Any], known: Known) -> Start:
    """The raw fast path (see the module's docstring): past the previous request's
    first ``known.raw_count`` messages when they serialize to the same bytes, else the
    beginning. Serializing and hashing only (C code, a millisecond or two for 10,000
    messages); :func:`match` parses the rest."""
    raw = RawDigest()
    if (
        known.raw_digest is not None
        and 0 < known.raw_count <= len(messages)
        and known.raw_entry_count <= known.entry_count
    ):
        raw.add(messages[: known.raw_count])
        if raw.digest() == known.raw_digest:
            return Start(known.raw_count, known.raw_entry_count, known.raw_chain, raw, True)
        raw = RawDigest()
    return Start(0, 0, EMPTY_CHAIN, raw, False)


def match(
    messages: Sequence[Any],
    known: Known,
    parse: ParseMessage,
    offset: int = 0,
    tail: Sequence[Stored] = (),
    begin: Start | None = None,
    field: str = "messages",
) -> Matched | Diverged:
    """Where the stored history ends in ``messages`` (the request's history, its system
    prompt left out: ``offset`` messages before it in the request's ``field``), or that
    it does not.
    The stored history is ``known``'s entries followed by ``tail``, entries read back
    whose chain is not known (one of them was erased before the proxy read it); the
    request's entries are compared with those one by one. Parses and hashes only what
    the raw fast path cannot skip (``begin``: :func:`start`'s answer, when the caller
    asked for it first); raises what ``parse`` raises for a message it parses."""
    total = known.entry_count + len(tail)
    if begin is None:
        begin = start(messages, known)
    start_at, count, chain = begin.messages, begin.entries, begin.chain
    raw, fast = begin.raw, begin.fast
    boundaries = [Boundary(start_at, count, chain)]
    if count == known.entry_count and chain != known.chain:
        return Diverged(total)
    new_from = start_at if count == total else None
    for i in range(start_at, len(messages)):
        entries = parse(messages[i], f"{field}[{i + offset}]")
        for entry in entries:
            entry_digest = digest(entry)
            if known.entry_count <= count < total and not tail[count - known.entry_count].matches(
                entry, entry_digest
            ):
                return Diverged(total)
            chain = hashlib.sha256(chain + entry_digest).digest()
            count += 1
            if count == known.entry_count and chain != known.chain:
                return Diverged(total)
            if count > total and new_from is None:
                return Diverged(total, inside_message=i)
        boundaries.append(Boundary(i + 1, count, chain))
        if count == total:
            new_from = i + 1
    if new_from is None:
        return Diverged(total, shorter=True, entries=count, chain=chain)
    return Matched(new_from, boundaries, fast, raw)


def replays(found: Diverged, known: Known, tail: Sequence[Stored], last: Entry) -> bool:
    """Whether the request whose history ``found`` refused is the stored history less
    its last entry, ``last``, an assistant reply: the call that reply answered, sent
    again (an SDK's retry of a call whose answer it did not read, say)."""
    total = known.entry_count + len(tail)
    if not found.shorter or found.entries != total - 1 or last.role != "assistant":
        return False
    if tail:  # the request's entries were compared with all the others
        return not tail[-1].erased and tail[-1].matches(last)
    return extend(found.chain, [digest(last)]) == known.chain


def raw_point(matched: Matched, total: int) -> int:
    """Where the next call's raw fast path should stop: :data:`RAW_TAIL_MESSAGES` short
    of the end, never before the first message this call hashed."""
    return max(matched.boundaries[0].messages, total - RAW_TAIL_MESSAGES)


def raw_known(matched: Matched, messages: Sequence[Any], entry_count: int, chain: bytes) -> Known:
    """What to keep after the call: the stored chain (``entry_count`` entries, the new
    messages and the reply stored) and the raw digest of ``messages`` (the request's
    history, all of it stored) up to :func:`raw_point`."""
    point = raw_point(matched, len(messages))
    matched.raw.add(messages[matched.raw.count : point])
    at = matched.boundary(point)
    return Known(
        entry_count=entry_count,
        chain=chain,
        raw_count=point,
        raw_digest=matched.raw.digest() if point else None,
        raw_entry_count=at.entries,
        raw_chain=at.chain,
    )


class Departure(NamedTuple):
    """Where a request's history leaves the stored one: its first ``messages`` messages
    are the stored history's first ``entries`` message entries, and the next message
    (if any) is not what is stored after them."""

    messages: int
    entries: int


def first_difference(
    messages: Sequence[Any],
    parse: ParseMessage,
    stored: Sequence[Stored],
    offset: int = 0,
    field: str = "messages",
) -> Departure:
    """Where the request's history first differs from the stored one, by whole
    messages: a message whose entries run past the stored ones, or differ in part, is
    not shared (``messages`` is ``len(messages)`` when the request is a prefix of the
    stored history). ``field[offset + i]`` names message ``i`` to ``parse``, which
    raises what it raises."""
    at = 0
    for i, raw in enumerate(messages):
        entries = parse(raw, f"{field}[{i + offset}]")
        if at + len(entries) > len(stored) or not all(
            stored[at + j].matches(e) for j, e in enumerate(entries)
        ):
            return Departure(i, at)
        at += len(entries)
    return Departure(len(messages), at)
