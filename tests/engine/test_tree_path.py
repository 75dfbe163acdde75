"""app.engine.tree against an explicit model of the tree.

Random programs of appends, navigations (to any seq of any path seen so far, the
way the service moves a leaf: along the landing's branch when the session writes
it and the landing is its tip, else on a new branch) and forks build a family of
branches. The model keeps every branch's fork point, tip and owner, and for each
path the entries it holds, seq by seq, as ``(branch, seq)``; every :class:`Path`
and :class:`Prefix` the program makes is checked against it: which branch holds
each seq, the store's key condition (``segments``) selecting exactly the seqs
asked for, once each, prefixes, the depth two paths share, ``holds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.tree import OPEN, ROOT_BRANCH, Path, Prefix

Entry = tuple[int, int]  # (branch, seq)


@dataclass
class Branch:
    parent: Entry | None  # the entry it starts after (None: the root branch)
    owner: int  # the session that writes it
    path: Path  # the path that leads to it, as the branch row keeps it
    tip: int  # its last seq (its fork point's while it holds none)

    @property
    def fork_seq(self) -> int:
        return 0 if self.parent is None else self.parent[1]


@dataclass(frozen=True)
class Snapshot:
    """A path as some session followed it at some time: its leaf and its entries."""

    path: Path
    leaf: int
    entries: tuple[Entry, ...]


@dataclass
class Family:
    branches: dict[int, Branch] = field(default_factory=dict)
    sessions: dict[int, Snapshot] = field(default_factory=dict)
    seen: list[Snapshot] = field(default_factory=list)  # every path ever followed

    def __post_init__(self) -> None:
        self.branches[ROOT_BRANCH] = Branch(None, 0, Path(), 0)
        self.follow(0, Snapshot(Path(), 0, ()))
        self.next_branch = ROOT_BRANCH + 1

    def follow(self, session: int, snap: Snapshot) -> None:
        self.sessions[session] = snap
        self.seen.append(snap)

    def stored(self) -> set[Entry]:
        return {
            (b, seq)
            for b, branch in self.branches.items()
            for seq in range(branch.fork_seq + 1, branch.tip + 1)
        }

    def chain(self, leaf: Entry | None) -> tuple[Entry, ...]:
        """The entries from the root to ``leaf``, walking the parents."""
        out: list[Entry] = []
        while leaf is not None:
            b, seq = leaf
            branch = self.branches[b]
            out.extend((b, s) for s in range(seq, branch.fork_seq, -1))
            leaf = branch.parent
        return tuple(reversed(out))

    # --- the operations, as the service does them ---------------------------------

    def append(self, session: int, n: int) -> None:
        snap = self.sessions[session]
        leaf_branch = self.branches[snap.path.leaf_branch]
        # A session writes only at the tip of the branch it is open on.
        assert leaf_branch.tip == snap.leaf
        assert leaf_branch.owner == session
        added = tuple((snap.path.leaf_branch, snap.leaf + i) for i in range(1, n + 1))
        leaf_branch.tip = snap.leaf + n
        self.follow(session, Snapshot(snap.path, snap.leaf + n, snap.entries + added))

    def move(self, session: int, prefix: Prefix, entries: tuple[Entry, ...], fork: bool) -> None:
        """Land on the last of ``entries`` (the prefix's path): go on along its branch
        when the session writes it and it is its tip, else start a new branch."""
        b, seq = entries[-1]
        landing = self.branches[b]
        if not fork and landing.owner == session and landing.tip == seq:
            path = prefix.reopen()
        else:
            new = self.next_branch
            self.next_branch += 1
            path = prefix.then(new)
            self.branches[new] = Branch((b, seq), session, path, seq)
        self.follow(session, Snapshot(path, seq, entries))


# --- the checks -----------------------------------------------------------------


def check_path(family: Family, snap: Snapshot) -> None:
    path, leaf, entries = snap.path, snap.leaf, snap.entries
    assert len(entries) == leaf
    assert [seq for _, seq in entries] == list(range(1, leaf + 1))
    assert entries == family.chain(entries[-1] if entries else None)
    # A path never passes through a branch twice, and its segments' ends grow.
    assert len(set(path.branches)) == len(path.branches)
    assert list(path.ends) == sorted(set(path.ends))
    assert len(path.ends) == len(path.branches) - 1
    assert all(1 <= end <= leaf for end in path.ends)
    for b, seq in entries:
        assert path.branch_of(seq) == b
    # holds: the path's entries, and every later seq of the open branch.
    on_path = set(entries)
    for b, seq in family.stored() | {(path.leaf_branch, leaf + 1), (ROOT_BRANCH, 0)}:
        expected = (b, seq) in on_path or (seq > leaf and b == path.leaf_branch)
        assert path.holds(b, seq) == expected, (b, seq)
    assert not path.holds(path.leaf_branch, 0)
    assert not path.holds(path.branches[0], -1)


def check_segments(family: Family, snap: Snapshot, lo: int, hi: int) -> None:
    """The store's key condition for ``lo <= seq < hi`` picks exactly the path's
    entries there, one per seq (the open segment: what its branch holds)."""
    path, leaf, entries = snap.path, snap.leaf, snap.entries
    branches, ends = path.segments(lo, hi)
    assert len(branches) == len(ends)
    assert len(set(branches)) == len(branches)
    assert ends == sorted(set(ends))
    assert all(max(lo, 1) <= end < hi for end in ends)
    assert all(b in path.branches for b in branches)
    selected = {
        (b, seq)
        for b, seq in family.stored()
        if lo <= seq < hi and b in branches and seq <= ends[branches.index(b)]
    }
    expected = {entries[seq - 1] for seq in range(max(lo, 1), min(hi, leaf + 1))}
    tip = family.branches[path.leaf_branch].tip
    expected |= {(path.leaf_branch, seq) for seq in range(max(lo, leaf + 1), min(hi, tip + 1))}
    assert selected == expected, (path, lo, hi)
    assert len({seq for _, seq in selected}) == len(selected)


def truncate_to(prefix: Prefix, seq: int) -> Prefix:
    """The prefix up to its entry ``seq``: cut shorter, a prefix is the prefix of
    the path it was cut from (the service never shortens one, so this lives here)."""
    return prefix.reopen().prefix(seq)


def check_prefixes(family: Family, snap: Snapshot) -> None:
    path, leaf, entries = snap.path, snap.leaf, snap.entries
    with pytest.raises(ValueError, match="at least the first"):
        path.prefix(0)
    for k in range(1, leaf + 1):
        prefix = path.prefix(k)
        assert prefix.depth == k
        assert prefix.branches[-1] == entries[k - 1][0]
        # A prefix is the path cut at k: the same segments before its last one.
        n = len(prefix.branches)
        assert prefix.branches == path.branches[:n]
        assert prefix.ends[:-1] == path.ends[: n - 1]
        closed = prefix.reopen()
        for b, seq in entries[:k]:
            assert closed.branch_of(seq) == b
        # Every path through an entry has the same prefix there: the one its
        # branch's row keeps (what a navigation by entry id takes).
        b = entries[k - 1][0]
        assert family.branches[b].path.prefix(k) == prefix
        for j in {1, (k + 1) // 2, k}:
            assert truncate_to(prefix, j) == path.prefix(j)
        # The depth it shares with the path it was cut from: all of it.
        assert min(prefix.reopen().common_depth(path), k, leaf) == k


def shared(a: tuple[Entry, ...], b: tuple[Entry, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_common(one: Snapshot, other: Snapshot) -> None:
    depth = one.path.common_depth(other.path)
    assert depth == other.path.common_depth(one.path)
    assert min(depth, one.leaf, other.leaf) == shared(one.entries, other.entries), (one, other)


# --- the programs ---------------------------------------------------------------

OPS = st.sampled_from(["append", "append", "navigate", "navigate", "fork", "switch"])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_paths_follow_the_tree_they_were_made_in(data: st.DataObject) -> None:
    family = Family()
    family.append(0, data.draw(st.integers(1, 4), label="first append"))
    current = 0
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        op = data.draw(OPS)
        snap = family.sessions[current]
        if op == "append":
            family.append(current, data.draw(st.integers(1, 4)))
        elif op == "switch":
            current = data.draw(st.sampled_from(sorted(family.sessions)))
        else:
            # A random path seen so far (another session's, an old one of this
            # one's), a random entry on it; by seq on that path, or by the entry's
            # own branch row (a navigation by entry id).
            target = data.draw(st.sampled_from([s for s in family.seen if s.leaf]))
            k = data.draw(st.integers(1, target.leaf))
            by_id = data.draw(st.booleans())
            b = target.entries[k - 1][0]
            prefix = family.branches[b].path.prefix(k) if by_id else target.path.prefix(k)
            if op == "fork":
                current = len(family.sessions)
            family.move(current, prefix, target.entries[:k], fork=op == "fork")
        snap = family.sessions[current]
        check_path(family, snap)
        check_prefixes(family, snap)
        lo = data.draw(st.integers(0, snap.leaf + 2))
        hi = data.draw(st.integers(0, snap.leaf + 3))
        check_segments(family, snap, lo, hi)
        check_segments(family, snap, 1, OPEN)
        check_segments(family, snap, 1, snap.leaf + 1)
        for other in family.sessions.values():
            check_common(snap, other)
        check_common(snap, data.draw(st.sampled_from(family.seen)))
    # Every path ever followed still reads what it held: entries never move.
    for snap in family.seen:
        check_path(family, snap)
        for lo in range(0, snap.leaf + 2):
            check_segments(family, snap, lo, snap.leaf + 1)


def test_a_path_refuses_what_is_not_a_path() -> None:
    with pytest.raises(ValueError, match="one end fewer"):
        Path((0, 1), ())
    with pytest.raises(ValueError, match="once"):
        Path((0, 1, 0), (2, 4))
    with pytest.raises(ValueError, match="grow"):
        Path((0, 1, 2), (4, 4))
    with pytest.raises(ValueError, match="one end fewer"):
        Path((), ())


def test_a_worked_tree() -> None:
    """The module docstring's example: 0 holds 1..40, 7 holds 41..55, 9 from 56."""
    path = Path((0, 7, 9), (40, 55))
    assert [path.branch_of(s) for s in (1, 40, 41, 55, 56, 10_000)] == [0, 0, 7, 7, 9, 9]
    assert path.segments(30, 60) == ([0, 7, 9], [40, 55, 59])
    assert path.segments(45, 50) == ([7], [49])
    assert path.segments(56, 56) == ([], [])
    assert path.prefix(50) == Prefix((0, 7), (40, 50))
    assert path.prefix(50).then(11) == Path((0, 7, 11), (40, 50))
    assert path.prefix(55).reopen() == Path((0, 7), (40,))
    assert path.common_depth(Path((0, 7, 11), (40, 50))) == 50
    assert path.common_depth(Path((0, 8), (40,))) == 40
    assert path.common_depth(Path((1,), ())) == 0
