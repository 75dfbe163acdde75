"""Appending to and reading the stored history."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.budget import relief
from app.budget.schemas import PruneResult, Verdict
from app.compactions.schemas import CompactionStarted
from app.core import metrics
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.errors import NotFound, UnprocessableContent, invalid
from app.core.http import run_sized
from app.core.keyed_locks import KeyedLocks
from app.engine import search_text
from app.engine.accounting import budget, catalog, ledger, provider_usage, tokens
from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry, InvalidMessage
from app.engine.window import truncate, view
from app.history.schemas import Format
from app.messages.schemas import IGNORED_REQUEST_FIELDS, AppendRequest, StoredEntry
from app.sessions import service as sessions
from app.sessions.schemas import SessionConfig, TruncateConfig
from app.store import events
from app.store import search_index as indexer
from app.store.append import Answer, AppendRead, AppendWrite, CallRow, EntryRow, StoredCall
from app.store.log import LogRepository
from app.store.paths import OnPath
from app.store.session_row import SessionState, Unit, advance, snapshot

# No prompt is larger than this (the usage report's bound on its figures).
MAX_OVERHEAD_TOKENS = provider_usage.MAX_TOKENS

# Call ids are a btree key, and Postgres refuses index rows over ~2.7 kB; real
# providers use ids of a few dozen characters.
MAX_TOOL_CALL_ID_CHARS = 512


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


_ENTRY_KEYS = tuple(StoredEntry.model_fields)
_VERDICT_KEYS = tuple(Verdict.model_fields)


def append_document(doc: dict[str, Any]) -> bytes:
    """An ``AppendResponse`` as JSON, keys in the model's order. A replay rebuilds
    it from the stored record (jsonb reorders keys) and gets the same bytes."""
    pruned = doc.get("pruned")
    compaction = doc.get("compaction")
    return orjson.dumps(
        {
            "entries": [{k: e[k] for k in _ENTRY_KEYS} for e in doc["entries"]],
            "version": doc["version"],
            "context_tokens": doc["context_tokens"],
            "overflow": {k: doc["overflow"][k] for k in _VERDICT_KEYS},
            "pruned": None
            if pruned is None
            else PruneResult.model_validate(pruned).model_dump(mode="json"),
            "compaction": None
            if compaction is None
            else CompactionStarted.model_validate(compaction).model_dump(mode="json"),
        }
    )


# Pinned messages together take at most this share of the session's usable window.
PINNED_SHARE = 0.25


def parse_pinned_batch(messages: list[Any], fmt: Format) -> tuple[list[Entry], list[bool]]:
    """The batch in the canonical model, and whether each entry is pinned; raises
    a 422 naming the first bad field.

    ``pinned`` is compactd's own key of a message, in both formats: ``true`` marks
    a message that is never summarized (the context keeps it verbatim wherever a
    compaction cuts, as it keeps system entries). Like any key the provider does
    not have, it is kept with the stored message and given back in the history,
    never shown to the model. What cannot stand alone in a context is refused:
    a tool result (Anthropic: a user message with ``tool_result`` blocks) stays
    with the call it answers, and an assistant message with tool calls with
    their results.
    """
    entries: list[Entry] = []
    pinned: list[bool] = []
    try:
        for i, raw in enumerate(messages):
            path = f"messages[{i}]"
            if fmt == "openai":
                parsed = [openai_format.parse_message(raw, path)]
            else:
                parsed = anthropic_format.parse_message(raw, path)
            pin = _pinned(raw, path, parsed)
            entries.extend(parsed)
            pinned.extend(pin for _ in parsed)
    except InvalidMessage as exc:
        raise invalid(exc.path, exc.detail) from None
    return entries, pinned


def _pinned(raw: Any, path: str, parsed: list[Entry]) -> bool:
    value = raw.get("pinned", False) if isinstance(raw, dict) else False
    if not isinstance(value, bool):
        raise InvalidMessage(f"{path}.pinned", "must be true or false")
    if not value:
        return False
    if any(e.role == "tool" for e in parsed):
        raise InvalidMessage(
            f"{path}.pinned",
            "a tool result cannot be pinned: it stays with the call it answers, and is "
            "summarized with it",
        )
    if any(e.call_ids for e in parsed):
        raise InvalidMessage(
            f"{path}.pinned",
            "an assistant message with tool calls cannot be pinned: its calls stay with "
            "their results, and are summarized with them",
        )
    return True


def request_hash(body: AppendRequest, overhead_tokens: int | None = None) -> str:
    """What an idempotency key is bound to: what the append stores. The ignored
    request fields are not in it; ``system``, ``tools`` and an overhead given to
    the service are, when present (a body without them hashes as before them)."""
    doc: dict[str, Any] = {"format": body.format, "messages": body.messages}
    if body.system is not None:
        doc["system"] = body.system
    if body.tools is not None:
        doc["tools"] = body.tools
    if overhead_tokens is not None:
        doc["overhead_tokens"] = overhead_tokens
    raw = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(raw).hexdigest()


def resolve_format(body: AppendRequest, query_format: Format | None) -> AppendRequest:
    """The body with its format as the ``?format=`` query parameter says, when
    given; a body that says another one is refused, naming both."""
    if query_format is None or query_format == body.format:
        return body
    if "format" in body.model_fields_set:
        raise invalid(
            "format",
            f"the query parameter format={query_format!r} and the body's format "
            f"{body.format!r} differ; give one, or the same in both",
        )
    return body.model_copy(update={"format": query_format})


def check_request_fields(body: AppendRequest) -> None:
    """A field the append does not have is refused unless it is one of the
    provider request's fields that do not bear on the history."""
    ignored = IGNORED_REQUEST_FIELDS[body.format]
    for name in body.model_extra or {}:
        if name not in ignored:
            other = "anthropic" if body.format == "openai" else "openai"
            hint = (
                f" (it is a field of an {other} request: is format {other}?)"
                if name in IGNORED_REQUEST_FIELDS[other]
                else ""
            )
            raise invalid(
                name,
                f"unknown field{hint}; an append has messages, format, system and tools, and "
                f"ignores the {body.format} request's fields that do not bear on the history",
            )


