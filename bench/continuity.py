"""Continuity after compaction (docs/how-it-works.md, "Compaction"): what the agent still knows once its history
is compacted.

``python -m bench continuity`` (or ``make continuity``, or ``python -m bench.continuity``)
replays the real traces (``tests/data/traces``) at a 16k window with the built-in
extractive summarizer, no model, and after every compaction checks the context the
agent would be sent next against three things read from the trace by
:mod:`bench.continuity_rules` (rules of its own, not the summarizer's code):

- **task**: the share of compactions whose context keeps at least 80% of the
  distinctive terms of the agent's first request;
- **files**: the share of compactions whose context names every file modified before
  the cut (*named*), and the share whose summary lists every one under
  ``<modified-files>`` (*listed*); compactions before any file was modified are left out;
- **error**: the share of compactions whose context holds the last failure before the
  cut (its key line); compactions with no failure before the cut are left out.

The same figures are given for a baseline that keeps only the newest raw messages (the
system prompt, then whole messages from the newest back) within the post-compaction
context's token count, tool calls and results kept paired. Also printed: compactions
per trace and in total (by reason), the summaries' average size in tokens, and the run's
elapsed time. ``--json`` prints it all as one JSON document, each compaction included.

The replay is the service's own engine, in memory, with no Postgres and no HTTP: each
turn's messages are appended as the e2e replay (tests/e2e/test_trace_compaction_replay)
appends them, with the usage the trace's model reported before each assistant message
(scaled to the context held, as there); ingest truncation, the ledger's totals, the
verdict, the relief policy (prune, then compact), the cut, the extractive summary, the
commit's rules (a summary that would not shrink the context is not committed; low
yield holds the next automatic compaction; the synthetic "continue") and the view are
the functions the service calls. What differs: the service runs a threshold compaction
in a background worker, so the agent may append a turn or more before it commits (and
finds calls still running, so adds no "continue"); here it commits at once, as if the
worker were instant. With an instant worker the replay is the service, turn for turn:
tests/bench/test_continuity_replay.py runs a trace through both and compares every
context, the totals and every summary. The compaction's decisions (what to keep, the
plan's arguments, the previous summary as the summarizer reads it, the entries
appended, the pinned entries, whether it is committed and whether its yield holds the
next one) are :mod:`app.engine.compaction.pivot_rules`, which ``app.compactions.pivot.prepare``
and ``commit_pivot`` call too: :meth:`Session.compact` does only the reads the service
does in SQL (the entries since the pivot, the kept window's totals, the log's tail).
Reused tool call ids (renamed in the view by the service) do not occur in these traces
(the replay refuses them), nor do messages pinned on append.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.budget.prune import _TYPICAL_CALL_ID_TOKENS
from app.compactions.summarizer import extractive
from app.core.tokenizer import load_encodings
from app.engine.accounting import budget, catalog, ledger, relief, tokens
from app.engine.compaction import pivot_rules
from app.engine.compaction import prepare as engine
from app.engine.formats.openai_format import parse_message, render_message
from app.engine.model import Entry
from app.engine.window import truncate
from app.engine.window.context import check_openai_pairing, pair_tool_calls
from app.engine.window.prune import Item, PruneSettings, plan_prune
from app.engine.window.view import placeholder_entry
from app.sessions.schemas import SessionConfig
from bench import continuity_rules as rules
from tests import traces
from tests.recount import recount

MODEL = "deepseek-chat"
# As the e2e compaction replay: usable 12,288 tokens, compaction at 8,192.
WINDOW = budget.Window(context_window=16_384, max_output_tokens=4_096)
CONFIG: dict[str, Any] = {
    "compaction": {"reserve_tokens": 4_096, "summarizer": "extractive"},
    "prune": {"protect_tokens": 4_000, "minimum_tokens": 2_000},
}
ENCODING = catalog.lookup(MODEL).encoding
TASK_SHARE = 0.8
# The finish reason every usage report of the replay gives, as the e2e replay's.
FINISH_REASON = "tool_calls"


def reported_prompt(message: dict[str, Any]) -> int | None:
    """The prompt size the trace's model reported for the call that wrote ``message``."""
    usage = ((message.get("extra") or {}).get("response") or {}).get("usage") or {}
    value = usage.get("prompt_tokens")
    return value if isinstance(value, int) and value > 0 else None


