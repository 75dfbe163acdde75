"""Preparing a compaction (docs/how-it-works.md, "Compaction"): what is summarized, what is kept, and the
summary's final shape. Pure: the service reads the entries, this decides.

Only entries since the latest pivot are considered. System and developer
entries are never summarized: they are the agent's instructions, so the
context keeps them (``pinned``) wherever the cut falls; so are the entries the
agent marked pinned on append (never a tool result, nor an assistant message
with tool calls: those the append refuses to pin). Earlier compaction entries
in the window are not messages of the view; the previous summary is carried
into the new one instead (the update prompt, or the extractive merge).

The service's own prompts (``SYNTHETIC_KINDS``: the "continue" after an
automatic compaction) are cut like messages, but the summarizer never reads
them: they are not the user's words.

The task survives whole. The summary ends with the user's requests quoted
verbatim (:func:`keep_requests`, a ``<user-requests>`` block): the session's
first request, then the latest ones, within a token budget
(:func:`requests_tokens`), clipped beyond it by a rule that keeps identifiers
and error lines (:func:`app.engine.compaction.summary.clip_request`). What one compaction
quotes is kept in its details and carried by the next, like the file lists, so
the tenth compaction still quotes the first request as it was written.

What the context after the cut must still name (:mod:`app.engine.compaction.continuity`: the
task's key terms, every modified file, the latest unresolved error) is worked out
with the plan (:attr:`Plan.anchors`, and the kept window the gate reads,
:attr:`Plan.kept`); the first request's terms, the working directory the history
states and the unresolved error are carried in the details to the next compaction.

The details also index what the summarized entries named (:func:`app.engine.compaction.dropped.index`:
paths, commands, error lines, identifiers, numbers, URLs), so that what left the
context can be seen.

Under the session's ``verbatim_first`` policy (:func:`with_policy`,
:mod:`app.engine.compaction.verbatim`) the summarized entries are split before the
summarizer sees them: the tool outputs leave one-line pointers, the user's and the
assistant's text is kept as written within a capped share of the window, and the
plan's ``history`` is what is left to summarize.

The file lists end the summary (:func:`capped_files`): the modified files first and
whole up to half the summary's size, the read ones in what is left of a quarter of
it; an absolute path under the stated working directory is dropped when its
relative form is listed too (the same file).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.accounting import tokens as token_counts
from app.engine.compaction import anchors as anchor_rules
from app.engine.compaction import continuity, dropped
from app.engine.compaction import cut as cuts
from app.engine.compaction import verbatim as verbatim_rules
from app.engine.compaction.fileops import FileOps, collect
from app.engine.compaction.summary import (
    KeptRequest,
    carried_media,
    clip_request,
    media_as_pointers,
    media_pointers,
    merge_split_turn,
    omitted_note,
    render_context_message,
    render_request,
    render_user_requests,
    with_file_tags,
    with_media,
    with_user_requests,
)
from app.engine.model import Entry

PINNED_ROLES = frozenset({"system", "developer"})
# Entries the service wrote as user prompts of its own, never the agent's words.
SYNTHETIC_KINDS = frozenset({"continue"})

# Never keep more than this share of the compaction threshold verbatim: a
# compaction that keeps most of the window would be followed by another at once.
KEEP_SHARE = 0.5
EMERGENCY_KEEP_SHARE = 0.25

# The user's requests quoted verbatim take at most this share of the compaction
# threshold (and at most the configured keep_requests_tokens): a small window is
# not filled by them.
REQUESTS_SHARE = 0.15
# Below this budget no block is written (the requests are still carried).
MIN_REQUESTS_TOKENS = 200
# A later request is quoted clipped only if this much of it fits.
MIN_CLIPPED_TOKENS = 48
# The least an extractive summary may be (see summary_chars).
MIN_SUMMARY_CHARS = 2_000
# What the first request is carried as when no block is written.
REMEMBERED_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Source:
    """An entry since the pivot. ``entry.tokens`` is what it costs in the view
    (a pruned output, its placeholder); ``link_id``/``view_call_ids`` are the
    ids the view pairs by (a reused call id gets its own)."""

    seq: int
    kind: str
    entry: Entry
    link_id: str | None = None
    view_call_ids: tuple[str, ...] = ()
    pinned: bool = False  # marked on append: kept in the context, never summarized

    @property
    def kept_whole(self) -> bool:
        """Never summarized: a system or developer entry, or one pinned on append."""
        return self.pinned or self.entry.role in PINNED_ROLES


@dataclass(frozen=True, slots=True)
class _Item:
    role: str
    tokens: int
    tool_call_id: str | None
    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    start_seq: int
    first_kept_seq: int
    history: list[Entry]  # summarized as the history
    turn_prefix: list[Entry]  # the start of a turn the cut splits; empty if none
    pinned: list[int]  # system and pinned entries before the cut, kept in the context
    summarized_tokens: int
    kept_tokens: int
    file_ops: FileOps
    details: dict[str, Any] = field(default_factory=dict)
    summary_chars: int = 12_000  # how long an extractive summary may be
    requests: KeptRequests | None = None  # the user's requests the summary quotes
    # What the context after the cut must name (the continuity gate), and the
    # entries it keeps: those after the cut, and the pinned ones before it.
    anchors: continuity.Anchors = field(default_factory=continuity.Anchors)
    kept: tuple[Entry, ...] = ()
    # What leaves the context with this compaction: the summarized entries and the
    # previous summary (tokens as counted); and the session's encoding.
    replaced_tokens: int = 0
    encoding: token_counts.EncodingName = "o200k_base"
    # The seqs of ``history`` and ``turn_prefix``, entry for entry.
    history_seqs: tuple[int, ...] = ()
    prefix_seqs: tuple[int, ...] = ()
    # The session's compaction policy (:func:`with_policy`): under "verbatim_first"
    # ``history`` is what is left to summarize and ``verbatim`` the block kept as written.
    policy: str = "summarize"
    verbatim: verbatim_rules.Verbatim | None = None

    @property
    def split_turn(self) -> bool:
        return bool(self.turn_prefix)

    @property
    def first_request_quoted(self) -> bool:
        """Whether the summary's ``<user-requests>`` block quotes the first request."""
        r = self.requests
        return r is not None and r.quoting and r.first is not None and not r.first_pinned