def looked_up_ids(entries: list[Entry]) -> list[str]:
    """The call ids a batch makes or answers (what to read of the stored calls).
    Refuses an id too long to index, or named twice by one message."""
    ids: list[str] = []
    for offset, entry in enumerate(entries):
        own: set[str] = set()
        for call in entry.tool_calls():
            call_id = call["id"]
            if len(call_id) > MAX_TOOL_CALL_ID_CHARS:
                raise invalid(
                    f"messages[{offset}]",
                    f"a tool call id is {len(call_id)} characters; at most {MAX_TOOL_CALL_ID_CHARS}",
                )
            if call_id in own:
                raise invalid(
                    f"messages[{offset}]", f"tool call id {call_id!r} appears twice in one message"
                )
            own.add(call_id)
            ids.append(call_id)
        if entry.role == "tool" and entry.tool_call_id:
            ids.append(entry.tool_call_id)
    return ids


class Linking(NamedTuple):
    """How a batch's calls and results link up, and how the model's view names them."""

    new_calls: list[CallRow]
    answers: list[Answer]  # stored calls the batch answers
    # Per entry: the ids of its calls (an assistant) or of the call it answers (a
    # result), as the model's view gives them; None when they are its own ids.
    view_ids: list[tuple[str, ...] | None]
    tool_names: list[str | None]  # per entry; a result's is its call's tool


class _Open(NamedTuple):
    name: str
    call_seq: int
    view_id: str
    new_index: int | None  # in Linking.new_calls; None for a stored call
    branch: int = 0  # a stored call's row: the branch it answers on


