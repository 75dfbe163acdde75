"""Turning a plan into a summary: the upstream LLM when there is one, the
extractive summarizer otherwise, and as the fallback when the upstream fails
for good.

The LLM path never gives up on length: when the conversation does not fit the
summarizer's window, tool outputs are clipped harder, and then the history is
summarized in chunks, each chunk updating the summary of the ones before (the
update prompt with ``<previous-summary>``). A provider's "too long" reply
shrinks the budget and goes the same way.

Every summary passes the continuity gate (:mod:`app.engine.compaction.continuity`) before it
is handed back: what it and the kept window do not name of the task's key terms,
the modified files and the latest unresolved error is completed from those
anchors in a ``<continuity-anchors>`` block. A model's summary is first asked for
again, once, with the missing things named (``must_name.md`` after the same
prompt); the better of the two is completed. :attr:`Summarized.gate` records it all.

Where the summarizer's requests go (:class:`Llm`):

- **A remote endpoint** (``compaction.remote_endpoint``, :mod:`app.upstream.remote`):
  every request, the history's, the split turn's, the gate's retry and the short
  summary's, is POSTed there as ``{"systemPrompt", "prompt"}``; the summary records
  ``remote:<host>`` as its model. It wins over the upstream LLM and needs none.
- **The upstream LLM**, with the job's model first and then the session's
  ``compaction.models`` candidates: when a model fails in a way that would end in
  the extractive summary (an error not worth retrying, or a retryable one on the
  job's last attempt), the next candidate is asked, in the same attempt, before
  falling back. A retryable failure with attempts left still retries the whole job
  later (from the first candidate again). The notes say which models failed, why,
  and which one wrote the summary.

Under the ``verbatim_first`` policy the plan's history is only what its verbatim
block could not keep (:func:`app.engine.compaction.prepare.with_policy`); the
block is rendered with the summary, never summarized, and a previous summary's
block is left out of what the summarizer reads.

A hook may hand :func:`summarize` a ``prompt`` (in place of the strategy's
instructions for the history summary) and ``context`` lines (an
``<additional-context>`` list in the history's prompt, or the split turn's when
there is no history; quoted in their own section by the extractive summary).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import anyio.to_thread

from app.core import model_catalog
from app.core.outbound import Lane
from app.engine.accounting import tokens
from app.engine.accounting.summarizer_spend import add_usage
from app.engine.compaction import continuity
from app.engine.compaction import verbatim as verbatim_rules
from app.engine.compaction.extractive import (
    FOCUS_LABEL,
    QUOTED_NOTE,
    extractive_summary,
    focus_terms,
)
from app.engine.compaction.extractive import NOTE as EXTRACTIVE_NOTE
from app.engine.compaction.prepare import Draft, Plan, check_draft, complete_draft
from app.engine.compaction.summary import (
    PromptRequest,
    add_must_name,
    build_prompt,
    build_short_prompt,
    build_turn_prefix_prompt,
    clean_reply,
    clean_short_reply,
    serialize_conversation,
)
from app.engine.model import Entry
from app.upstream.client import (
    Completion,
    UpstreamConfig,
    UpstreamError,
    backoff_delay,
    complete,
)
from app.upstream.remote import RemoteEndpoint, summarize_remote

CLIP_CHARS = 2_000
HARD_CLIP_CHARS = 400
SHORT_MAX_CHARS = 120
# Room kept for the prompt's own text and the reply.
PROMPT_MARGIN_TOKENS = 1_024
MAX_OVERFLOW_RETRIES = 3
MAX_CHUNKS = 64
# The output room assumed for a remote endpoint's model (it sizes the prompt only).
REMOTE_OUTPUT_TOKENS = 4_096


@dataclass(frozen=True, slots=True)
class Llm:
    """Where and how to call the summarizer model.

    The upstream LLM (``config``): ``model`` first, then each of ``fallback_models``
    not already tried. Or, when ``remote`` is set, that endpoint for every request:
    ``config`` and ``fallback_models`` are then not used, and ``model`` only sizes
    the prompts (the endpoint's own model is not known)."""

    lane: Lane
    config: UpstreamConfig | None
    model: str
    fallback_models: tuple[str, ...] = ()
    remote: RemoteEndpoint | None = None
    tenant_id: str = ""  # whose share of the lane a call takes (app.core.outbound)

    def __post_init__(self) -> None:
        if self.config is None and self.remote is None:
            raise ValueError("an Llm needs an upstream config or a remote endpoint")

    @property
    def candidates(self) -> tuple[str, ...]:
        """The models to try, in order (the remote endpoint's label alone)."""
        if self.remote is not None:
            return (self.remote.label,)
        return tuple(dict.fromkeys((self.model, *self.fallback_models)))

    @property
    def max_output_tokens(self) -> int:
        if self.remote is not None or self.config is None:
            return REMOTE_OUTPUT_TOKENS
        return self.config.max_output_tokens


@dataclass(frozen=True, slots=True)
class Backoff:
    base_seconds: float = 2.0
    cap_seconds: float = 60.0
    max_attempts: int = 3
    rand: Callable[[], float] = random.random


@dataclass(slots=True)
class Summarized:
    summary: str
    short_summary: str | None
    used: str  # "llm" | "extractive"
    upstream_model: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    calls: int = 0  # the requests sent to the summarizer, failed ones included
    notes: list[str] = field(default_factory=list)  # why the LLM was not (fully) used
    # A summarizer (the upstream, a remote endpoint) was asked and failed for good:
    # this is the extractive fallback.
    fell_back: bool = False
    # What the continuity gate found, and the summary's parts (to render it again
    # with a shorter block, should the commit find it too long).
    gate: continuity.GateRecord | None = None
    draft: Draft | None = None


class RetryLater(Exception):
    """The upstream failed in a way worth retrying: run the job again later."""

    def __init__(
        self,
        delay_seconds: float,
        reason: str,
        usage: dict[str, int] | None = None,
        calls: int = 0,
    ) -> None:
        super().__init__(reason)
        self.delay_seconds = delay_seconds
        self.reason = reason
        # What the requests answered before the failure cost (a history summary
        # written before the split turn's request failed, say): billed all the same.
        self.usage: dict[str, int] = dict(usage or {})
        self.calls = calls  # the requests sent, failed ones included


def extractive(
    plan: Plan,
    previous_summary: str | None,
    instructions: str | None = None,
    context: Sequence[str] = (),
) -> Summarized:
    """The summary without a model; ``instructions`` are its focus (see
    :mod:`app.engine.compaction.extractive`), and the job's notes say what became of them;
    ``context`` lines are quoted in their own section."""
    entries = [*plan.history, *plan.turn_prefix]
    body = extractive_summary(
        entries,
        previous_summary=_carried(previous_summary, keeps_block=plan.verbatim is not None),
        read_files=plan.file_ops.read,
        modified_files=plan.file_ops.modified,
        max_chars=plan.summary_chars,
        instructions=instructions,
        first_request_quoted=plan.first_request_quoted,
        context=context,
    )
    notes = [_focus_note(instructions, body)] if instructions and instructions.strip() else []
    draft = Draft(body, None, plan)
    missing = check_draft(draft)
    summary, gate = complete_draft(draft, missing, continuity.GateRecord(plan.anchors, missing))
    return Summarized(
        summary=summary,
        short_summary=_short_from(body),
        used="extractive",
        notes=notes,
        gate=gate,
        draft=draft,
    )


def _carried(previous_summary: str | None, *, keeps_block: bool) -> str | None:
    """The previous summary as the summarizer reads it: without the gate's block,
    which is rebuilt every time. Its verbatim block (a ``verbatim_first`` plan's) is
    rebuilt too when the new plan keeps one (``keeps_block``: from the details, what no
    longer fits it being in the plan's history), so it is left out; when the new plan
    keeps none (the session went back to ``summarize``, or there is no room for a
    block) its messages are read as plain text, to be summarized rather than lost."""
    if previous_summary is None:
        return None
    text = continuity.strip_block(previous_summary)
    if keeps_block:
        return verbatim_rules.strip_block(text)
    return verbatim_rules.unwrap_block(text)


def _focus_note(instructions: str, body: str) -> str:
    """What the extractive summary made of the instructions, for the job's record."""
    terms = focus_terms(instructions)
    if not terms:
        return "extractive summary: the instructions name nothing to look for; quoted as its focus"
    # The summary without the line that quotes the instructions back.
    echo = f"- {FOCUS_LABEL.lower()}"
    rest = "\n".join(line for line in body.lower().splitlines() if not line.startswith(echo))
    found = [t for t in terms if t in rest]
    missing = [t for t in terms if t not in rest]
    note = "extractive summary: instructions used as its focus"
    if found:
        note += f"; kept what names {', '.join(found)}"
    if missing:
        note += f"; not in the summarized history: {', '.join(missing)}"
    return note


def _short_from(summary: str) -> str | None:
    """A one-line summary for UIs, from the summary's first real line (not the
    extractive summary's note, nor a label such as "Original request:")."""
    for line in summary.splitlines():
        # Not the note that the request is quoted whole further on.
        text = line.strip().lstrip("#-*> ").strip().removesuffix(QUOTED_NOTE).rstrip()
        if line.strip() == EXTRACTIVE_NOTE or text.endswith(":"):
            continue
        if text and not text.lower().startswith(("goal", "the conversation")):
            return text[: SHORT_MAX_CHARS - 1] + "…" if len(text) > SHORT_MAX_CHARS else text
    return None


def input_budget(model: str, max_output_tokens: int) -> int:
    """What the summarizer model can read in one call (the operator's catalog included)."""
    spec = model_catalog.lookup(model)
    window = spec.input_limit or (spec.context_window - min(spec.max_output_tokens, 32_000))
    return max(2_048, min(window, spec.context_window - max_output_tokens) - PROMPT_MARGIN_TOKENS)


class _Call:
    """One summarization run against the upstream or the remote endpoint, with one
    candidate model at a time (:meth:`use`): usage adds up across calls."""

    def __init__(self, llm: Llm) -> None:
        self.llm = llm
        self.usage: dict[str, int] = {}
        self.calls = 0  # requests sent, failed ones included
        self.model: str | None = None
        self.asked = llm.candidates[0]

    def use(self, model: str) -> None:
        """Ask ``model`` from now on; the summary's model is its answer's."""
        self.asked = model
        self.model = None

    async def _complete(self, system: str, prompt: str) -> Completion:
        llm = self.llm
        self.calls += 1
        # The place in the lane is taken before the call's own timeout starts.
        async with llm.lane.slot(llm.tenant_id) as http:
            if llm.remote is not None:
                return await summarize_remote(http, llm.remote, system=system, prompt=prompt)
            assert llm.config is not None  # Llm's own check
            return await complete(http, llm.config, model=self.asked, system=system, prompt=prompt)

    async def ask(
        self, system: str, prompt: str, clean: Callable[[str], str | None] = clean_reply
    ) -> str:
        done = await self._complete(system, prompt)
        # The model that wrote the summary: the first call's (the title call is last).
        self.model = self.model or done.model or self.asked
        self.usage = add_usage(self.usage, done.usage)
        # done.text is already storable: the client cleans every upstream string.
        text = clean(done.text)
        if text is None:
            raise UpstreamError(
                "empty", "the summarizer's reply was empty or unusable", retryable=True
            )
        return text


def _fits(text: str, budget: int, upper: int | None = None) -> bool:
    """Whether ``text`` fits ``budget`` tokens. ``upper`` is a bound on its size
    known without counting (the entries' stored counts): counting half a
    megabyte of prompt costs more than the rest of a compaction."""
    if upper is not None and upper <= budget:
        return True
    # A character is rarely less than a quarter of a token: skip counting when clear.
    if len(text) <= budget * 2:
        return True
    if len(text) > budget * 8:
        return False
    return tokens.count_text(text) <= budget


def _upper_bound(entries: Sequence[Entry], conversation: str, prompt_chars: int) -> int:
    """Tokens the prompt takes at most: each entry's serialization is no longer
    than its stored view (whose count is known) plus a label, and the rest of the
    prompt is counted at two characters a token, which overstates it."""
    template = max(0, prompt_chars - len(conversation))
    return sum(e.tokens for e in entries) + 8 * len(entries) + template // 2 + 64


def _chunks(entries: Sequence[Entry], budget: int) -> list[str]:
    """The conversation, clipped hard, in pieces that each fit ``budget``."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    limit = budget * 3  # characters, conservatively
    for entry in entries:
        text = serialize_conversation([entry], clip_chars=HARD_CLIP_CHARS)
        if len(text) > limit:
            text = text[: limit // 2] + "\n[... clipped ...]\n" + text[-limit // 4 :]
        if current and size + len(text) > limit:
            pieces.append("\n".join(current))
            current, size = [], 0
        current.append(text)
        size += len(text) + 1
    if current:
        pieces.append("\n".join(current))
    if len(pieces) > MAX_CHUNKS:  # keep the start and the most recent
        pieces = pieces[:1] + pieces[-(MAX_CHUNKS - 1) :]
    return pieces


async def _summarize_entries(
    call: _Call,
    entries: Sequence[Entry],
    *,
    strategy: Literal["structured", "narrative"],
    previous: str | None,
    instructions: str | None,
    budget: int,
    prompt: str | None = None,
    context: Sequence[str] = (),
) -> tuple[str, PromptRequest | None]:
    """The summary of ``entries`` (updating ``previous``), chunked when needed; and
    the request that wrote it (the last chunk's), for the gate's retry."""
    for attempt in range(MAX_OVERFLOW_RETRIES + 1):
        try:
            conversation = serialize_conversation(entries, clip_chars=CLIP_CHARS)
            request = build_prompt(
                conversation,
                strategy=strategy,
                previous_summary=previous,
                instructions=instructions,
                prompt=prompt,
                context=context,
            )
            text = request.system + request.prompt
            if not _fits(text, budget, _upper_bound(entries, conversation, len(text))):
                conversation = serialize_conversation(entries, clip_chars=HARD_CLIP_CHARS)
                request = build_prompt(
                    conversation,
                    strategy=strategy,
                    previous_summary=previous,
                    instructions=instructions,
                    prompt=prompt,
                    context=context,
                )
            if _fits(request.system + request.prompt, budget):
                return await call.ask(request.system, request.prompt), request
            # Progressive: each chunk updates the summary so far.
            room = max(1_024, budget - tokens.count_text(previous or "") - 2_048)
            summary = previous
            last: PromptRequest | None = None
            for piece in _chunks(entries, room):
                last = build_prompt(
                    piece,
                    strategy=strategy,
                    previous_summary=summary,
                    instructions=instructions,
                    prompt=prompt,
                    context=context,
                )
                summary = await call.ask(last.system, last.prompt)
            return summary or "", last
        except UpstreamError as exc:
            if exc.overflow is None or attempt == MAX_OVERFLOW_RETRIES:
                raise
            limit = exc.overflow.limit_tokens
            budget = max(1_024, min(budget // 2, (limit or budget) - PROMPT_MARGIN_TOKENS))
    raise AssertionError("unreachable")  # pragma: no cover


async def _summarize_prefix(
    call: _Call,
    entries: Sequence[Entry],
    instructions: str | None,
    budget: int,
    context: Sequence[str] = (),
) -> tuple[str, PromptRequest]:
    conversation = serialize_conversation(entries, clip_chars=CLIP_CHARS)
    request = build_turn_prefix_prompt(conversation, instructions, context=context)
    if not _fits(request.system + request.prompt, budget):
        pieces = _chunks(entries, max(1_024, budget - 2_048))
        # The turn's start and its latest steps matter most for continuing it.
        conversation = pieces[0] if len(pieces) == 1 else pieces[0] + "\n[...]\n" + pieces[-1]
        request = build_turn_prefix_prompt(conversation, instructions, context=context)
    return await call.ask(request.system, request.prompt), request


async def _gate(
    call: _Call,
    draft: Draft,
    history_request: PromptRequest | None,
    prefix_request: PromptRequest | None,
) -> tuple[Draft, str, continuity.GateRecord]:
    """The continuity gate on a model's summary: checked, asked for again once
    with what it misses named (the history's request, or the split turn's when
    there is no history), the better of the two kept (the retry's unless it misses
    more), then completed. An upstream failure of the retry is recorded, not
    raised: the first summary is completed instead."""
    plan = draft.plan
    kept = continuity.kept_text(plan.kept)
    missing = check_draft(draft, kept)
    record = continuity.GateRecord(plan.anchors, missing)
    request = history_request or prefix_request
    if not missing.empty and request is not None:
        retry = add_must_name(request, missing.items())
        try:
            text = await call.ask(retry.system, retry.prompt)
        except UpstreamError as exc:
            record = replace(record, retried=True, retry_error=f"upstream {exc.kind}: {exc}")
        else:
            if history_request is not None:
                again = replace(draft, history_summary=text)
            else:
                again = replace(draft, turn_prefix_summary=text)
            still = check_draft(again, kept)
            record = replace(record, retried=True, retry_missing=still)
            if still.count <= missing.count:
                draft, missing = again, still
    summary, record = complete_draft(draft, missing, record, kept)
    return draft, summary, record


@dataclass(slots=True)
class _Drafted:
    history: str
    prefix: str | None
    history_request: PromptRequest | None
    prefix_request: PromptRequest | None


async def _draft(
    call: _Call,
    plan: Plan,
    *,
    previous_summary: str | None,
    strategy: Literal["structured", "narrative"],
    instructions: str | None,
    budget: int,
    prompt: str | None,
    context: Sequence[str],
) -> _Drafted:
    """The history's summary and the split turn's, by the call's current model."""
    history_request: PromptRequest | None = None
    prefix_request: PromptRequest | None = None
    if plan.history:
        history, history_request = await _summarize_entries(
            call,
            plan.history,
            strategy=strategy,
            previous=previous_summary,
            instructions=instructions,
            budget=budget,
            prompt=prompt,
            context=context,
        )
    else:
        history = previous_summary or "(No earlier history: the turn below began the session.)"
    prefix = None
    if plan.turn_prefix:
        # The context goes where a summary is written from the conversation: the
        # history's prompt, or this one when there is no history.
        prefix, prefix_request = await _summarize_prefix(
            call, plan.turn_prefix, instructions, budget, () if plan.history else context
        )
    return _Drafted(history, prefix, history_request, prefix_request)


async def summarize(
    plan: Plan,
    *,
    previous_summary: str | None,
    strategy: Literal["structured", "narrative"],
    instructions: str | None,
    llm: Llm | None,
    attempt: int,
    backoff: Backoff,
    prompt: str | None = None,
    context: Sequence[str] = (),
) -> Summarized:
    """The summary for ``plan``. Raises :class:`RetryLater` when the upstream
    failed in a retryable way and attempts remain; otherwise tries the next
    candidate model (:attr:`Llm.candidates`), then falls back to the extractive
    summarizer, and says why in ``notes``.

    ``prompt``, when given, replaces the strategy's instructions in the history
    summary's prompt (see :func:`app.engine.compaction.summary.build_prompt`); ``context``
    lines are added to it as an ``<additional-context>`` list, and quoted by the
    extractive summary in their own section. The defaults change nothing."""
    context = tuple(context)
    if llm is None:
        # A second of CPU for a large history: in a worker thread, off the event loop.
        return await anyio.to_thread.run_sync(
            extractive, plan, previous_summary, instructions, context
        )
    if previous_summary is not None:
        # A verbatim_first summary's block is rebuilt from the details when the plan
        # keeps one (what no longer fits it is in the plan's history): not for the
        # model to summarize again; when it keeps none, its messages are summarized.
        previous_summary = (
            verbatim_rules.strip_block(previous_summary)
            if plan.verbatim is not None
            else verbatim_rules.unwrap_block(previous_summary)
        )
    call = _Call(llm)
    budget = input_budget(llm.model, llm.max_output_tokens)
    candidates = llm.candidates
    source = "remote" if llm.remote is not None else "upstream"  # what the notes call it
    tried: list[str] = []  # what became of each candidate that failed
    for index, model in enumerate(candidates):
        call.use(model)
        # Named only when there is a choice: a single model's notes read as before.
        who = f"model {model}: " if len(candidates) > 1 else ""
        try:
            drafted = await _draft(
                call,
                plan,
                previous_summary=previous_summary,
                strategy=strategy,
                instructions=instructions,
                budget=budget,
                prompt=prompt,
                context=context,
            )
        except UpstreamError as exc:
            failure = f"{who}{source} {exc.kind}: {exc}"
            if exc.retryable and attempt < backoff.max_attempts:
                delay = backoff_delay(
                    attempt,
                    base=backoff.base_seconds,
                    cap=backoff.cap_seconds,
                    retry_after=exc.retry_after,
                    rand=backoff.rand,
                )
                raise RetryLater(
                    delay, "; ".join([*tried, failure]), call.usage, call.calls
                ) from exc
            if index + 1 < len(candidates):
                tried.append(f"{failure}; trying model {candidates[index + 1]}")
                continue
            fallback = await anyio.to_thread.run_sync(
                extractive, plan, previous_summary, instructions, context
            )
            fallback.notes += tried
            fallback.notes.append(
                f"{who}{source} {exc.kind} (attempt {attempt}): {exc}; used extractive"
            )
            fallback.upstream_model = call.model
            fallback.usage = call.usage
            fallback.calls = call.calls
            fallback.fell_back = True
            return fallback
        break
    notes: list[str] = list(tried)
    if tried:
        notes.append(
            f"summary by model {call.asked} (candidate {len(tried) + 1} of {len(candidates)})"
        )
    draft, summary, gate = await _gate(
        call,
        Draft(drafted.history, drafted.prefix, plan),
        drafted.history_request,
        drafted.prefix_request,
    )
    history, prefix = draft.history_summary, draft.turn_prefix_summary
    short: str | None
    # Titled after the history, unless there is none: then after the split turn.
    titled = prefix if prefix and not plan.history and not previous_summary else history
    try:
        request = build_short_prompt(titled)
        short = await call.ask(request.system, request.prompt, clean_short_reply)
    except UpstreamError as exc:
        short = _short_from(titled)
        notes.append(f"short summary: {source} {exc.kind}; taken from the summary")
    return Summarized(
        summary=summary,
        short_summary=short,
        used="llm",
        upstream_model=call.model,
        usage=call.usage,
        calls=call.calls,
        notes=notes,
        gate=gate,
        draft=draft,
    )
