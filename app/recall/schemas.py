"""API models for recall: a search over a session's whole history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

Role = Literal["system", "developer", "user", "assistant", "tool"]
Kind = Literal["message", "compaction", "continue", "branch_summary"]

MAX_QUERY_CHARS = 500
MAX_LIMIT = 50
MAX_TOOLS = 20
MAX_TOOL_NAME_CHARS = 256


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A search as the service takes it (from the route, or from an agent's tool call)."""

    q: str
    roles: tuple[Role, ...] = ()
    kinds: tuple[Kind, ...] = ()
    tools: tuple[str, ...] = ()
    from_seq: int | None = None
    to_seq: int | None = None
    compaction: uuid.UUID | None = None
    limit: int = 10
    cursor: str | None = None


class SearchHit(BaseModel):
    id: uuid.UUID
    seq: int = Field(description="The entry's depth on its path (the first entry is 1).")
    branch: int = Field(description="The run of seqs that holds it (0: the first).")
    role: str
    kind: str = Field(description="message, compaction, continue or branch_summary.")
    tool_name: str | None = Field(description="The tool whose output it is (tool results).")
    on_path: bool = Field(description="On the path from the root to the active leaf.")
    compacted: bool = Field(
        description="Not in the current context: on the active path before the context's "
        "start (replaced by a summary, and not pinned), a summary a later one replaced, or "
        "off the active path (another branch of the tree)."
    )
    score: float = Field(
        description="Higher is better: 4 and more where the query stands as written (not "
        "inside a longer word; 3 and more in a summary, which lists names many times over), "
        "2 and more where it is inside a longer one, under 2 where only its words match "
        "(stems, any order; the closer together, the higher). A place in a file "
        "(`registry.py:135`, `registry.py line 135`) counts as written however the text "
        'writes it (`registry.py:135:`, `File ".../registry.py", line 135`).'
    )
    snippet: str = Field(
        description="Whole lines of the entry (up to about 600 characters) around its best "
        "matching line, from anywhere in its searchable text (a tool result's starts with a "
        "line naming its call: the tool and `$ <command>` or its arguments): the line of the "
        "query's first place as written, else the line holding the most of its words; a "
        "line or two of "
        "context each side, every character as written (no line numbers added), the "
        "matches marked «like this». A line too long is cut around the match (` … `); a "
        "line `…` stands for lines left out. No match found again: the entry's first lines."
    )


class SearchPage(BaseModel):
    hits: list[SearchHit]
    complete: bool = Field(
        description="Every match was ranked. False when the query matches more entries than "
        "one search ranks (1,000 by its words, 1,000 by substring): the page ranks the first "
        "found; narrow the query or filter by role, tool, kind or seq range. False too while "
        "`pending` is not 0."
    )
    pending: int = Field(
        description="Entries of the session's tree whose text is not searchable yet. An append "
        "writes the searchable text of its first entries, up to 500,000 characters, and leaves "
        "the rest to the worker's indexer, which writes it within seconds (as it does for "
        "entries stored before search existed). 0 but after a very large append."
    )
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page.")