def link_batch(
    entries: list[Entry], stored: dict[str, StoredCall], first_seq: int, leaf_branch: int = 0
) -> Linking:
    """Check every result answers an open call, in order, and name each result's tool.

    A result answers the latest call with its id that has no result yet. An id
    may come back in a later call once its earlier call is answered (some
    providers number calls per turn); the model's view then names the new call
    ``<id>_r<seq>``, since both OpenAI and Anthropic want one id per call.

    ``stored`` holds the calls as the session's path has them (app.store.log): a
    call made before a fork point, and answered only on another branch, is open
    on this one. Its answer here gets its own row on ``leaf_branch`` (a new call
    row with its result), so each branch answers it once.
    """
    open_calls = {
        call_id: _Open(c.name, c.call_seq, c.view_id or call_id, None, c.branch)
        for call_id, c in stored.items()
        if c.result_seq is None
    }
    answered_at = {cid: c.result_seq for cid, c in stored.items() if c.result_seq is not None}
    new_calls: list[CallRow] = []
    answers: list[Answer] = []
    view_ids: list[tuple[str, ...] | None] = []
    tool_names = [entry.tool_name for entry in entries]
    for offset, entry in enumerate(entries):
        seq = first_seq + offset
        calls = entry.tool_calls()
        if calls:
            names: list[str] = []
            for call in calls:
                call_id = call["id"]
                if call_id in open_calls:
                    raise invalid(
                        f"messages[{offset}]",
                        f"tool call id {call_id!r} is still waiting for its result",
                    )
                reused = call_id in answered_at
                view_id = f"{call_id}_r{seq}" if reused else call_id
                open_calls[call_id] = _Open(call["name"], seq, view_id, len(new_calls))
                new_calls.append(
                    CallRow(call_id, call["name"], seq, None, view_id if reused else None)
                )
                names.append(view_id)
            view_ids.append(tuple(names) if names != [c["id"] for c in calls] else None)
            continue
        if entry.role != "tool" or entry.tool_call_id is None:
            view_ids.append(None)
            continue
        call_id = entry.tool_call_id
        where = f"messages[{offset}].tool_call_id"
        found = open_calls.pop(call_id, None)
        if found is None:
            if call_id in answered_at:
                raise invalid(
                    where,
                    f"tool call {call_id!r} already has a result (entry seq {answered_at[call_id]})",
                )
            raise invalid(where, f"{call_id!r} matches no earlier tool call of this session")
        tool_names[offset] = found.name
        answered_at[call_id] = seq
        if found.new_index is None and found.branch == leaf_branch:
            answers.append(Answer(call_id, found.call_seq, seq, found.branch))
        elif found.new_index is None:
            view = found.view_id if found.view_id != call_id else None
            new_calls.append(CallRow(call_id, found.name, found.call_seq, seq, view))
        else:
            new_calls[found.new_index] = new_calls[found.new_index]._replace(result_seq=seq)
        view_ids.append((found.view_id,) if found.view_id != call_id else None)
    return Linking(new_calls, answers, view_ids, tool_names)


def _cut_off_results(linking: Linking, session: SessionState) -> set[int]:
    """The seqs of the batch's results whose call a compaction already cut off: the
    call is before the window and not kept with it, so the view's pairing leaves the
    result out (app.engine.window.context). They are stored, hidden behind a zero-token mark,
    and add nothing to the context (ledger.Added.hidden)."""
    start, kept = session.context_start_seq, set(session.pinned_seqs)
    answered: list[tuple[int, int | None]] = [(a.call_seq, a.result_seq) for a in linking.answers]
    answered += [(c.call_seq, c.result_seq) for c in linking.new_calls]
    return {
        result_seq
        for call_seq, result_seq in answered
        if result_seq is not None and call_seq < start and call_seq not in kept
    }


class AppendResult(NamedTuple):
    """An append as its caller may need it beyond the response: the proxy reads the
    stored entries' seqs from it, and extends the context it last sent with the rows
    written when the session moved by nothing else (:mod:`app.context.assembly`)."""

    document: dict[str, Any]  # the AppendResponse, before it becomes JSON
    version: int
    replay: bool
    rows: list[EntryRow]  # the entries written, as written (none for a replay)
    before: SessionState | None  # the session as the append read it (None for a replay)
    after: SessionState | None  # as the append (and its relief) left it


class Replay(NamedTuple):
    """An earlier append under the same idempotency key, with the same body: its
    response again, nothing written."""

    document: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class NeedsLock:
    """Nothing written: the append is done again holding the session's row lock, because
    it must relieve the session (``relief``: a prune or compaction runs in the append's
    own transaction) or because another append wrote first (``race``)."""

    why: Literal["relief", "race"]


