"""Random trees through the API: every session of a family reads exactly its path.

Each example builds a family from one session with random programs of appends
(user messages; assistants calling one or two tools, answered at once or left
pending and answered later), navigations (by seq on the active path, or by an
entry id read from ``GET …/tree``), forks (at any seq, the program then goes on
in the fork), prunes, manual compactions, a worker draining the queued ones
(small windows: the automatic prune, the threshold's and the emergency's
compactions fire too), system messages (pinned by a compaction), deletions of any
session of the family and new sessions made with a deleted id.

The test keeps its own model of the tree: every entry with its parent, and for
each live session the entries of its path, as the program wrote them (the
compactions' own entries are learned where they appear: at a leaf, after the
step that ran them). After every step, for every live session:

(a) ``GET …/messages``, read whole and a page at a time, is the model's path,
    and ``GET …/tree`` shows it as the path, with the right parents;
(b) ``GET …/context`` is valid in both formats (every result behind its call,
    Anthropic's roles alternating), and is the context computed from scratch for
    that path: the latest compaction on it, its pinned entries, its summary and
    the window after it, paired (app.engine.window.context.plan_pairing), the session's
    own prune marks shown as placeholders; its tokens are the session's, less
    what pairing leaves out (a result whose call a compaction cut off is hidden on
    append behind a zero-token mark: the test at the end); a fork has the source's marks of
    its window, and a fork at the leaf reads the source's context;
(c) the session's O(1) totals equal a recount of its path: entry_count is the
    leaf seq and the number of entries, stored_tokens their sum (and each
    entry's path_tokens the sum up to it), the context totals and the pivot a
    recount from the stored rows (tests/recount.py);
(d) no stored entry ever changes, and none disappears while a live session's
    tree holds it (a deleted session takes only what no other one reaches).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from app.engine.window.context import check_anthropic_pairing, check_openai_pairing, plan_pairing
from tests import postgres
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import tool_call
from tests.recount import recount

# --- programs -------------------------------------------------------------------

SIZES = st.sampled_from([3, 30]) | st.integers(3, 900)
PICK = st.integers(0, 2**16)
OP = st.one_of(
    st.tuples(st.just("user"), SIZES),
    st.tuples(st.just("tools"), st.lists(SIZES, min_size=1, max_size=2), st.booleans()),
    st.tuples(st.just("tools"), st.lists(SIZES, min_size=1, max_size=2), st.booleans()),
    st.tuples(st.just("answer"), SIZES),
    st.tuples(st.just("navigate"), PICK, st.booleans()),
    st.tuples(st.just("navigate"), PICK, st.booleans()),
    st.tuples(st.just("fork"), PICK),
    st.tuples(st.just("prune"), st.sampled_from([0, 200])),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("compact"), st.booleans()),
    st.tuples(st.just("drain")),
    st.tuples(st.just("drain")),
    st.tuples(st.just("switch"), PICK),
    st.tuples(st.just("delete"), PICK),
    st.tuples(st.just("recreate"), PICK),
    st.tuples(st.just("system"), st.integers(5, 40)),
)
# A history to cut and prune first (tool rounds, answered), then anything.
OPENING = st.lists(
    st.tuples(
        st.just("tools"), st.lists(st.integers(200, 800), min_size=1, max_size=2), st.just(True)
    ),
    min_size=2,
    max_size=5,
)
PROGRAMS = st.tuples(OPENING, st.lists(OP, min_size=6, max_size=14)).map(lambda p: p[0] + p[1])
SESSIONS = st.fixed_dictionaries(
    {
        "context_window": st.sampled_from([3_500, 6_000]),
        "max_output_tokens": st.just(500),
        "config": st.fixed_dictionaries(
            {
                "compaction": st.fixed_dictionaries(
                    {
                        "summarizer": st.just("extractive"),
                        "auto": st.booleans(),
                        "reserve_tokens": st.just(500),
                        "keep_recent_tokens": st.sampled_from([200, 600]),
                        "auto_continue": st.booleans(),
                    }
                ),
                "prune": st.fixed_dictionaries(
                    {
                        "auto": st.booleans(),
                        "protect_tokens": st.sampled_from([0, 400]),
                        "minimum_tokens": st.sampled_from([0, 200]),
                        "protect_turns": st.integers(0, 1),
                    }
                ),
            }
        ),
    }
)

TAG = re.compile(r"^([a-z]+\d+):")


def text(tokens: int, tag: str) -> str:
    """About ``tokens`` tokens of text, starting with its tag."""
    return f"{tag}:" + "".join(f" w{k}" for k in range(tokens // 2))


# --- the model --------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """An entry as the program wrote it (or, for a compaction's, as it appeared)."""

    id: str
    parent: str | None
    seq: int
    kind: str  # message, compaction, continue
    role: str
    tag: str | None  # what its text starts with (messages)
    calls: tuple[str, ...] = ()
    answers: str | None = None  # a tool result's call


class Item(NamedTuple):
    """What plan_pairing reads of an entry of the context."""

    role: str
    tool_call_id: str | None
    call_ids: tuple[str, ...]


@dataclass
class World:
    prefix: str
    nodes: dict[str, Node] = field(default_factory=dict)
    paths: dict[str, list[str]] = field(default_factory=dict)  # live session -> its path
    families: set[str] = field(default_factory=set)
    rows: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # entry id -> stored row
    trees: dict[str, set[str]] = field(default_factory=dict)  # live session -> its tree's ids
    family_of: dict[str, str] = field(default_factory=dict)  # session or entry -> family
    deleted: list[str] = field(default_factory=list)  # ids free again
    forks: set[str] = field(default_factory=set)  # the ids made by a fork
    config: dict[str, Any] = field(default_factory=dict)  # how the root was created
    current: str = ""
    tags: Iterator[int] = field(default_factory=itertools.count)

    def tag(self, kind: str) -> str:
        return f"{kind}{next(self.tags)}"

    def path_nodes(self, sid: str) -> list[Node]:
        return [self.nodes[i] for i in self.paths[sid]]

    def pending(self, sid: str) -> list[str]:
        """The calls on the session's path that its path does not answer."""
        nodes = self.path_nodes(sid)
        answered = {n.answers for n in nodes}
        return [c for n in nodes for c in n.calls if c not in answered]

    def ancestors(self, node_id: str) -> list[str]:
        out: list[str] = []
        at: str | None = node_id
        while at is not None:
            out.append(at)
            at = self.nodes[at].parent
        return out[::-1]

    def grow(self, sid: str, entry: dict[str, Any], node: Node) -> None:
        path = self.paths[sid]
        assert entry["seq"] == len(path) + 1, (entry, len(path))
        assert node.id not in self.nodes
        self.nodes[node.id] = node
        self.family_of[node.id] = self.family_of[sid]
        path.append(node.id)


# --- reading and checking -------------------------------------------------------


async def ok(r: httpx.Response, *codes: int) -> Any:
    assert r.status_code in (codes or (200,)), r.text
    return r.json()


async def read_history(client: httpx.AsyncClient, sid: str, limit: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await ok(
            await client.get(
                f"/v1/sessions/{sid}/messages", params={"after_seq": after, "limit": limit}
            )
        )
        entries.extend(page["entries"])
        if page["next_after_seq"] is None:
            return entries
        assert page["entries"], "an empty page that promises another"
        after = page["next_after_seq"]


async def read_tree(client: httpx.AsyncClient, sid: str, limit: int) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        page = await ok(await client.get(f"/v1/sessions/{sid}/tree", params=params))
        entries.extend(page["entries"])
        cursor = page["next_cursor"]
        if cursor is None:
            whole: dict[str, Any] = {**page, "entries": entries}
            return whole


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What a message of an OpenAI context (or history) says, for comparison."""
    if message["role"] == "tool":
        return ("tool", message["tool_call_id"])
    content = message.get("content")
    first = content if isinstance(content, str) else None
    if isinstance(content, list) and content and content[0].get("type") == "text":
        first = content[0]["text"]
    found = TAG.match(first or "")
    calls = tuple(c["id"] for c in message.get("tool_calls") or ())
    return (message["role"], found[1] if found else None, calls)


def node_key(node: Node, drop: frozenset[str] = frozenset()) -> tuple[Any, ...]:
    if node.answers is not None:
        return ("tool", node.answers)
    return (node.role, node.tag, tuple(c for c in node.calls if c not in drop))


async def sync(
    client: httpx.AsyncClient, world: World, sid: str, *, tail_allowed: bool, limit: int
) -> list[dict[str, Any]]:
    """(a): the session's history is its path in the model; entries a compaction
    wrote at the leaf (only after a step that may run one) join the model."""
    history = await read_history(client, sid, 1000)
    if limit != 1000:
        assert await read_history(client, sid, limit) == history, "paging changed the history"
    path = world.paths[sid]
    assert [e["id"] for e in history[: len(path)]] == path, f"{sid}: not the model's path"
    extra = history[len(path) :]
    if extra:
        assert tail_allowed, f"{sid}: entries appeared: {[(e['seq'], e['kind']) for e in extra]}"
        for e in extra:
            assert e["kind"] in ("compaction", "continue"), e
            parent = path[-1] if path else None
            world.grow(sid, e, Node(e["id"], parent, e["seq"], e["kind"], e["role"], None))
            event(f"a compaction wrote a {e['kind']} entry")
    for e, node in zip(history, world.path_nodes(sid), strict=True):
        assert e["seq"] == node.seq
        assert (e["kind"], e["role"]) == (node.kind, node.role), (e, node)
        if node.kind == "message":
            assert message_key(e["message"]) == node_key(node), (e, node)
    return history


async def check_session(
    client: httpx.AsyncClient,
    conn: asyncpg.Connection,
    world: World,
    sid: str,
    *,
    tail_allowed: bool,
    limit: int,
) -> None:
    history = await sync(client, world, sid, tail_allowed=tail_allowed, limit=limit)
    nodes = world.path_nodes(sid)
    leaf = len(nodes)
    session = await ok(await client.get(f"/v1/sessions/{sid}"))
    row = await conn.fetchrow("SELECT * FROM session WHERE id = $1", sid)
    assert row is not None
    stored = {
        r["id"]: r
        for r in await conn.fetch(
            "SELECT id::text AS id, branch, seq, kind, role, tokens, path_tokens, pivot_start,"
            " pivot_pinned FROM entry WHERE session_id = $1 AND id = ANY($2::uuid[])",
            row["family_id"],
            [n.id for n in nodes],
        )
    }
    assert len(stored) == leaf
    rows = [stored[n.id] for n in nodes]

    # (c) the totals, recounted from the path's rows.
    assert session["entry_count"] == leaf == row["next_seq"] - 1
    assert session["stored_tokens"] == sum(e["tokens"] for e in history)
    assert [e["tokens"] for e in history] == [r["tokens"] for r in rows]
    assert [r["path_tokens"] for r in rows] == list(itertools.accumulate(r["tokens"] for r in rows))
    summaries = [r for r in rows if r["kind"] == "compaction"]
    assert session["compaction_count"] == row["compaction_count"] == len(summaries)
    summary = summaries[-1] if summaries else None
    start = 1 if summary is None else summary["pivot_start"]
    pinned = [] if summary is None else list(summary["pivot_pinned"] or ())
    assert pinned == [
        r["seq"] for r in rows if r["seq"] < start and r["role"] in ("system", "developer")
    ]
    assert row["context_start_seq"] == start
    assert row["summary_seq"] == (None if summary is None else summary["seq"])
    assert list(row["pinned_seqs"] or ()) == pinned
    marks = {
        (m["branch"], m["seq"]): m["tokens"]
        for m in await conn.fetch(
            "SELECT branch, seq, tokens FROM prune_mark WHERE session_id = $1", sid
        )
    }
    on_path_marks = {
        r["seq"]: marks[r["branch"], r["seq"]] for r in rows if (r["branch"], r["seq"]) in marks
    }
    assert {e["seq"] for e in history if e["pruned_at"] is not None} == set(on_path_marks)
    context, tool = recount(
        [_Counted(r["seq"], r["role"], r["kind"], r["tokens"]) for r in rows],
        on_path_marks,
        start,
        None if summary is None else summary["seq"],
        pinned,
    )
    assert (row["context_tokens"], row["context_tool_tokens"]) == (context, tool), sid
    assert session["context_tokens"] == context

    # (b) the context: valid, and the one computed from scratch for this path.
    window = [nodes[s - 1] for s in pinned]
    if summary is not None:
        window.append(nodes[summary["seq"] - 1])
    window += [n for n in nodes[start - 1 :] if n.kind != "compaction"]
    steps = plan_pairing([Item(n.role, n.answers, n.calls) for n in window])
    expected = [node_key(window[s.at], s.drop) for s in steps]
    marked = {s for s in on_path_marks if s >= start}
    cost = {n.seq: on_path_marks.get(n.seq, rows[n.seq - 1]["tokens"]) for n in window}
    ctx = await ok(await client.get(f"/v1/sessions/{sid}/context", params={"format": "openai"}))
    messages = ctx["messages"]
    assert check_openai_pairing(messages, allow_pending=True) == [], messages
    assert [message_key(m) for m in messages] == expected, sid
    for m, s in zip(messages, steps, strict=True):
        node = window[s.at]
        if node.answers is not None:
            shown = m["content"] if isinstance(m["content"], str) else ""
            assert shown.startswith(f"{node.tag}:") == (node.seq not in marked), (m, node)
    breakdown = ctx["tokens"]["breakdown"]
    shown_tokens = breakdown["summary"] + breakdown["messages"] + breakdown["tool_outputs"]
    assert shown_tokens == sum(cost[window[s.at].seq] for s in steps)
    assert ctx["version"] == session["version"]
    anthropic = await ok(
        await client.get(f"/v1/sessions/{sid}/context", params={"format": "anthropic"})
    )
    assert check_anthropic_pairing(anthropic["messages"], allow_pending=True) == [], anthropic
    uses = [
        b["id"]
        for m in anthropic["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_use"
    ]
    assert uses == [c["id"] for m in messages for c in m.get("tool_calls") or ()]
    # The session counts the whole window; the context leaves out what pairing
    # drops (a result whose call is before the cut costs nothing: the test at the end).
    left_out = set(range(len(window))) - {s.at for s in steps}
    if left_out:
        event("pairing left an entry of the window out of the context")
    assert shown_tokens == context - sum(cost[window[i].seq] for i in left_out), sid

    # (a) the tree shows the path, each entry with its parent.
    tree = await read_tree(client, sid, 200 if limit == 1000 else limit)
    entries = tree["entries"]
    assert tree["leaf_seq"] == leaf
    assert tree["leaf_id"] == (nodes[-1].id if nodes else None)
    assert [e["id"] for e in sorted(entries, key=lambda e: e["seq"]) if e["on_path"]] == [
        n.id for n in nodes
    ]
    assert [e["id"] for e in entries if e["leaf"]] == [nodes[-1].id]
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids))
    for e in entries:
        node = world.nodes.get(e["id"])
        assert node is not None, f"an entry nobody wrote: {e}"
        assert world.family_of[node.id] == world.family_of[sid], f"another family's entry: {e}"
        assert (e["parent_id"], e["seq"], e["kind"]) == (node.parent, node.seq, node.kind)
        assert e["children"] == sum(c["parent_id"] == e["id"] for c in entries)
    covered = [s for seg in tree["path"] for s in range(seg["from_seq"], seg["to_seq"] + 1)]
    assert covered == list(range(1, leaf + 1))
    by_seq = {r["seq"]: r["branch"] for r in rows}
    assert all(
        by_seq[s] == seg["branch"]
        for seg in tree["path"]
        for s in range(seg["from_seq"], seg["to_seq"] + 1)
    )
    world.trees[sid] = set(ids)


@dataclass(frozen=True)
class _Counted:
    seq: int
    role: str
    kind: str
    tokens: int


async def check_rows(conn: asyncpg.Connection, world: World) -> None:
    """(d): the family's stored entries, against every earlier look at them."""
    rows = {
        r["id"]: tuple(r)
        for r in await conn.fetch(
            "SELECT id::text AS id, session_id, branch, seq, kind, role, parts::text, tokens,"
            " parent_branch, parent_seq, path_tokens, pinned FROM entry"
            " WHERE session_id = ANY($1::text[])",
            sorted(world.families),
        )
    }
    held = set().union(*world.trees.values()) if world.trees else set()
    for entry_id, before in world.rows.items():
        now = rows.get(entry_id)
        if now is None:
            assert entry_id not in held, f"entry {entry_id} of a live session's tree is gone"
            continue
        assert now == before, f"entry {entry_id} changed"
    unknown = set(rows) - set(world.nodes)
    assert not unknown, f"entries nobody wrote: {unknown}"
    world.rows = rows


# --- the steps ----------------------------------------------------------------------


async def append(
    client: httpx.AsyncClient, world: World, sid: str, batch: list[tuple[dict[str, Any], Node]]
) -> None:
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": [m for m, _ in batch]})
    done = await ok(r, 201)
    assert len(done["entries"]) == len(batch)
    for stored, (message, draft) in zip(done["entries"], batch, strict=True):
        path = world.paths[sid]
        node = Node(
            stored["id"],
            path[-1] if path else None,
            stored["seq"],
            "message",
            message["role"],
            draft.tag,
            draft.calls,
            draft.answers,
        )
        world.grow(sid, stored, node)


def draft(role: str, tag: str, calls: tuple[str, ...] = (), answers: str | None = None) -> Node:
    return Node("", None, 0, "message", role, tag, calls, answers)


def user(world: World, size: int) -> tuple[dict[str, Any], Node]:
    tag = world.tag("u")
    return {"role": "user", "content": text(size, tag)}, draft("user", tag)


def results(world: World, calls: list[str], size: int) -> list[tuple[dict[str, Any], Node]]:
    return [
        (
            {"role": "tool", "tool_call_id": c, "content": text(size, f"r{c}")},
            draft("tool", f"r{c}", answers=c),
        )
        for c in calls
    ]


async def step(
    client: httpx.AsyncClient, app: Any, conn: asyncpg.Connection, world: World, op: tuple[Any, ...]
) -> tuple[str, bool]:
    """Run one step; what it did, and whether a compaction may have written entries."""
    kind, sid = op[0], world.current
    if kind == "user":
        await append(client, world, sid, [user(world, op[1])])
        return kind, True
    if kind == "tools":
        _, sizes, answer_now = op
        tag = world.tag("a")
        calls = [f"{world.prefix}c{next(world.tags)}" for _ in sizes]
        call = {
            "role": "assistant",
            "content": text(20, tag),
            "tool_calls": [tool_call(c) for c in calls],
        }
        batch = [(call, draft("assistant", tag, tuple(calls)))]
        if answer_now:
            for c, size in zip(calls, sizes, strict=True):
                batch += results(world, [c], size)
        await append(client, world, sid, batch)
        return f"tools answered={answer_now}", True
    if kind == "answer":
        pending = world.pending(sid)
        if not pending:
            await append(client, world, sid, [user(world, op[1])])
            return "user", True
        await append(client, world, sid, results(world, pending, op[1]))
        return "answer pending calls later", True
    if kind == "navigate":
        _, pick, by_id = op
        path = world.paths[sid]
        if not path:
            return "navigate (empty)", False
        if by_id:
            # Off the path, when the tree has a branch and the pick is odd.
            entries = (await read_tree(client, sid, 1000))["entries"]
            elsewhere = [e for e in entries if not e["on_path"]]
            if elsewhere and pick % 2:
                entries = elsewhere
            target = entries[pick // 2 % len(entries)]["id"]
            body: dict[str, Any] = {"entry_id": target}
        else:
            target = path[pick % len(path)]
            body = {"seq": world.nodes[target].seq}
        moved = await ok(await client.post(f"/v1/sessions/{sid}/navigate", json=body))
        new_path = world.ancestors(target)
        assert moved["leaf_seq"] == len(new_path)
        assert moved["leaf_id"] == target
        assert moved["status"] == ("unchanged" if new_path == path else "moved"), moved
        assert moved["session"]["entry_count"] == len(new_path)
        if sum(world.nodes[n].kind == "compaction" for n in path) > sum(
            world.nodes[n].kind == "compaction" for n in new_path
        ):
            event("navigate back before a compaction (undo it)")
        world.paths[sid] = new_path
        off = target not in path
        return f"navigate by {'id' if by_id else 'seq'}{' off the path' if off else ''}", False
    if kind == "fork":
        path = world.paths[sid]
        at = len(path) if op[1] % 3 == 0 else op[1] % len(path) + 1
        new = f"{world.prefix}f{next(world.tags)}"
        before = await ok(await client.get(f"/v1/sessions/{sid}/context"))
        forked = await ok(
            await client.post(f"/v1/sessions/{sid}/fork", json={"at_seq": at, "id": new}), 201
        )
        assert forked["entry_count"] == at
        world.paths[new] = path[:at]
        world.family_of[new] = world.family_of[sid]
        world.forks.add(new)
        world.current = new
        # The fork's prune marks: the source's on the shared path, in the window
        # the path has at the fork point; at the leaf, the fork reads the same context.
        summaries = [n for n in world.path_nodes(new) if n.kind == "compaction"]
        start = 1
        if summaries:
            start = await conn.fetchval(
                "SELECT pivot_start FROM entry WHERE id = $1::uuid", summaries[-1].id
            )
        shared = await conn.fetch(
            "SELECT m.branch, m.seq, m.tokens FROM prune_mark AS m JOIN entry AS e"
            " ON e.session_id = $2 AND e.branch = m.branch AND e.seq = m.seq"
            " WHERE m.session_id = $1 AND e.id = ANY($3::uuid[]) AND m.seq >= $4",
            sid,
            world.family_of[sid],
            path[:at],
            start,
        )
        copied = await conn.fetch(
            "SELECT branch, seq, tokens FROM prune_mark WHERE session_id = $1", new
        )
        assert sorted(map(tuple, copied)) == sorted(map(tuple, shared))
        if at == len(path):
            same = await ok(await client.get(f"/v1/sessions/{new}/context"))
            assert same["messages"] == before["messages"]
            assert same["tokens"] == before["tokens"]
            return "fork at the leaf", False
        return "fork", False
    if kind == "system":
        tag = world.tag("s")
        message = {"role": "system", "content": text(op[1], tag)}
        await append(client, world, sid, [(message, draft("system", tag))])
        return "system", True
    if kind == "recreate":
        if not world.deleted:
            return "recreate (none deleted)", False
        sid = world.deleted.pop(op[1] % len(world.deleted))
        await make_session(client, id=sid, **world.config)
        family = await conn.fetchval("SELECT family_id FROM session WHERE id = $1", sid)
        world.families.add(family)
        world.family_of[sid] = family
        world.paths[sid] = []
        world.current = sid
        await append(client, world, sid, [user(world, 30)])
        return f"recreate a deleted {'fork' if sid in world.forks else 'root'}", True
    if kind == "prune":
        pruned = await ok(
            await client.post(
                f"/v1/sessions/{sid}/prune",
                json={"protect_tokens": op[1], "minimum_tokens": 0, "protect_turns": 0},
            )
        )
        return f"prune hid {'some' if pruned['pruned'] else 'none'}", False
    if kind == "compact":
        r = await client.post(f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive"})
        if r.status_code == 409:
            assert "nothing to compact" in r.json()["detail"], r.text
            return "compact refused", False
        await ok(r, 202)
        if op[1]:
            await drain(app)
            return "compact and drain", True
        return "compact queued", False
    if kind == "drain":
        ran = await drain(app)
        for live in sorted(world.paths):
            jobs = await ok(await client.get(f"/v1/sessions/{live}/compactions"))
            for job in jobs["compactions"]:
                event(f"a {job['reason']} compaction {job['status']}")
                if job["status"] == "failed":
                    event(f"compaction failed: {str(job['error'])[:120]}")
        return f"drain ran {min(ran, 2)}", True
    if kind == "switch":
        sessions = sorted(world.paths)
        world.current = sessions[op[1] % len(sessions)]
        return "switch", False
    assert kind == "delete"
    if len(world.paths) < 2:
        return "delete (last one kept)", False
    sid = sorted(world.paths)[op[1] % len(world.paths)]
    r = await client.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 204, r.text
    del world.paths[sid], world.trees[sid]
    world.deleted.append(sid)
    assert (await client.get(f"/v1/sessions/{sid}")).status_code == 404
    if world.current == sid:
        world.current = sorted(world.paths)[0]
    return f"delete a {'fork' if sid in world.forks else 'root'}", False


# --- the test -------------------------------------------------------------------------

examples = itertools.count()


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(session=SESSIONS, program=PROGRAMS, limit=st.sampled_from([1000, 4]))
async def test_every_path_of_a_random_tree_reads_as_written(
    app: Any,
    client: httpx.AsyncClient,
    db_url: str,
    session: dict[str, Any],
    program: list[tuple[Any, ...]],
    limit: int,
) -> None:
    note(f"session={session!r}\nprogram={program!r}\nlimit={limit}")
    world = World(prefix=f"t{next(examples)}")
    root = f"{world.prefix}root"
    await make_session(client, id=root, **session)
    world.paths[root] = []
    world.families.add(root)
    world.family_of[root] = root
    world.config = session
    world.current = root
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        system = {"role": "system", "content": text(20, "s0")}
        await append(client, world, root, [(system, draft("system", "s0")), user(world, 40)])
        for op in [*program, ("drain",)]:
            what, tail_allowed = await step(client, app, conn, world, op)
            event(what)
            for sid in sorted(world.paths):
                # Pages of a few entries for the session the step moved (slow to read
                # for all), whole reads for the others.
                pages = limit if sid == world.current else 1000
                await check_session(
                    client, conn, world, sid, tail_allowed=tail_allowed, limit=pages
                )
            await check_rows(conn, world)
    finally:
        await conn.close()


async def test_a_result_whose_call_a_compaction_cut_off_is_counted_as_shown(
    app: Any, client: httpx.AsyncClient
) -> None:
    config = {
        "compaction": {"summarizer": "extractive", "auto": False, "keep_recent_tokens": 300},
        "prune": {"auto": False},
    }
    await make_session(client, id="cut", context_window=3_500, max_output_tokens=500, config=config)
    opening: list[dict[str, Any]] = [
        {"role": "system", "content": text(20, "s0")},
        {"role": "user", "content": text(40, "u1")},
    ]
    for k in range(2, 5):
        call = f"c{k}"
        opening += [
            {"role": "assistant", "content": text(20, f"a{k}"), "tool_calls": [tool_call(call)]},
            {"role": "tool", "tool_call_id": call, "content": text(500, f"r{k}")},
        ]
    # A call left waiting, then the user moves on: the compaction cuts between them.
    opening += [
        {"role": "assistant", "content": text(20, "a5"), "tool_calls": [tool_call("late")]},
        {"role": "user", "content": text(400, "u6")},
    ]
    await ok(await client.post("/v1/sessions/cut/messages", json={"messages": opening}), 201)
    await ok(await client.post("/v1/sessions/cut/compactions", json={}), 202)
    assert await drain(app) == 1
    ctx = await ok(await client.get("/v1/sessions/cut/context"))
    call_seq = len(opening) - 1
    assert ctx["compaction"]["first_kept_seq"] > call_seq  # the call is before the cut
    late = {"role": "tool", "tool_call_id": "late", "content": text(300, "rlate")}
    await ok(await client.post("/v1/sessions/cut/messages", json={"messages": [late]}), 201)
    session = await ok(await client.get("/v1/sessions/cut"))
    ctx = await ok(await client.get("/v1/sessions/cut/context"))
    breakdown = ctx["tokens"]["breakdown"]
    shown = breakdown["summary"] + breakdown["messages"] + breakdown["tool_outputs"]
    assert shown == session["context_tokens"]
    # Hidden, not lost: the context pairs every call, and the result is stored whole.
    assert check_openai_pairing(ctx["messages"]) == []
    stored = await read_history(client, "cut", 1000)
    assert stored[-1]["message"]["content"] == late["content"]
    assert stored[-1]["tokens"] > 0
    assert session["stored_tokens"] == sum(e["tokens"] for e in stored)
    # Later writes recount the context from the stored rows (a pivot's move, a fork's
    # copy of the window): they agree with the view too.
    more: list[dict[str, Any]] = [
        {"role": "user", "content": text(300, "u8")},
        {"role": "assistant", "content": text(300, "a9")},
        {"role": "user", "content": text(300, "u10")},
    ]
    await ok(await client.post("/v1/sessions/cut/messages", json={"messages": more}), 201)
    leaf = (await ok(await client.get("/v1/sessions/cut")))["entry_count"]
    fork = {"at_seq": leaf, "id": "cut-fork"}
    await ok(await client.post("/v1/sessions/cut/fork", json=fork), 201)
    await ok(await client.post("/v1/sessions/cut/compactions", json={}), 202)
    assert await drain(app) == 1
    for sid in ("cut", "cut-fork"):
        session = await ok(await client.get(f"/v1/sessions/{sid}"))
        ctx = await ok(await client.get(f"/v1/sessions/{sid}/context"))
        assert check_openai_pairing(ctx["messages"]) == []
        breakdown = ctx["tokens"]["breakdown"]
        shown = breakdown["summary"] + breakdown["messages"] + breakdown["tool_outputs"]
        assert shown == session["context_tokens"], sid