# --- the session, in memory ---------------------------------------------------------


@dataclass(slots=True)
class Stored:
    """One entry of the log: as stored (whole) and as the model is shown it."""

    seq: int
    kind: str  # message | compaction | continue
    entry: Entry
    shown: Entry
    tokens: int
    trace_index: int | None = None
    call_id_tokens: int | None = None

    @property
    def role(self) -> str:
        return self.entry.role


@dataclass(slots=True)
class Compacted:
    """A committed compaction, and the context the agent gets right after it."""

    reason: str
    first_kept_seq: int
    cut_index: int  # trace messages before the cut (summarized, or pinned)
    appended: int  # trace messages stored when it ran
    summary_tokens: int  # the summary entry, as the context counts it
    summary_budget_chars: int
    summary_chars: int
    tokens_before: int  # counted context tokens
    tokens_after: int
    estimate_after: int  # the verdict's estimate right after the commit
    continued: bool
    summary: str
    context: list[dict[str, Any]]


@dataclass(slots=True)
class Session:
    """A session's log and totals, moved by the engine's functions as the service moves them."""

    config: SessionConfig
    window: budget.Window = WINDOW
    encoding: tokens.EncodingName = ENCODING
    log: list[Stored] = field(default_factory=list)
    totals: ledger.Totals = field(default_factory=ledger.Totals)
    marks: dict[int, int] = field(default_factory=dict)  # pruned seq -> placeholder tokens
    held_seq: int | None = None
    previous: tuple[str, dict[str, Any]] | None = None  # the last summary and its details
    call_names: dict[str, str] = field(default_factory=dict)
    compactions: list[Compacted] = field(default_factory=list)
    appended: int = 0  # trace messages stored
    not_committed: Counter[str] = field(default_factory=Counter)

    @property
    def thresholds(self) -> budget.Thresholds:
        c = self.config.compaction
        return budget.Thresholds(
            reserve_tokens=c.reserve_tokens,
            threshold=c.threshold,
            emergency_fraction=c.emergency_fraction,
        )

    def accounting(self, totals: ledger.Totals | None = None) -> budget.Accounting:
        t = totals or self.totals
        return budget.Accounting(
            context_tokens=t.context_tokens,
            calibration_factor=t.calibration_factor,
            overhead_tokens=t.overhead_tokens + tokens.REPLY_PRIMING_TOKENS,
            reported_prompt_tokens=t.reported_prompt_tokens,
            context_tokens_at_report=t.context_tokens_at_report,
        )

    def verdict(self) -> budget.Verdict:
        return budget.verdict(self.accounting(), self.window, self.thresholds)

    def guards(self) -> relief.Guards:
        t, c, p = self.totals, self.config.compaction, self.config.prune
        return relief.Guards(
            prune_auto=p.enabled and p.auto,
            prune_minimum_tokens=p.minimum_tokens,
            context_tool_tokens=t.context_tool_tokens,
            prune_checked_tool_tokens=t.prune_checked_tool_tokens,
            prune_checked_urgent=t.prune_checked_urgent,
            compaction_auto=c.enabled and c.auto,
            compaction_held_seq=self.held_seq,
            next_seq=t.next_seq,
            compaction_active=False,  # the worker is instant here
            compaction_failures=0,  # the extractive summarizer does not fail
        )

    # Appends and usage reports, as the service takes them.

    def _shown(self, entry: Entry) -> Entry:
        """The entry after ingest truncation (docs/how-it-works.md), as the append shows it."""
        cfg = self.config.truncate
        if entry.role != "tool" or not cfg.enabled:
            return entry
        category = truncate.category_for(entry.tool_name, cfg.categories)
        texts = [p for p in entry.parts if p["type"] == "text" and p["text"]]
        parts = []
        cut_any = False
        for part in entry.parts:
            if part["type"] == "text" and part["text"]:
                cut = truncate.truncate(
                    part["text"], category, cfg.tool_result_token_cap // len(texts)
                )
                if cut.truncated:
                    part = {**part, "text": cut.text}
                    cut_any = True
            parts.append(part)
        return dataclasses.replace(entry, parts=parts) if cut_any else entry

    def append(self, batch: Sequence[dict[str, Any]]) -> None:
        added: list[ledger.Added] = []
        for message in batch:
            entry = parse_message(message, f"messages[{self.appended}]")
            for call in entry.tool_calls():
                if call["id"] in self.call_names:
                    raise ValueError(f"tool call id {call['id']!r} is reused: not replayed here")
                self.call_names[call["id"]] = call["name"]
            if entry.role == "tool" and entry.tool_call_id is not None:
                entry.tool_name = self.call_names[entry.tool_call_id]
            shown = self._shown(entry)
            count = tokens.count_entry(shown, self.encoding)
            id_tokens = (
                tokens.count_text(entry.tool_call_id, self.encoding)
                if entry.role == "tool" and entry.tool_call_id
                else None
            )
            seq = self.totals.next_seq + len(added)
            self.log.append(Stored(seq, "message", entry, shown, count, self.appended, id_tokens))
            added.append(ledger.Added(count, entry.role == "tool"))
            self.appended += 1
        self.totals = ledger.apply(self.totals, ledger.Appended(tuple(added)))
        self.relieve("append")

    def report_usage(self, prompt: int) -> None:
        """A usage report about the context the agent was just served (this one: the
        compactions here are committed before the agent reads its next context)."""
        t = self.totals
        counted = t.context_tokens + t.overhead_tokens + tokens.REPLY_PRIMING_TOKENS
        factor = budget.calibrate(t.calibration_factor, prompt, counted)
        self.totals = ledger.apply(
            t, ledger.UsageReported(factor, t.overhead_tokens, prompt, t.context_tokens)
        )
        self.relieve("usage")

    def relieve(self, trigger: relief.Trigger) -> None:
        """app.budget.relief.relieve: prune, then compact, as the policy says."""
        verdict = self.verdict()
        step = relief.prune_step(trigger, verdict.action, self.guards())
        if step is not None and self.prune(step):
            verdict = self.verdict()
        reason = relief.compaction_step(trigger, verdict.action, self.guards())
        if reason is not None:
            self.compact(reason)

    # Pruning (app.budget.prune.prune_locked).

    def prune(self, step: relief.PruneStep) -> int:
        cfg = self.config.prune
        if not cfg.enabled:
            return 0
        base = tokens.count_entry(
            placeholder_entry(None, None, False, cfg.placeholder), self.encoding
        )
        minimum = cfg.minimum_tokens if step.minimum_tokens is None else step.minimum_tokens
        settings = PruneSettings(
            protect_tokens=cfg.protect_tokens,
            minimum_tokens=minimum,
            protect_turns=0 if step.urgent else cfg.protect_turns,
            protected_tools=frozenset(t.lower() for t in cfg.protected_tools),
            placeholder_tokens=base + _TYPICAL_CALL_ID_TOKENS,
        )
        start = self.totals.context_start_seq
        window = [s for s in self.log if s.seq >= start and s.kind != "compaction"]
        items = [
            Item(
                s.seq,
                s.role,
                s.kind,
                s.entry.tool_name,
                self.marks.get(s.seq, s.tokens),
                s.seq in self.marks,
            )
            for s in window
        ]
        plan = plan_prune(items, settings)
        by_seq = {s.seq: s for s in window}
        rows: list[tuple[int, int]] = []
        saved = 0
        for seq in plan.seqs:
            stored = by_seq[seq]
            cost = base + (stored.call_id_tokens or 0)
            if stored.tokens <= cost:
                continue
            saved += stored.tokens - cost
            rows.append((seq, cost))
        if not rows or saved < minimum:
            self.totals = ledger.apply(self.totals, ledger.PruneChecked(step.urgent))
            return 0
        self.marks.update(rows)
        self.totals = ledger.apply(self.totals, ledger.Pruned(saved, step.urgent))
        return saved

    # Compaction: app.compactions.pivot.prepare and commit_pivot, the worker's rules.
    # Every decision is app.engine.compaction.pivot_rules', as there; only the reads differ
    # (the log in memory, where the service reads its rows).

    def _by_seq(self, seq: int) -> Stored:
        return self.log[seq - 1]

    def _calls_pending(self, seq: int) -> bool:
        """The latest assistant entry with calls at or before ``seq`` still waits on
        one (the repository's ``calls_pending``)."""
        at = next(
            (s for s in reversed(self.log[:seq]) if s.role == "assistant" and s.entry.call_ids),
            None,
        )
        if at is None:
            return False
        answered = {s.entry.tool_call_id for s in self.log[at.seq : seq] if s.role == "tool"}
        return any(c not in answered for c in at.entry.call_ids)

    def _should_continue(self, seq: int) -> bool:
        tail = self._by_seq(seq)
        return pivot_rules.continues(
            role=tail.role,
            kind=tail.kind,
            makes_calls=bool(tail.entry.call_ids),
            finish_reason=FINISH_REASON,
            calls_pending=tail.kind == "message"
            and tail.role == "tool"
            and self._calls_pending(seq),
        )

    def _sources(self) -> list[engine.Source]:
        """The entries since the pivot as ``pivot.sources_of`` gives them: a pruned
        output costs its placeholder. (No reused call ids, nothing pinned on append
        here: the view's ids are the entries' own.)"""
        return [
            engine.Source(
                seq=s.seq,
                kind=s.kind,
                entry=Entry(
                    role=s.entry.role,
                    parts=s.entry.parts,
                    tool_call_id=s.entry.tool_call_id,
                    tool_name=s.entry.tool_name,
                    is_error=s.entry.is_error,
                    name=s.entry.name,
                    tokens=self.marks.get(s.seq, s.tokens),
                ),
            )
            for s in self.log[self.totals.context_start_seq - 1 :]
        ]

    def compact(self, reason: str, *, auto: bool = True) -> None:
        t, c = self.totals, self.config.compaction
        plan = pivot_rules.plan(
            self._sources(),
            reason=reason,
            start_seq=t.context_start_seq,
            end_seq=t.next_seq,
            context_tokens=t.context_tokens,
            trigger_tokens=self.thresholds.trigger_tokens(self.window.usable_tokens),
            keep_recent_tokens=c.keep_recent_tokens,
            keep_requests_tokens=c.keep_requests_tokens,
            previous_details=self.previous[1] if self.previous else None,
            encoding=self.encoding,
        )
        if plan is None:  # nothing to cut: held until new history arrives
            self.held_seq = t.next_seq
            self.not_committed["nothing to cut"] += 1
            return
        # The session's policy, as app.compactions.pivot.prepare applies it.
        plan = engine.with_policy(
            plan,
            c.policy,
            verbatim_share=c.verbatim_share,
            usable_tokens=self.window.usable_tokens,
            trigger_tokens=self.thresholds.trigger_tokens(self.window.usable_tokens),
            previous_details=self.previous[1] if self.previous else None,
        )
        previous = pivot_rules.previous_summary(self.previous[0] if self.previous else None)
        summarized = extractive(plan, previous, c.instructions)
        seq = t.next_seq
        continued = auto and c.auto_continue and self._should_continue(seq - 1)
        new = pivot_rules.pivot_entries(
            seq,
            summarized.summary,
            continued=continued,
            encoding=self.encoding,
            replaced=(plan.start_seq, plan.first_kept_seq - 1),
        )
        pinned = pivot_rules.pinned_after(t.pinned_seqs, plan)
        kept, tool = recount(self.log, self.marks, plan.first_kept_seq, seq, pinned)
        moved = pivot_rules.moved(plan, new, pinned, window_tokens=kept, window_tool_tokens=tool)
        judged = pivot_rules.judge(self.accounting(), moved)
        if not judged.gain:  # NoGain: not committed, held
            self.held_seq = t.next_seq
            self.not_committed["no gain"] += 1
            return
        self.log.extend(Stored(n.seq, n.kind, n.entry, n.entry, n.entry.tokens) for n in new)
        self.totals = ledger.apply(t, moved)
        self.held_seq = self.totals.next_seq if judged.low_yield else None
        self.previous = (summarized.summary, plan.details)
        first_kept = next(
            (
                s.trace_index
                for s in self.log[plan.first_kept_seq - 1 :]
                if s.trace_index is not None
            ),
            self.appended,
        )
        self.compactions.append(
            Compacted(
                reason=reason,
                first_kept_seq=plan.first_kept_seq,
                cut_index=first_kept,
                appended=self.appended,
                summary_tokens=new[0].entry.tokens,
                summary_budget_chars=plan.summary_chars,
                summary_chars=len(summarized.summary),
                tokens_before=t.context_tokens,
                tokens_after=self.totals.context_tokens,
                estimate_after=budget.estimate(self.accounting()),
                continued=continued,
                summary=summarized.summary,
                context=self.context(),
            )
        )

    # The view (app.context: pinned entries, the summary, the window; paired).

    def context(self) -> list[dict[str, Any]]:
        t = self.totals
        placeholder = self.config.prune.placeholder
        chosen = [self._by_seq(s) for s in t.pinned_seqs]
        if t.summary_seq is not None:
            chosen.append(self._by_seq(t.summary_seq))
        chosen.extend(s for s in self.log[t.context_start_seq - 1 :] if s.kind != "compaction")
        entries = [
            placeholder_entry(
                s.entry.tool_call_id, s.entry.tool_name, s.entry.is_error, placeholder
            )
            if s.seq in self.marks
            else s.shown
            for s in chosen
        ]
        return [render_message(e) for e in pair_tool_calls(entries)]