class Write(NamedTuple):
    """What an append writes, in one statement that applies only if the session is still
    at the version read, and what it then answers."""

    write: AppendWrite
    document: dict[str, Any]  # the response, as the write leaves the session
    before: SessionState  # the session as read
    config: SessionConfig
    verdict: budget.Verdict  # after the append
    # The verdict's action moved: an event, written with the append or not at all.
    change: tuple[budget.Verdict, budget.Verdict] | None
    relieve: bool  # a relief follows the write (the row lock is held)


AppendPlan = Replay | NeedsLock | Write


def plan_append(
    read: AppendRead | None,
    session_id: str,
    batch: _Batch,
    if_match: str | None,
    *,
    pinned_held: int,
    locked: bool,
    now: datetime,
) -> AppendPlan:
    """What an append does, from what it read (``read``: None for no such session) and
    nothing else: refuse (a 404, 412 or 422 raised), answer a replay, ask for the row
    lock, or write. ``pinned_held``: the pinned tokens already on the session's path (read
    only for a batch that pins); ``locked``: whether the row lock is held.

    An automatic prune runs in the append's own (locked) transaction: the response, the
    version it carries and the idempotency record are then those of the append and its
    prune together, never another request's.
    """
    if read is None:
        raise NotFound(f"session {session_id!r} does not exist")
    if read.idempotency is not None:
        return _replay(read.idempotency, batch)
    session = read.session
    sessions.check_if_match(if_match, session.version)
    config = sessions.effective_config(session.config)
    spec = catalog.lookup(session.model)
    encoding = spec.encoding
    rows: list[EntryRow] = []
    if batch.system is not None and not _holds_system(read, batch):
        rows.append(batch.system_row(session.next_seq, encoding))
    path = session.path
    first_seq = session.next_seq + len(rows)
    linking = link_batch(batch.entries, read.calls, first_seq, path.leaf_branch)
    hidden = _cut_off_results(linking, session)
    texts = search_text.with_calls(
        batch.search_texts,
        batch.search_pending,
        batch.entries,
        {i: (c.name, c.arguments) for i, c in read.calls.items() if c.result_seq is None},
    )
    rows += _entry_rows(
        batch, encoding, config.truncate, linking, first_seq, texts, images=spec.images
    )
    rows = _placed(rows, session)
    if any(r.pinned for r in rows):
        _check_pinned(session, batch, rows, pinned_held)
    after = snapshot(session)
    advance(
        after,
        ledger.Appended(
            tuple(ledger.Added(r.tokens, r.role == "tool", r.seq in hidden) for r in rows),
            batch.overhead(encoding),
        ),
    )
    verdict = sessions.verdict_of(after, config)
    relieve = relief.relief_wanted("append", verdict.action, after, config)
    if relieve and not locked:
        return NeedsLock("relief")
    document: dict[str, Any] = {
        "entries": [
            {"id": str(r.id), "seq": r.seq, "role": r.role, "tokens": r.tokens} for r in rows
        ],
        "version": after.version,
        "context_tokens": after.context_tokens,
        "overflow": dataclasses.asdict(verdict),
        "pruned": None,
        "compaction": None,
    }
    was = sessions.verdict_of(session, config)
    write = AppendWrite(
        session_id=session_id,
        family_id=after.family_id,
        branch=path.leaf_branch,
        read_version=session.version,
        source_format=batch.format,
        now=now,
        entries=rows,
        new_calls=linking.new_calls,
        answers=linking.answers,
        session=after,
        idempotency_key=batch.idempotency_key,
        request_hash=batch.digest,
        response=append_document(document).decode() if batch.idempotency_key else None,
        hidden=sorted(hidden),
    )
    change = (was, verdict) if was.action != verdict.action else None
    return Write(write, document, session, config, verdict, change, relieve)


def _replay(idempotency: tuple[str, str], batch: _Batch) -> Replay:
    """The earlier append's response, when the body is the one it was sent with."""
    request_hash, response = idempotency
    if request_hash != batch.digest:
        raise UnprocessableContent(
            f"Idempotency-Key {batch.idempotency_key!r} was already used with a different body",
            errors=[{"field": "Idempotency-Key", "detail": "reused with a different body"}],
        )
    return Replay(orjson.loads(response))


