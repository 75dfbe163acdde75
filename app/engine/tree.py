"""A session's history as a tree, and the path from its root to the active leaf.

Every entry has a parent: the previous entry on its path. An entry's ``seq`` is
its depth on that path (the root's first entry is seq 1), so every path is the
seqs ``1 .. leaf`` with no gaps, and everything that reasons about a session's
window in seqs (the ledger, pruning, the compaction's cut) works on a path as it
did on a line.

Entries are stored in *branches*: a branch holds a run of consecutive seqs and
starts after an entry of another branch (its fork point), or at the root. A path
is then a short list of segments, one per branch it passes through::

    branch 0: seqs 1..40      (the session as it was first written)
    branch 7: seqs 41..55     (after a navigation back to seq 40)
    branch 9: seqs 56..       (after a navigation back to seq 55 of branch 7)

:class:`Path` is that list. The store turns it into one key condition
(``branch = ANY(branches) AND seq <= ends[position of branch]``): a branch's own
entries start right after its fork point, so the lower end of each segment holds
by itself. A navigation or a fork writes no entry: it makes a new branch whose
path is a prefix of another one, so neither copies storage nor walks the history.

Pure: no database.
"""

from __future__ import annotations

from dataclasses import dataclass

# The end of the open segment (the leaf's branch): any seq the branch may reach.
OPEN = 2**62

ROOT_BRANCH = 0


@dataclass(frozen=True, slots=True)
class Path:
    """The segments from the root: ``branches[i]`` holds the seqs after
    ``ends[i - 1]`` (after 0 for the first) up to ``ends[i]``; the last branch's
    segment is open (``ends`` has one item fewer than ``branches``)."""

    branches: tuple[int, ...] = (ROOT_BRANCH,)
    ends: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.branches or len(self.ends) != len(self.branches) - 1:
            raise ValueError("a path has one end fewer than it has branches")
        if len(set(self.branches)) != len(self.branches):
            raise ValueError("a path passes through a branch once")
        if any(b >= a for a, b in zip(self.ends[1:], self.ends, strict=False)) or any(
            e < 0 for e in self.ends
        ):
            raise ValueError("a path's segment ends grow")

    @property
    def leaf_branch(self) -> int:
        """The branch the next entry on this path is written to."""
        return self.branches[-1]

    def branch_of(self, seq: int) -> int:
        """The branch that holds the path's entry ``seq``."""
        for branch, end in zip(self.branches, self.ends, strict=False):
            if seq <= end:
                return branch
        return self.branches[-1]

    def holds(self, branch: int, seq: int) -> bool:
        """Whether the entry ``seq`` of ``branch`` is on this path (the open segment
        holds every seq of its branch)."""
        return seq >= 1 and self.branch_of(seq) == branch

    def segments(self, lo: int, hi: int) -> tuple[list[int], list[int]]:
        """The branches holding the path's seqs ``lo <= seq < hi``, and the last
        seq each holds there (arrays for the store's key condition; the open
        segment ends at ``hi - 1``). Empty when the range is."""
        branches: list[int] = []
        ends: list[int] = []
        start = 1
        for branch, end in zip(self.branches, (*self.ends, OPEN), strict=True):
            last = min(end, hi - 1)
            if last >= max(start, lo):
                branches.append(branch)
                ends.append(last)
            start = end + 1
            if start >= hi:
                break
        return branches, ends

    def prefix(self, seq: int) -> Prefix:
        """The path up to its entry ``seq`` (at least 1), with the last segment
        closed at ``seq``: :meth:`Prefix.then` opens a branch after it."""
        if seq < 1:
            raise ValueError("a prefix holds at least the first entry")
        branches: list[int] = []
        ends: list[int] = []
        for branch, end in zip(self.branches, (*self.ends, OPEN), strict=True):
            branches.append(branch)
            if seq <= end:
                ends.append(seq)
                return Prefix(tuple(branches), tuple(ends))
            ends.append(end)
        raise AssertionError("unreachable: the open segment holds every seq")

    def common_depth(self, other: Path) -> int:
        """The deepest seq two paths share (0: none): they hold the same entries
        while they pass through the same branches with the same ends. Two paths
        open on the same branch share it whole (:data:`OPEN`): the caller caps
        the answer at its leaves."""
        depth = 0
        mine = zip(self.branches, (*self.ends, OPEN), strict=True)
        theirs = zip(other.branches, (*other.ends, OPEN), strict=True)
        for (a, end_a), (b, end_b) in zip(mine, theirs, strict=False):
            if a != b:
                return depth
            if end_a != end_b:
                return min(end_a, end_b)
            depth = end_a
        return depth


@dataclass(frozen=True, slots=True)
class Prefix:
    """A closed path: the segments up to some entry, the last one ending there."""

    branches: tuple[int, ...]
    ends: tuple[int, ...]

    @property
    def depth(self) -> int:
        return self.ends[-1]

    def then(self, branch: int) -> Path:
        """The prefix followed by the open segment of ``branch``."""
        return Path((*self.branches, branch), self.ends)

    def reopen(self) -> Path:
        """The prefix with its last branch open again (writing on after its last
        entry, as when the leaf goes back to the tip of a branch)."""
        return Path(self.branches, self.ends[:-1])