def keep_tokens(keep_recent_tokens: int, threshold_tokens: int, *, emergency: bool) -> int:
    """How much recent history a compaction keeps verbatim: the configured
    amount, but never so much that the context would stay near the threshold."""
    share = EMERGENCY_KEEP_SHARE if emergency else KEEP_SHARE
    return max(0, min(keep_recent_tokens, int(threshold_tokens * share)))


def summary_chars(threshold_tokens: int, summarized_tokens: int | None = None) -> int:
    """How long a summary made without a model may be: about 15% of the
    compaction threshold (at ~4 characters a token), within 2,000-12,000
    characters, so that a small window is not filled by its own summary; and
    no more than about half of what it summarizes (2 characters a summarized
    token), so that a summary never comes out as long as its source (such a
    compaction would not be committed)."""
    cap = min(12_000, threshold_tokens * 6 // 10)
    if summarized_tokens is not None:
        cap = min(cap, summarized_tokens * 2)
    return max(MIN_SUMMARY_CHARS, cap)


def requests_tokens(configured: int, threshold_tokens: int) -> int:
    """The budget of the user's requests quoted verbatim: the configured
    ``keep_requests_tokens``, but never more than 15% of the compaction
    threshold, so that a small window is not filled by them."""
    return max(0, min(configured, int(threshold_tokens * REQUESTS_SHARE)))


@dataclass(frozen=True, slots=True)
class KeptRequests:
    """The user's requests a summary quotes, and what the next compaction carries.

    ``first`` is the session's first request (None until a compaction has
    summarized it); ``first_pinned`` when that request was pinned on append: the
    context holds it already, so it is not quoted again. ``later`` are the
    latest requests quoted, oldest first; ``omitted`` counts the requests since
    the first that are not quoted (the history has them)."""

    first: KeptRequest | None = None
    first_pinned: bool = False
    later: tuple[KeptRequest, ...] = ()
    omitted: int = 0
    budget_tokens: int = 0
    tokens: int = 0  # the block's, as counted
    quoting: bool = True  # False: the budget is below MIN_REQUESTS_TOKENS, no block

    @property
    def quoted(self) -> list[KeptRequest]:
        if not self.quoting:
            return []
        first = [self.first] if self.first is not None and not self.first_pinned else []
        return [*first, *self.later]

    def block(self) -> str:
        """The ``<user-requests>`` block the summary opens with; empty when none."""
        return render_user_requests(self.quoted, self.omitted)

    def to_details(self) -> dict[str, Any]:
        def one(r: KeptRequest) -> dict[str, Any]:
            return {"seq": r.seq, "text": r.text, "clipped": r.clipped}

        first: dict[str, Any] | None = None
        if self.first is not None:
            first = {**one(self.first), "pinned": self.first_pinned}
        return {
            "first": first,
            "later": [one(r) for r in self.later],
            "omitted": self.omitted,
            "budget_tokens": self.budget_tokens,
            "tokens": self.tokens,
        }

    @classmethod
    def from_details(cls, details: Mapping[str, Any] | None) -> KeptRequests | None:
        """What a compaction's details carry; None when they carry nothing (a
        compaction made before requests were kept). Malformed items are skipped."""
        value = details.get("user_requests") if details is not None else None
        if not isinstance(value, dict):
            return None

        def one(item: Any, *, first: bool = False) -> KeptRequest | None:
            if not isinstance(item, dict):
                return None
            seq, text = item.get("seq"), item.get("text")
            if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(text, str):
                return None
            return KeptRequest(seq, text, first=first, clipped=item.get("clipped") is True)

        raw_first = value.get("first")
        first = one(raw_first, first=True)
        later = value.get("later")
        omitted = value.get("omitted")
        return cls(
            first=first,
            first_pinned=isinstance(raw_first, dict) and raw_first.get("pinned") is True,
            later=tuple(
                r for r in (one(i) for i in (later if isinstance(later, list) else ())) if r
            ),
            omitted=omitted if isinstance(omitted, int) and omitted >= 0 else 0,
        )


def _request_text(entry: Entry) -> str:
    return entry.text().strip("\n")


def keep_requests(
    summarized: Sequence[Source],
    pinned_users: Sequence[Source],
    previous: KeptRequests | None,
    budget: int,
    count: Callable[[str], int],
) -> KeptRequests:
    """The user's requests the summary quotes, within ``budget`` tokens (``count``
    counts them).

    The candidates are the user messages this compaction summarizes (not the
    service's own prompts, not pinned entries: the context keeps those), added
    to those ``previous`` quoted. The session's first request is remembered
    once seen (or known to be pinned: ``pinned_users`` are the pinned user
    entries since the pivot) and always comes first; then the newest requests,
    as many as fit, quoted oldest first. Priority: the first request may take
    the budget but for a quarter kept for the newest one; a request that does
    not fit whole is clipped by :func:`~app.engine.compaction.summary.clip_request` (the
    first, or the newest when nothing newer was quoted, and only if
    ``MIN_CLIPPED_TOKENS`` of it fit); the older ones are counted as omitted.
    The block, as counted, never exceeds ``budget``.
    """
    candidates = [
        KeptRequest(s.seq, text)
        for s in summarized
        if s.entry.role == "user" and s.kind == "message" and (text := _request_text(s.entry))
    ]
    first = previous.first if previous else None
    first_pinned = previous.first_pinned if previous else False
    pool = list(previous.later) if previous else []
    omitted = previous.omitted if previous else 0
    if first is None:
        pinned = next(
            (s for s in pinned_users if s.entry.role == "user" and _request_text(s.entry)), None
        )
        earliest = candidates[0] if candidates else None
        if pinned is not None and (earliest is None or pinned.seq < earliest.seq):
            first, first_pinned = KeptRequest(pinned.seq, "", first=True), True
        elif earliest is not None:
            first = replace(earliest, first=True)
            candidates = candidates[1:]
    pool += [c for c in candidates if first is None or c.seq != first.seq]

    if budget < MIN_REQUESTS_TOKENS:
        # No block; the first request is still remembered, for a later budget.
        if first is not None and not first_pinned:
            first = _clipped(first, REMEMBERED_TOKENS, count)
        return KeptRequests(first, first_pinned, (), omitted + len(pool), budget, 0, quoting=False)

    def cost(request: KeptRequest) -> int:
        return count(render_request(request)) + 1

    empty = render_user_requests([KeptRequest(0, "", first=True)], 0)
    frame = count(empty) + count(omitted_note(10**6)) + 2
    room = budget - frame
    newest = pool[-1] if pool else None
    whole = first if first is not None and not first_pinned else None
    first_room = 0
    if whole is not None:
        reserve = min(cost(newest), room // 4) if newest is not None else 0
        first_room = room - reserve
        first = _clipped(whole, first_room, count)
        room -= cost(first)
    later: list[KeptRequest] = []
    for request in reversed(pool):
        c = cost(request)
        if c <= room:
            later.append(request)
            room -= c
            continue
        overhead = cost(replace(request, text="", clipped=True))
        if not later and room - overhead >= MIN_CLIPPED_TOKENS:
            later.append(_clipped(request, room, count))
        break
    later.reverse()
    kept = KeptRequests(first, first_pinned, tuple(later), omitted + len(pool) - len(later), budget)
    # The sums above add up the parts; the block as a whole is what counts. Were
    # it over (never seen: the frame is counted with room to spare), the oldest
    # quoted requests go, then the first is clipped shorter.
    tokens = count(kept.block())
    while tokens > budget and kept.later:
        kept = replace(kept, later=kept.later[1:], omitted=kept.omitted + 1)
        tokens = count(kept.block())
    while tokens > budget and whole is not None and first_room > MIN_CLIPPED_TOKENS:
        first_room = first_room * 9 // 10
        kept = replace(kept, first=_clipped(whole, first_room, count))
        tokens = count(kept.block())
    if tokens > budget:
        remembered = _clipped(whole, REMEMBERED_TOKENS, count) if whole is not None else first
        return KeptRequests(
            remembered, first_pinned, (), omitted + len(pool), budget, 0, quoting=False
        )
    return replace(kept, tokens=tokens)


def _clipped(request: KeptRequest, room: int, count: Callable[[str], int]) -> KeptRequest:
    """``request`` within ``room`` tokens, its tags included; clipped when needed."""
    if count(render_request(request)) + 1 <= room:
        return request
    overhead = count(render_request(replace(request, text="", clipped=True))) + 1
    text = clip_request(request.text, room - overhead, count)
    return replace(request, text=text, clipped=True)


def plan(
    sources: Sequence[Source],
    *,
    start_seq: int,
    end_seq: int,
    keep: int,
    previous_details: dict[str, Any] | None,
    threshold_tokens: int = 20_000,
    keep_requests_tokens: int = 20_000,
    encoding: token_counts.EncodingName = "o200k_base",
) -> Plan | None:
    """Where to cut, or None when nothing can be summarized (too little history,
    or no cut point that keeps every call with its results).

    ``keep_requests_tokens`` (the session's setting) and ``threshold_tokens``
    make the budget of the user's requests quoted verbatim
    (:func:`requests_tokens`), counted with ``encoding``."""
    messages = [s for s in sources if s.kind != "compaction" and not s.kept_whole]
    items = [
        _Item(
            s.entry.role,
            s.entry.tokens,
            (s.link_id or s.entry.tool_call_id) if s.entry.role == "tool" else None,
            s.view_call_ids if s.view_call_ids else s.entry.call_ids,
        )
        for s in messages
    ]
    # The "continue" prompts earlier automatic compactions added (see cut.py).
    synthetic = [k for k, s in enumerate(messages) if s.kind in SYNTHETIC_KINDS]
    cut = cuts.find_cut(items, keep, synthetic=synthetic)
    if cut.first_kept == 0:
        return None
    first_kept_seq = messages[cut.first_kept].seq if cut.first_kept < len(messages) else end_seq
    summarized_sources = messages[: cut.first_kept]
    summarized = [s.entry for s in summarized_sources]
    turn_start = cut.turn_start if cut.turn_start is not None else cut.first_kept
    # The summarizer reads the user's words only: the service's prompts are left out.
    history_sources = [s for s in summarized_sources[:turn_start] if s.kind not in SYNTHETIC_KINDS]
    prefix_sources = [s for s in summarized_sources[turn_start:] if s.kind not in SYNTHETIC_KINDS]
    history = [s.entry for s in history_sources]
    prefix = [s.entry for s in prefix_sources]
    pinned = [s.seq for s in sources if s.kept_whole and s.seq < first_kept_seq]
    workdir = _workdir(sources, previous_details)
    previous = FileOps.from_details(previous_details) if previous_details else None
    ops = _deduped(collect(summarized, previous), workdir)
    requests = keep_requests(
        summarized_sources,
        [s for s in sources if s.pinned and s.kind == "message"],
        KeptRequests.from_details(previous_details),
        requests_tokens(keep_requests_tokens, threshold_tokens),
        lambda text: token_counts.count_text(text, encoding),
    )
    first_terms, terms = _task_terms(summarized_sources, sources, requests, previous_details)
    error = _unresolved_error([*history, *prefix], previous_details)
    kept = tuple(
        s.entry
        for s in sources
        if s.kind != "compaction" and (s.seq >= first_kept_seq or s.kept_whole)
    )
    # The newest compaction entry since the pivot is the summary the new one replaces.
    previous_summary = next((s for s in reversed(sources) if s.kind == "compaction"), None)
    replaced = cut.summarized_tokens + (
        previous_summary.entry.tokens if previous_summary is not None else 0
    )
    return Plan(
        start_seq=start_seq,
        first_kept_seq=first_kept_seq,
        # A summarizer reads each image or document as a pointer line, never its bytes.
        history=[media_as_pointers(s.entry, s.seq) for s in history_sources],
        turn_prefix=[media_as_pointers(s.entry, s.seq) for s in prefix_sources],
        pinned=pinned,
        summarized_tokens=cut.summarized_tokens,
        kept_tokens=cut.kept_tokens,
        file_ops=ops,
        summary_chars=summary_chars(threshold_tokens, cut.summarized_tokens),
        requests=requests,
        anchors=continuity.Anchors(terms, ops.modified, error, workdir),
        kept=kept,
        replaced_tokens=replaced,
        encoding=encoding,
        history_seqs=tuple(s.seq for s in history_sources),
        prefix_seqs=tuple(s.seq for s in prefix_sources),
        details={
            **ops.to_details(),
            "split_turn": bool(prefix),
            "summarized_entries": len(summarized),
            "summarized_tokens": cut.summarized_tokens,
            "kept_tokens": cut.kept_tokens,
            "pinned_entries": len(pinned),
            "user_requests": requests.to_details(),
            # None until the first request is known: then worked out once, and carried.
            "task_terms": first_terms if requests.first is not None else None,
            "unresolved_error": error.to_details() if error is not None else None,
            "working_directory": workdir,
            # What left the context: the specifics the summarized entries named.
            "dropped": dropped.index(
                [*history, *prefix],
                files=ops,
                seqs=[s.seq for s in summarized_sources if s.kind not in SYNTHETIC_KINDS],
            ),
            # The media the summaries so far replaced: the summary's <media> block.
            "media": carried_media(
                _strings((previous_details or {}).get("media")),
                media_pointers([(s.seq, s.entry) for s in summarized_sources]),
            ),
        },
    )


def with_policy(
    plan: Plan,
    policy: str,
    *,
    verbatim_share: float,
    usable_tokens: int,
    trigger_tokens: int,
    previous_details: Mapping[str, Any] | None,
) -> Plan:
    """``plan`` under the session's compaction ``policy``. "summarize" changes
    nothing. "verbatim_first" (:mod:`app.engine.compaction.verbatim`): the tool outputs
    leave pointers, the user's and the assistant's text stays as written while it
    fits ``verbatim_share`` of ``usable_tokens`` (with what the previous block kept,
    read from ``previous_details``; and never so much that the context would stand
    near ``trigger_tokens`` again), and ``history`` becomes what is left to
    summarize (the split turn's start included: the block carries it on). The
    latest user request steers which older messages are kept; the requests the
    summary quotes whole are not repeated."""
    if policy != "verbatim_first":
        return replace(plan, policy=policy)
    entries = [
        *zip(plan.history_seqs, plan.history, strict=True),
        *zip(plan.prefix_seqs, plan.turn_prefix, strict=True),
    ]
    requests = plan.requests
    committed = plan.kept_tokens + (requests.tokens if requests else 0)
    budget = verbatim_rules.budget_tokens(
        verbatim_share,
        usable_tokens,
        trigger_tokens=trigger_tokens,
        committed_tokens=committed,
    )
    if budget < verbatim_rules.MIN_BLOCK_TOKENS:
        # No room for a block worth having (the kept window and the quoted requests
        # fill the context already): everything is summarized, tool outputs included.
        return replace(plan, policy=policy, details={**plan.details, "policy": policy})
    quoted = {r.seq for r in requests.quoted if not r.clipped} if requests is not None else set()
    split = verbatim_rules.select(
        entries,
        verbatim_rules.Verbatim.from_details(previous_details),
        budget,
        lambda text: token_counts.count_text(text, plan.encoding),
        quoted=quoted,
        steer=_latest_request([*(e for _, e in entries), *plan.kept]),
    )
    # Verbatim before summary: the summary of the rest gets what the block leaves.
    room = verbatim_rules.room_tokens(trigger_tokens, committed) - split.verbatim.tokens
    chars = max(MIN_SUMMARY_CHARS, min(plan.summary_chars, room * 4))
    return replace(
        plan,
        summary_chars=chars,
        history=split.remainder,
        history_seqs=split.remainder_seqs,
        turn_prefix=[],
        prefix_seqs=(),
        policy=policy,
        verbatim=split.verbatim,
        details={**plan.details, "policy": policy, "verbatim": split.verbatim.to_details()},
    )


def _latest_request(entries: Sequence[Entry]) -> str | None:
    """The newest user message that names something (the service's "continue"
    names nothing the task terms count)."""
    for entry in reversed(entries):
        text = _request_text(entry) if entry.role == "user" else ""
        if text and anchor_rules.task_terms(text):
            return text
    return None


def _workdir(sources: Sequence[Source], previous: Mapping[str, Any] | None) -> str | None:
    """The working directory the history states (carried once found; see
    :func:`app.engine.compaction.continuity.stated_workdir`)."""
    carried = previous.get("working_directory") if previous is not None else None
    if isinstance(carried, str) and carried.startswith("/"):
        return carried
    texts = (
        s.entry.text()
        for s in sources
        if s.entry.role in ("user", "system", "developer") and s.kind == "message"
    )
    return continuity.stated_workdir(texts)


def _deduped(ops: FileOps, workdir: str | None) -> FileOps:
    """``ops`` without the absolute paths under ``workdir`` whose relative form it
    lists too: the same file, named two ways. A file read under one form and
    modified under the other is modified."""
    if not workdir:
        return ops
    root = workdir.rstrip("/") + "/"
    modified = continuity.dedupe_under(ops.modified, (), workdir)
    changed = set(modified)
    read = [
        p
        for p in continuity.dedupe_under(ops.read, modified, workdir)
        if root + p not in changed and p.removeprefix(root) not in changed
    ]
    if len(modified) == len(ops.modified) and len(read) == len(ops.read):
        return ops
    return FileOps.of(read, modified)


def _task_terms(
    summarized: Sequence[Source],
    sources: Sequence[Source],
    requests: KeptRequests,
    previous: Mapping[str, Any] | None,
) -> tuple[list[str], tuple[str, ...]]:
    """The first request's key terms (carried), and all the task terms the gate checks.

    The first request's come from its whole text when this compaction sees it (it
    summarizes it, or it is pinned), else from the previous details (``task_terms``,
    or the quoted text of a compaction made before they were kept); then those of
    the later requests the summary quotes (their whole text when this history holds
    them), or of the newest request summarized when none is quoted."""
    texts = {
        s.seq: text
        for s in sources
        if s.entry.role == "user" and s.kind == "message" and (text := _request_text(s.entry))
    }
    carried = previous.get("task_terms") if previous is not None else None
    first_terms: list[str]
    if isinstance(carried, list):
        first_terms = [t for t in carried if isinstance(t, str) and t]
    elif requests.first is not None:
        text = texts.get(requests.first.seq, requests.first.text)
        first_terms = anchor_rules.task_terms(text)[: continuity.MAX_TERMS]
    else:
        first_terms = []
    later = [texts.get(r.seq, r.text) for r in requests.later]
    if not later:
        newest = next(
            (
                text
                for s in reversed(summarized)
                if s.entry.role == "user"
                and s.kind == "message"
                and (requests.first is None or s.seq != requests.first.seq)
                and (text := _request_text(s.entry))
            ),
            None,
        )
        later = [newest] if newest is not None else []
    terms = [*first_terms, *(t for text in later for t in anchor_rules.task_terms(text))]
    return first_terms, tuple(dict.fromkeys(terms))[: continuity.MAX_TERMS]


def _unresolved_error(
    summarized: Sequence[Entry], previous: Mapping[str, Any] | None
) -> continuity.UnresolvedError | None:
    """The latest unresolved error of the summarized history; when it has none, the
    one the previous compaction carried, unless this history resolves it (the rule
    the extractive summary applies to the errors it pins)."""
    latest = anchor_rules.latest_unresolved_error(summarized)
    if latest is not None:
        line = latest.line.strip()
        return continuity.UnresolvedError(line, latest.label, latest.also) if line else None
    carried = continuity.UnresolvedError.from_details(
        previous.get("unresolved_error") if previous is not None else None
    )
    if carried is None:
        return None
    if carried.command and anchor_rules.is_resolved(carried.command, summarized):
        return None
    return carried


# The file lists' share of the summary's size: both lists within a quarter (and
# at least MIN_FILES_CHARS); the modified files alone may take up to half.
FILES_SHARE = 4
MODIFIED_SHARE = 2
MIN_FILES_CHARS = 400


def _listed(paths: Sequence[str], budget: int) -> tuple[list[str], int]:
    """The head of ``paths`` that fits ``budget`` characters (a line each), then
    ``(and N more)`` when some do not; and the characters used."""
    shown: list[str] = []
    used = 0
    for path in paths:
        if used + len(path) + 1 > budget:
            break
        shown.append(path)
        used += len(path) + 1
    hidden = len(paths) - len(shown)
    if hidden:
        shown.append(f"(and {hidden} more)")
    return shown, used


def capped_files(ops: FileOps, max_chars: int) -> tuple[list[str], list[str]]:
    """The file lists as the summary of ``max_chars`` characters shows them.

    The modified files come first and get what they need, up to half of
    ``max_chars`` (and at least the lists' own budget); the read files get what is
    left of the lists' budget, a quarter of ``max_chars`` (at least
    ``MIN_FILES_CHARS``). So the read files are cut first, and the modified list
    only beyond its hard cap, both with ``(and N more)``: the job's details keep
    every path, and the continuity gate says which modified files the summary does
    not name. Without a cap the lists, cumulative across compactions, would grow
    each summary until it filled the window."""
    budget = max(MIN_FILES_CHARS, max_chars // FILES_SHARE)
    modified, used = _listed(ops.modified, max(budget, max_chars // MODIFIED_SHARE))
    read, _ = _listed(ops.read, max(0, budget - used))
    return read, modified


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def final_summary(
    history_summary: str,
    turn_prefix_summary: str | None,
    ops: FileOps,
    max_chars: int = 12_000,
    requests: KeptRequests | None = None,
    anchors: str = "",
    kept_verbatim: verbatim_rules.Verbatim | None = None,
    media: Sequence[str] = (),
) -> str:
    """The stored summary: the history, the split turn's prefix under its own
    heading, the continuity gate's ``<continuity-anchors>`` block (``anchors``,
    when the gate completed the summary), the files read and modified so far
    (:func:`capped_files` of ``max_chars``, the summary's size), the ``<media>``
    block of the images and documents it replaced (``media``), then the
    ``verbatim_first`` policy's ``<verbatim-history>`` block (``kept_verbatim``,
    within its own budget), and last the user's requests quoted verbatim
    (``requests``' block, within its own token budget). Blocks or file tags the
    summarizer echoed are replaced, never repeated."""
    text = history_summary
    if turn_prefix_summary:
        text = merge_split_turn(history_summary, turn_prefix_summary)
    text = verbatim_rules.strip_block(continuity.strip_block(with_user_requests(text, "")))
    if anchors:
        text = f"{text}\n\n{anchors}" if text else anchors
    read, modified = capped_files(ops, max_chars)
    text = with_media(with_file_tags(text, read, modified), media)
    if kept_verbatim is not None:
        text = verbatim_rules.with_block(text, kept_verbatim.block())
    return with_user_requests(text, requests.block() if requests is not None else "")


@dataclass(frozen=True, slots=True)
class Draft:
    """A summary before the continuity gate: its parts, rendered with a block or without."""

    history_summary: str
    turn_prefix_summary: str | None
    plan: Plan

    def render(self, anchors: str = "") -> str:
        p = self.plan
        return final_summary(
            self.history_summary,
            self.turn_prefix_summary,
            p.file_ops,
            p.summary_chars,
            p.requests,
            anchors,
            p.verbatim,
            _strings(p.details.get("media")),
        )


# --- The continuity gate --------------------------------------------------------------

# Room kept for the synthetic "continue" an automatic compaction may add after
# the summary (about a dozen tokens).
CONTINUE_MARGIN_TOKENS = 16


def summary_entry_tokens(summary: str, encoding: token_counts.EncodingName) -> int:
    """What the compaction entry of ``summary`` costs in the context, counted as the
    commit counts it (the user message :func:`render_context_message` makes)."""
    text = render_context_message(summary)
    entry = Entry(role="user", parts=[{"type": "text", "text": text}], content_form="string")
    return token_counts.count_entry(entry, encoding)


def check_draft(draft: Draft, kept: str | None = None) -> continuity.Missing:
    """What ``draft``, rendered without a block, and the kept window leave unnamed
    (``kept``: the window's text, when worked out already)."""
    plan = draft.plan
    window = continuity.kept_text(plan.kept) if kept is None else kept
    return continuity.check(draft.render(), window, plan.anchors)


def complete_draft(
    draft: Draft,
    missing: continuity.Missing,
    record: continuity.GateRecord,
    kept: str | None = None,
) -> tuple[str, continuity.GateRecord]:
    """The summary of ``draft`` completed with a block naming ``missing`` (within
    :func:`app.engine.compaction.continuity.block_chars` of the summary's size), and ``record``
    saying what the block names and what is still missing.

    The block never turns a compaction that would be committed into one that is
    not: when the summary without it would leave the context smaller (its entry
    below :attr:`Plan.replaced_tokens`, less room for a "continue") and the block
    would not, the block's last items are dropped until it fits (the terms first,
    then the files, the error last), and ``record.trimmed`` says which.
    ``record.missing_after`` is what the summary returned still does not name.
    ``kept``: the kept window's text, when worked out already."""
    plan = draft.plan
    window = continuity.kept_text(plan.kept) if kept is None else kept
    cap = continuity.block_chars(plan.summary_chars)
    completion = continuity.complete(draft.render, missing, cap)
    record = replace(record, completed=completion.added)
    limit = plan.replaced_tokens - CONTINUE_MARGIN_TOKENS - 1

    def count(text: str) -> int:
        return summary_entry_tokens(text, plan.encoding)

    if (
        not completion.added.empty
        and plan.replaced_tokens > 0
        and count(completion.summary) > limit
        and count(draft.render()) <= limit
    ):
        completion = continuity.fit(draft.render, completion, limit, count)
        still = continuity.check(completion.summary, window, plan.anchors)
        return completion.summary, record.refit(completion, still)
    still = continuity.check(completion.summary, window, plan.anchors)
    return completion.summary, replace(record, missing_after=still)