def _holds_system(read: AppendRead, batch: _Batch) -> bool:
    """Whether the session's latest system entry is the request's system prompt."""
    assert batch.system is not None
    return read.system_parts is not None and anthropic_format.system_texts(
        read.system_parts
    ) == anthropic_format.system_texts(batch.system.parts)


def _entry_rows(
    batch: _Batch,
    encoding: tokens.EncodingName,
    config: TruncateConfig,
    linking: Linking,
    first_seq: int,
    texts: list[str],
    *,
    images: tokens.ImageRule = "openai",
) -> list[EntryRow]:
    """The batch's entries as rows from ``first_seq``, as the model is shown them
    (``texts``: their searchable text; ``images``: whose rule their images are
    counted by, the session model's provider's)."""
    rows: list[EntryRow] = []
    for offset, entry in enumerate(batch.entries):
        ids, tool_name = linking.view_ids[offset], linking.tool_names[offset]
        shown = batch.shown(offset, encoding, config, ids, tool_name, images)
        rows.append(
            EntryRow(
                seq=first_seq + offset,
                id=batch.ids[offset],
                role=entry.role,
                parts=batch.parts[offset],
                tool_call_id=entry.tool_call_id,
                tool_name=tool_name,
                is_error=entry.is_error,
                name=entry.name,
                content_form=entry.content_form,
                extra=batch.extra[offset],
                tokens=shown.tokens,
                call_ids=_json(list(ids or entry.call_ids)) if entry.call_ids else None,
                view_openai=shown.view_openai,
                view_anthropic=shown.view_anthropic,
                omitted_lines=shown.omitted_lines,
                omitted_bytes=shown.omitted_bytes,
                view_call_id=ids[0] if ids and entry.role == "tool" else None,
                call_id_tokens=shown.call_id_tokens,
                pinned=batch.pinned[offset],
                search_text=texts[offset],
                search_pending=batch.search_pending[offset],
            )
        )
    return rows


def _placed(rows: list[EntryRow], session: SessionState) -> list[EntryRow]:
    """Where each row hangs in the tree, and the path's stored tokens with it."""
    path, path_tokens = session.path, session.stored_tokens
    placed: list[EntryRow] = []
    for row in rows:
        path_tokens += row.tokens
        parent = path.branch_of(row.seq - 1) if row.seq > 1 else None
        placed.append(row._replace(parent_branch=parent, path_tokens=path_tokens))
    return placed


def _check_pinned(session: SessionState, batch: _Batch, rows: list[EntryRow], held: int) -> None:
    """Pinned messages stay in the context whatever a compaction cuts, so together
    they may take at most PINNED_SHARE of the session's usable window: beyond it no
    compaction could bring the context under its threshold again."""
    window, _ = sessions.window_of(session)
    limit = int(window.usable_tokens * PINNED_SHARE)
    adding = sum(r.tokens for r in rows if r.pinned)
    if held + adding > limit:
        raise invalid(
            batch.pinned_path,
            f"pinned messages may take at most {limit:,} tokens, a quarter of this "
            f"session's usable window: the session holds {held:,} pinned tokens and "
            f"this batch would pin {adding:,} more",
        )


