"""Where a proxied call goes on when its history departs from the stored one: the rules
of conversations an agent did not plan as one.

An agent names one session (``X-Compactd-Session``) for everything it sends, but not
everything it sends is one conversation: Claude Code asks for a title on the same
headers (no tools, its own system prompt, one user message), often before its real
first call; OpenCode asks its small model for one; a subagent (Claude Code's Task tool)
is a conversation with another first message; and agents compact or edit their own
history. Such a call's history is not the stored one followed by new messages. Once
the "sent again" rule has had its say (a request that is the stored history less its
last reply gets that reply: :func:`app.engine.proxy.history.replays`), the call goes
on as one of three (:func:`place`):

- ``branch``: the request shares its first ``k >= 1`` messages with the stored history
  and then departs from it (an edit, the agent's own compaction, a rewind, a shorter
  history). The session's path moves to the last shared message and the call goes on
  from there, on a new branch of the session's tree; the old branch stays stored.
- ``side``: its first message differs: another conversation of the same agent. It
  goes to a child session of the named one (``parent_id``), whose id is derived from
  the named session and the first message (:func:`child_id`), so that the same side
  conversation's next calls land in the same child.
- ``takeover``: as ``side``, but the stored conversation is *provisional* and the call
  declares tools: the stored conversation came only from calls that declared no tools
  and holds one exchange (:func:`provisional`), so it was a side conversation that came
  first (a title request before the real first call). It moves to a child session, and
  the named session starts again, on a new root branch of its tree, with this call.

Pure: the caller reads the stored entries and the session's facts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from app.engine.model import Entry

# A child's id: the parent's id, cut to leave room, then ":" and this many hex digits
# of the digest of (the parent's id, its creation, the first message's first entry).
CHILD_HEX = 12
MAX_SESSION_ID = 128
_PARENT_CHARS = MAX_SESSION_ID - 1 - CHILD_HEX

Placement = Literal["branch", "side", "takeover"]


def child_id(parent_id: str, parent_created_at: datetime, first: bytes) -> str:
    """The id of the named session's child whose first message's first entry has the
    digest ``first`` (:func:`app.engine.proxy.history.digest`):
    ``<parent id, at most 115 characters>:<12 hex digits>``, a valid session id (the
    parent's starts with a letter or digit, the rest are letters, digits and ``:``).
    The parent's creation time is in the digest, so that a session deleted and made
    again under the same id does not meet the children of the one it replaced (they
    are kept, parentless)."""
    h = hashlib.sha256()
    for part in (parent_id.encode(), parent_created_at.isoformat().encode(), first):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return f"{parent_id[:_PARENT_CHARS]}:{h.hexdigest()[:CHILD_HEX]}"


# The most message entries a provisional conversation holds: its user messages and
# one reply. The caller reads one more, to tell a longer conversation.
PROVISIONAL_ENTRIES = 4


def provisional(stored: Sequence[Entry], tools_declared: bool) -> bool:
    """Whether the stored conversation (its first message entries, more than
    :data:`PROVISIONAL_ENTRIES` when there are more) may give way to another: it came
    only from calls that declared no tools (``tools_declared`` false) and is one
    exchange: user messages (OpenCode's title request sends its instruction and the
    conversation's first words as two) and at most one reply, with no tool call."""
    if tools_declared or not 1 <= len(stored) <= PROVISIONAL_ENTRIES:
        return False
    *asked, last = stored
    if last.role == "assistant":
        if not asked or last.tool_calls():
            return False
    else:
        asked = list(stored)
    return all(e.role == "user" for e in asked)


def declares_tools(body: dict[str, Any]) -> bool:
    """Whether a request declares tools (a non-empty ``tools``)."""
    tools = body.get("tools")
    return isinstance(tools, list) and len(tools) > 0


def place(shared_messages: int, provisional: bool, declares_tools: bool) -> Placement:
    """Where a call whose history departs from the stored one after its first
    ``shared_messages`` messages goes on (see the module's docstring)."""
    if shared_messages >= 1:
        return "branch"
    return "takeover" if provisional and declares_tools else "side"