# --- one trace: replay and measure ---------------------------------------------------


@dataclass(slots=True)
class TraceFacts:
    """What the measure reads of a trace, message by message (see continuity_rules)."""

    terms: list[str]
    modified_before: list[list[str]]  # [k]: files modified by messages[:k], first first
    failure_before: list[rules.Failure | None]  # [k]: the last failure in messages[:k]
    raw_tokens: list[int]  # each message whole, as counted for the baseline
    entries: list[Entry]


def trace_facts(messages: list[dict[str, Any]], encoding: tokens.EncodingName) -> TraceFacts:
    request = next(
        (rules.message_text(m) for m in messages if m["role"] == "user"),
        "",
    )
    state = rules.ShellState.new()
    calls: dict[str, dict[str, Any]] = {}
    modified: dict[str, None] = {}
    failure: rules.Failure | None = None
    modified_before: list[list[str]] = [[]]
    failure_before: list[rules.Failure | None] = [None]
    raw_tokens: list[int] = []
    entries: list[Entry] = []
    for i, m in enumerate(messages):
        entry = parse_message(m, f"messages[{i}]")
        entry.tokens = tokens.count_entry(entry, encoding)
        entries.append(entry)
        raw_tokens.append(entry.tokens)
        for call in m.get("tool_calls") or []:
            calls[call["id"]] = call["function"]
        if m["role"] == "tool":
            function = calls.get(m.get("tool_call_id") or "", {})
            output = rules.message_text(m)
            code = rules.exit_code(output)
            name, arguments = function.get("name", ""), function.get("arguments", "")
            for write in rules.writes_of_call(name, arguments, state, exit_code=code):
                modified.setdefault(write.path)
            command = rules.command_of(arguments)
            found = rules.failure_of(output, command, is_error=bool(m.get("is_error")))
            failure = found or failure
        modified_before.append(list(modified))
        failure_before.append(failure)
    return TraceFacts(
        rules.task_terms(request), modified_before, failure_before, raw_tokens, entries
    )