class AppendService:
    """Appending to one tenant's sessions: the hottest write of the service.

    An append is a read and a conditional write on a bare asyncpg connection,
    two round trips and no transaction block: the write statement inserts the
    entries and advances the session only if it is still at the version read.
    An append that loses that race, or that must prune, does it again under
    the session's row lock, in one transaction (one retry measured best with
    16 writers on one session: further optimistic tries mostly lose again).
    """

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id
        self.repo = LogRepository(tenant_id)

    async def append(
        self,
        session_id: str,
        body: AppendRequest,
        *,
        idempotency_key: str | None,
        if_match: str | None,
        body_bytes: int = 0,
        query_format: Format | None = None,
        overhead_tokens: int | None = None,
    ) -> tuple[bytes, int, bool]:
        """Store a batch atomically.

        Returns the ``AppendResponse`` document as JSON bytes, the session's
        version after it, and whether it is the replay of an earlier append.
        ``body_bytes`` (the request's size) says whether parsing it is worth a thread.
        ``query_format``: the route's ``?format=`` (it must agree with the body's).
        ``overhead_tokens``: what each request adds besides the stored messages
        (a proxy's tool schemas and unstored system prompt), set as the
        session's overhead; it wins over the body's ``tools``. None: the body's
        ``tools`` say, or the overhead stays as it was.
        """
        done = await self.store(
            session_id,
            body,
            idempotency_key=idempotency_key,
            if_match=if_match,
            body_bytes=body_bytes,
            query_format=query_format,
            overhead_tokens=overhead_tokens,
        )
        return append_document(done.document), done.version, done.replay

    async def store(
        self,
        session_id: str,
        body: AppendRequest,
        *,
        idempotency_key: str | None,
        if_match: str | None,
        body_bytes: int = 0,
        query_format: Format | None = None,
        overhead_tokens: int | None = None,
        driver: Driver | None = None,
    ) -> AppendResult:
        """:meth:`append`, its outcome as it is rather than as the response's JSON.
        ``driver``: the caller's connection, to store on (outside a transaction
        block), in place of one of the pool's (a proxied call reads its history
        and its context on the same one)."""
        if overhead_tokens is not None and not 0 <= overhead_tokens <= MAX_OVERHEAD_TOKENS:
            raise invalid("overhead_tokens", f"must be between 0 and {MAX_OVERHEAD_TOKENS:,}")
        body = resolve_format(body, query_format)
        batch = await run_sized(body_bytes, _Batch, body, idempotency_key, overhead_tokens)
        # Appends to one session in this process take turns here, before they
        # hold a connection: they would only lose races to each other in the
        # database. Other processes are still ordered by the version check.
        async with _turns.held((self.tenant_id, session_id)):
            if driver is not None:
                return await self._store_on(driver, session_id, batch, if_match)
            async with driver_connection(self.engine) as own:
                return await self._store_on(own, session_id, batch, if_match)

    async def _store_on(
        self, driver: Driver, session_id: str, batch: _Batch, if_match: str | None
    ) -> AppendResult:
        with metrics.after_commit() as observed:
            outcome = await self._attempt(driver, session_id, batch, if_match, lock=False)
            if isinstance(outcome, NeedsLock):
                # Another append came first, or this one must prune: take the
                # session's row lock, so the append (and its prune) cannot lose.
                observed.clear()  # that attempt wrote nothing
                async with driver.transaction():
                    outcome = await self._attempt(driver, session_id, batch, if_match, lock=True)
        if isinstance(outcome, NeedsLock):  # pragma: no cover - the row lock rules this out
            raise RuntimeError("a locked append lost its race")
        return outcome

    async def _attempt(
        self, driver: Driver, session_id: str, batch: _Batch, if_match: str | None, *, lock: bool
    ) -> AppendResult | NeedsLock:
        """One read, the plan (:func:`plan_append`) and its write."""
        read = await self.repo.read_for_append(
            driver,
            session_id,
            batch.looked_up,
            batch.idempotency_key,
            lock=lock,
            system=batch.system is not None,
        )
        held = 0
        if read is not None and read.idempotency is None and any(batch.pinned):
            held = await self.repo.pinned_tokens(driver, OnPath.of(session_id, read.session))
        # Counting a large batch takes a second of CPU or more (tokenizing, truncating,
        # rendering): it is planned in a worker thread, where tiktoken releases the GIL,
        # so the event loop keeps serving.
        plan = await run_sized(
            batch.size,
            functools.partial(
                plan_append,
                read,
                session_id,
                batch,
                if_match,
                pinned_held=held,
                locked=lock,
                now=datetime.now(UTC),
            ),
        )
        if isinstance(plan, Replay):
            return AppendResult(plan.document, plan.document["version"], True, [], None, None)
        if isinstance(plan, NeedsLock):
            return plan
        return await self._write(driver, session_id, batch, plan)

    async def _write(
        self, driver: Driver, session_id: str, batch: _Batch, plan: Write
    ) -> AppendResult | NeedsLock:
        """The planned write, its event, and the relief it asks for (under the row lock)."""
        if plan.change is None:
            written = await self.repo.write_append(driver, plan.write)
        else:
            async with driver.transaction():
                written = await self.repo.write_append(driver, plan.write)
                if written:
                    await events.verdict_changed(
                        driver, self.tenant_id, session_id, *plan.change, "append"
                    )
        if not written:
            return NeedsLock("race")
        if any(batch.search_pending):
            await indexer.wake(driver)  # at the commit: the worker writes the rest
        session, document = plan.write.session, plan.document
        if plan.relieve:
            await self._relieve(driver, session_id, batch, plan)
        return AppendResult(
            document, session.version, False, plan.write.entries, plan.before, session
        )

    async def _relieve(self, driver: Driver, session_id: str, batch: _Batch, plan: Write) -> None:
        """Prune or compact after the write, in the same locked transaction; the response
        (and its idempotency record) then says what the append and its relief did."""
        session, document = plan.write.session, plan.document
        unit = Unit(driver, self.tenant_id, session_id, session)
        relieved = await relief.relieve(
            unit, plan.config, "append", now=datetime.now(UTC), verdict=plan.verdict
        )
        if relieved.pruned is not None:
            document["pruned"] = relieved.pruned.model_dump(mode="json")
        if relieved.compaction is not None:
            document["compaction"] = relieved.compaction.model_dump(mode="json")
        document.update(
            version=session.version,
            context_tokens=session.context_tokens,
            overflow=dataclasses.asdict(relieved.verdict),
        )
        await events.verdict_changed(
            driver, self.tenant_id, session_id, plan.verdict, relieved.verdict, "relief"
        )
        if batch.idempotency_key:
            await self.repo.replace_idempotent_response(
                driver, session_id, batch.idempotency_key, append_document(document).decode()
            )


