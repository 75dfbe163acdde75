"""Preparing a compaction (seed 001): what is summarized, what is kept, and the
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
and error lines (:func:`app.engine.summary.clip_request`). What one compaction
quotes is kept in its details and carried by the next, like the file lists, so
the tenth compaction still quotes the first request as it was written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine import cut as cuts
from app.engine import tokens as token_counts
from app.engine.fileops import FileOps, collect
from app.engine.model import Entry
from app.engine.summary import (
    KeptRequest,
    clip_request,
    merge_split_turn,
    omitted_note,
    render_request,
    render_user_requests,
    with_file_tags,
    with_user_requests,
)

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
REQUESTS_SHARE = 0.10
# Below this budget no block is written (the requests are still carried).
MIN_REQUESTS_TOKENS = 200
# A later request is quoted clipped only if this much of it fits.
MIN_CLIPPED_TOKENS = 48
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

    @property
    def split_turn(self) -> bool:
        return bool(self.turn_prefix)


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
    return max(2_000, cap)


def requests_tokens(configured: int, threshold_tokens: int) -> int:
    """The budget of the user's requests quoted verbatim: the configured
    ``keep_requests_tokens``, but never more than a tenth of the compaction
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
    not fit whole is clipped by :func:`~app.engine.summary.clip_request` (the
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
    history = [s.entry for s in summarized_sources[:turn_start] if s.kind not in SYNTHETIC_KINDS]
    prefix = [s.entry for s in summarized_sources[turn_start:] if s.kind not in SYNTHETIC_KINDS]
    pinned = [s.seq for s in sources if s.kept_whole and s.seq < first_kept_seq]
    previous = FileOps.from_details(previous_details) if previous_details else None
    ops = collect(summarized, previous)
    requests = keep_requests(
        summarized_sources,
        [s for s in sources if s.pinned and s.kind == "message"],
        KeptRequests.from_details(previous_details),
        requests_tokens(keep_requests_tokens, threshold_tokens),
        lambda text: token_counts.count_text(text, encoding),
    )
    return Plan(
        start_seq=start_seq,
        first_kept_seq=first_kept_seq,
        history=history,
        turn_prefix=prefix,
        pinned=pinned,
        summarized_tokens=cut.summarized_tokens,
        kept_tokens=cut.kept_tokens,
        file_ops=ops,
        summary_chars=summary_chars(threshold_tokens, cut.summarized_tokens),
        requests=requests,
        details={
            **ops.to_details(),
            "split_turn": bool(prefix),
            "summarized_entries": len(summarized),
            "summarized_tokens": cut.summarized_tokens,
            "kept_tokens": cut.kept_tokens,
            "pinned_entries": len(pinned),
            "user_requests": requests.to_details(),
        },
    )


def capped_files(ops: FileOps, max_chars: int) -> tuple[list[str], list[str]]:
    """The file lists as the summary shows them, within ``max_chars``: modified
    files first, then read ones; what does not fit is counted, not listed (the
    job's details keep every path). Without a cap the lists, cumulative across
    compactions, would grow each summary until it filled the window."""
    budget = max_chars
    shown: dict[str, list[str]] = {"modified": [], "read": []}
    for kind, paths in (("modified", ops.modified), ("read", ops.read)):
        for path in paths:
            if len(path) + 1 > budget:
                break
            shown[kind].append(path)
            budget -= len(path) + 1
        hidden = len(paths) - len(shown[kind])
        if hidden:
            shown[kind].append(f"(and {hidden} more)")
    return shown["read"], shown["modified"]


def final_summary(
    history_summary: str,
    turn_prefix_summary: str | None,
    ops: FileOps,
    max_chars: int = 12_000,
    requests: KeptRequests | None = None,
) -> str:
    """The stored summary: the history, the split turn's prefix under its own
    heading, the files read and modified so far (at most a quarter of
    ``max_chars``, the summary's size), and last the user's requests quoted
    verbatim (``requests``' block, within its own token budget). A block or
    file tags the summarizer echoed are replaced, never repeated."""
    text = history_summary
    if turn_prefix_summary:
        text = merge_split_turn(history_summary, turn_prefix_summary)
    read, modified = capped_files(ops, max(400, max_chars // 4))
    text = with_file_tags(with_user_requests(text, ""), read, modified)
    return with_user_requests(text, requests.block() if requests is not None else "")