def baseline(
    facts: TraceFacts, appended: int, budget_tokens: int
) -> tuple[list[dict[str, Any]], int]:
    """The newest raw messages within ``budget_tokens``: the system prompt, then whole
    messages from the newest back; tool calls and results kept paired. And their
    tokens, counted whole."""
    system = [i for i in range(appended) if facts.entries[i].role in ("system", "developer")]
    total = sum(facts.raw_tokens[i] for i in system)
    newest: list[int] = []
    for i in range(appended - 1, -1, -1):
        if i in system:
            continue
        if total + facts.raw_tokens[i] > budget_tokens:
            break
        total += facts.raw_tokens[i]
        newest.append(i)
    paired = pair_tool_calls([facts.entries[i] for i in system + newest[::-1]])
    return [render_message(e) for e in paired], sum(e.tokens for e in paired)


@dataclass(slots=True)
class Check:
    terms: int
    terms_kept: int
    task: bool
    modified: int  # files modified before the cut
    named: bool | None  # None: no file modified yet
    listed: bool | None
    missing_named: list[str]
    missing_listed: list[str]
    failure: str | None  # its key
    failure_kind: str | None
    error: bool | None  # None: no failure before the cut


def check(
    facts: TraceFacts, cut_index: int, context: list[dict[str, Any]], *, summary: bool
) -> Check:
    raw = "\n".join(rules.message_text(m) for m in context)
    text = rules.normalize(raw)
    kept = rules.terms_kept(facts.terms, text)
    modified = facts.modified_before[cut_index]
    missing_named = [p for p in modified if not rules.named_in(text, p)]
    listed = rules.listed_modified(raw) if summary else None
    missing_listed = [p for p in modified if listed is None or p not in listed]
    failure = facts.failure_before[cut_index]
    return Check(
        terms=len(facts.terms),
        terms_kept=len(kept),
        task=len(kept) >= TASK_SHARE * len(facts.terms),
        modified=len(modified),
        named=not missing_named if modified else None,
        listed=(not missing_listed if modified else None) if summary else None,
        missing_named=missing_named,
        missing_listed=missing_listed if summary else [],
        failure=failure.key if failure else None,
        failure_kind=failure.kind if failure else None,
        error=rules.failure_kept(failure, text) if failure else None,
    )