# Appends to one session in this process take turns (see AppendService.append).
_turns = KeyedLocks()


class _Shown(NamedTuple):
    """An entry as the model is shown it: after ingest truncation, rendered, counted."""

    view_openai: str
    view_anthropic: str
    tokens: int
    omitted_lines: int | None
    omitted_bytes: int | None
    call_id_tokens: int | None


class _Batch:
    """A parsed batch and what does not change between attempts: the entries,
    their JSON columns, and what the model is shown of each (which depends on
    the session's encoding and truncation config, read with the session)."""

    def __init__(
        self, body: AppendRequest, idempotency_key: str | None, overhead_tokens: int | None = None
    ) -> None:
        check_request_fields(body)
        self.format = body.format
        self.entries, self.pinned = parse_pinned_batch(body.messages, body.format)
        # Where the refusal of too many pinned tokens points: the first pinned message.
        self.pinned_path = next(
            (
                f"messages[{i}].pinned"
                for i, m in enumerate(body.messages)
                if isinstance(m, dict) and m.get("pinned") is True
            ),
            "messages",
        )
        try:
            self.system = (
                None if body.system is None else anthropic_format.parse_system(body.system)
            )
        except InvalidMessage as exc:
            raise invalid(exc.path, exc.detail) from None
        self.tools = body.tools
        self.overhead_tokens = overhead_tokens
        self._system_row: dict[tuple[int, str], EntryRow] = {}
        self.looked_up = looked_up_ids(self.entries)
        # An empty key is no key (the route refuses one; this keeps the record consistent).
        self.idempotency_key = idempotency_key or None
        self.digest = request_hash(body, overhead_tokens) if self.idempotency_key else None
        self.parts = [_json(e.parts) for e in self.entries]
        self.extra = [_json(e.extra) if e.extra else None for e in self.entries]
        # The entries' ids, the same in every attempt (like the system prompt's row).
        self.ids = [uuid.uuid4() for _ in self.entries]
        self.search_texts, self.search_pending = search_text.for_append(
            [e.parts for e in self.entries]
        )
        # About the bytes there are to count (the content as JSON).
        self.size = sum(map(len, self.parts))
        self._shown: dict[tuple[Any, ...], _Shown] = {}

    def overhead(self, encoding: tokens.EncodingName) -> int | None:
        """The session's overhead after this append: the service's figure, else
        the request's tools counted; None leaves it as it was."""
        if self.overhead_tokens is not None:
            return self.overhead_tokens
        if self.tools is not None:
            return tokens.count_tools(self.tools, encoding)
        return None

    def system_row(self, seq: int, encoding: tokens.EncodingName) -> EntryRow:
        """The request's system prompt as the entry at ``seq`` (kept between attempts)."""
        key = (seq, encoding)
        if key not in self._system_row:
            entry = self.system
            assert entry is not None
            shown = _show(entry, encoding, None, 0)
            self._system_row[key] = EntryRow(
                seq=seq,
                id=uuid.uuid4(),
                role=entry.role,
                parts=_json(entry.parts),
                tool_call_id=None,
                tool_name=None,
                is_error=False,
                name=None,
                content_form=entry.content_form,
                extra=None,
                tokens=shown.tokens,
                call_ids=None,
                view_openai=shown.view_openai,
                view_anthropic=shown.view_anthropic,
                omitted_lines=None,
                omitted_bytes=None,
                view_call_id=None,
                call_id_tokens=None,
                pinned=False,
                search_text=search_text.search_text(entry.parts),
            )
        return self._system_row[key]

    def shown(
        self,
        offset: int,
        encoding: tokens.EncodingName,
        config: TruncateConfig,
        view_ids: tuple[str, ...] | None,
        tool_name: str | None,
        images: tokens.ImageRule = "openai",
    ) -> _Shown:
        """Entry ``offset`` as the model is shown it, its calls named ``view_ids`` and
        (a result) its tool ``tool_name``; kept for the next attempt."""
        entry = self.entries[offset]
        if entry.tool_name != tool_name:
            entry = dataclasses.replace(entry, tool_name=tool_name)
        category: truncate.Category | None = None
        if entry.role == "tool" and config.enabled:
            category = truncate.category_for(entry.tool_name, config.categories)
        cap = config.tool_result_token_cap if category else 0
        key = (offset, encoding, category, cap, view_ids, tool_name, images)
        if key not in self._shown:
            if view_ids is not None:
                entry = _with_view_ids(entry, view_ids)
            self._shown[key] = _show(entry, encoding, category, cap, images)
        return self._shown[key]