def usage_prompt(session: Session, batch: Sequence[dict[str, Any]]) -> int | None:
    """The usage to report before ``batch`` (an assistant's reply): what its model
    reported for the whole history, scaled to the context the session holds now."""
    prompt = reported_prompt(batch[0]) if batch[0]["role"] == "assistant" else None
    if prompt is None:
        return None
    whole = session.totals.stored_tokens + tokens.REPLY_PRIMING_TOKENS
    shown = session.totals.context_tokens + tokens.REPLY_PRIMING_TOKENS
    return round(prompt * shown / whole)


def step(session: Session, batch: Sequence[dict[str, Any]]) -> None:
    """One turn as the agent makes it: the model call's usage, then its messages."""
    prompt = usage_prompt(session, batch)
    if prompt is not None:
        session.report_usage(prompt)
    session.append(batch)


def replay(path: Path) -> dict[str, Any]:
    messages = traces.load(path)
    session = Session(SessionConfig.model_validate(CONFIG))
    facts = trace_facts(messages, session.encoding)
    for batch in traces.turns(messages):
        step(session, batch)
    usable = WINDOW.usable_tokens
    rows = []
    for n, c in enumerate(session.compactions, 1):
        ours = check(facts, c.cut_index, c.context, summary=True)
        base, base_tokens = baseline(facts, c.appended, c.tokens_after)
        theirs = check(facts, c.cut_index, base, summary=False)
        pending = bool(c.context) and c.context[-1]["role"] == "assistant"
        problems = check_openai_pairing(c.context, allow_pending=pending)
        rows.append(
            {
                "n": n,
                "reason": c.reason,
                "appended": c.appended,
                "cut_index": c.cut_index,
                "tokens_before": c.tokens_before,
                "tokens_after": c.tokens_after,
                "summary_tokens": c.summary_tokens,
                "summary_chars": c.summary_chars,
                "summary_budget_chars": c.summary_budget_chars,
                "continued": c.continued,
                "pairing_problems": [p.problem for p in problems],
                "over_budget": c.estimate_after > usable,
                "compacted": dataclasses.asdict(ours),
                "baseline": dataclasses.asdict(theirs),
                "baseline_messages": len(base),
                "baseline_tokens": base_tokens,
                "baseline_pairing_problems": [
                    p.problem for p in check_openai_pairing(base, allow_pending=True)
                ],
            }
        )
    return {
        "trace": path.name.split(".")[0],
        "messages": len(messages),
        "terms": facts.terms,
        "modified_files": facts.modified_before[-1],
        "not_committed": dict(session.not_committed),
        "stored_tokens_end": session.totals.stored_tokens,
        "context_tokens_end": session.totals.context_tokens,
        "compactions": rows,
    }


# --- figures and report ---------------------------------------------------------------


def _share(values: Sequence[bool | None]) -> tuple[int, int]:
    counted = [v for v in values if v is not None]
    return sum(counted), len(counted)


def figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures over ``rows`` (compactions): each as [passed, counted]."""
    out: dict[str, Any] = {"compactions": len(rows)}
    for side in ("compacted", "baseline"):
        out[side] = {
            "task": _share([r[side]["task"] for r in rows]),
            "files_named": _share([r[side]["named"] for r in rows]),
            "files_listed": _share([r[side]["listed"] for r in rows]),
            "error": _share([r[side]["error"] for r in rows]),
        }
    shares = [
        r["compacted"]["terms_kept"] / r["compacted"]["terms"]
        for r in rows
        if r["compacted"]["terms"]
    ]
    out["task_terms_kept_avg"] = round(sum(shares) / len(shares), 3) if shares else None
    out["reasons"] = dict(Counter(r["reason"] for r in rows))
    out["continued"] = sum(r["continued"] for r in rows)
    out["summary_tokens_avg"] = (
        round(sum(r["summary_tokens"] for r in rows) / len(rows), 1) if rows else None
    )
    out["pairing_problems"] = sum(len(r["pairing_problems"]) for r in rows)
    out["over_budget"] = sum(r["over_budget"] for r in rows)
    return out


def _pct(pair: Sequence[int]) -> str:
    passed, counted = pair
    return "    -" if counted == 0 else f"{100 * passed / counted:4.0f}%"


def _line(name: str, f: dict[str, Any]) -> str:
    ours, base = f["compacted"], f["baseline"]
    return (
        f"  {name:<34} {f['compactions']:>5} {f['summary_tokens_avg'] or 0:>7}"
        f"   {_pct(ours['task'])} {_pct(ours['files_named'])} {_pct(ours['files_listed'])}"
        f" {_pct(ours['error'])}   {_pct(base['task'])} {_pct(base['files_named'])}"
        f" {_pct(base['error'])}"
    )


def report(results: list[dict[str, Any]], elapsed: float, *, verbose: bool) -> None:
    print(
        f"\nContinuity after compaction: {len(results)} traces, window"
        f" {WINDOW.context_window:,} (usable {WINDOW.usable_tokens:,}), extractive summarizer"
    )
    print(
        f"  {'trace':<34} {'comp.':>5} {'summary':>7}   {'task':>5} {'named':>5} {'listed':>5}"
        f" {'error':>5}   {'-- newest raw messages --':>19}"
    )
    print(
        f"  {'':<34} {'':>5} {'tokens':>7}   {'':>5} {'files':>5} {'files':>5} {'':>5}"
        f"   {'task':>5} {'named':>5} {'error':>5}"
    )
    everything: list[dict[str, Any]] = []
    for r in results:
        rows = r["compactions"]
        everything.extend(rows)
        print(_line(r["trace"], figures(rows)))
        if verbose:
            for row in rows:
                ours = row["compacted"]
                print(
                    f"      #{row['n']:<3} {row['reason']:<9} cut at message {row['cut_index']:>3}"
                    f" of {row['appended']:>3}: {row['tokens_before']:>5} -> {row['tokens_after']:>5}"
                    f" tokens; terms {ours['terms_kept']}/{ours['terms']}; files"
                    f" {ours['modified']} (not named {ours['missing_named']}, not listed"
                    f" {ours['missing_listed']}); error {ours['error']}: {ours['failure']!r}"
                )
    total = figures(everything)
    print("  " + "-" * 96)
    print(_line("all traces", total))
    ours, base = total["compacted"], total["baseline"]
    print(
        f"\n  compactions: {total['compactions']} ({', '.join(f'{k} {v}' for k, v in total['reasons'].items())}),"
        f" {total['compactions'] / max(1, len(results)):.1f} per trace; summaries average"
        f" {total['summary_tokens_avg']} tokens"
    )
    for label, key in (
        ("task: >= 80% of the request's terms kept", "task"),
        ("files: every modified file named in the context", "files_named"),
        ("files: every modified file under <modified-files>", "files_listed"),
        ("error: the last failure before the cut kept", "error"),
    ):
        b = "" if key == "files_listed" else f"; newest raw messages {_pct(base[key]).strip()}"
        print(f"  {label:<52} {_pct(ours[key]).strip():>5} of {ours[key][1]} compactions{b}")
    print(
        f"  the request's terms kept on average: {100 * (total['task_terms_kept_avg'] or 0):.0f}%"
        f"; {total['continued']} synthetic continue prompts; at the end"
        f" {sum(r['context_tokens_end'] for r in results):,} context tokens of"
        f" {sum(r['stored_tokens_end'] for r in results):,} stored"
    )
    print(
        f"  invalid contexts: {total['pairing_problems']} pairing problems,"
        f" {total['over_budget']} over budget"
    )
    print(f"  elapsed {elapsed:.1f} s")


def run(*, as_json: bool = False, verbose: bool = False) -> int:
    started = time.perf_counter()
    tokens.register_encodings(load_encodings())
    results = [replay(path) for path in traces.trace_files()]
    elapsed = time.perf_counter() - started
    if as_json:
        document = {
            "window": dataclasses.asdict(WINDOW),
            "config": CONFIG,
            "task_share": TASK_SHARE,
            "elapsed_seconds": round(elapsed, 2),
            "total": figures([row for r in results for row in r["compactions"]]),
            "traces": [{**r, "figures": figures(r["compactions"])} for r in results],
        }
        print(json.dumps(document, indent=1))
    else:
        report(results, elapsed, verbose=verbose)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.continuity", description=__doc__)
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--verbose", action="store_true", help="a line per compaction")
    args = parser.parse_args(argv)
    return run(as_json=args.json, verbose=args.verbose)


if __name__ == "__main__":
    raise SystemExit(main())