def _with_view_ids(entry: Entry, view_ids: tuple[str, ...]) -> Entry:
    """The entry as the model's view names its calls (or, a result, its call)."""
    if entry.role == "tool":
        return dataclasses.replace(entry, tool_call_id=view_ids[0])
    ids = iter(view_ids)
    parts = [{**p, "id": next(ids)} if p["type"] == "tool_call" else p for p in entry.parts]
    return dataclasses.replace(entry, parts=parts)


def _show(
    entry: Entry,
    encoding: tokens.EncodingName,
    category: truncate.Category | None,
    cap: int,
    images: tokens.ImageRule = "openai",
) -> _Shown:
    """Cut a long tool result's text to ``cap`` tokens by its category (ingest
    truncation: docs/how-it-works.md), then render and count what is left. The stored parts keep it all."""
    omitted_lines = omitted_bytes = 0
    if category is not None:
        texts = [p for p in entry.parts if p["type"] == "text" and p["text"]]
        parts = []
        for part in entry.parts:
            if part["type"] == "text" and part["text"]:
                cut = truncate.truncate(part["text"], category, cap // len(texts))
                if cut.truncated:
                    omitted_lines += cut.omitted_lines
                    omitted_bytes += cut.omitted_bytes
                    part = {**part, "text": cut.text}
            parts.append(part)
        if omitted_bytes:
            entry = dataclasses.replace(entry, parts=parts)
    view_openai, view_anthropic = view.render_view(entry)
    return _Shown(
        view_openai,
        view_anthropic,
        tokens.count_entry(entry, encoding, images),
        omitted_lines if omitted_bytes else None,
        omitted_bytes or None,
        tokens.count_text(entry.tool_call_id, encoding)
        if entry.role == "tool" and entry.tool_call_id
        else None,
    )
