"""Running an agent's recall tool call (app.recall.agent_tools) for it: a search
(app.recall.service) or a read of stored entries (the path's, or what a compaction
replaced), answered as the tool result text within a token cap."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions.service import CompactionService
from app.core.database import driver_connection
from app.core.errors import NotFound, ProblemError, invalid
from app.engine.accounting import catalog, tokens
from app.engine.compaction.summary import block_label
from app.history.schemas import HistoryEntry
from app.history.service import HistoryService
from app.recall import agent_tools as tools
from app.recall.schemas import SearchHit, SearchQuery
from app.recall.service import RecallService
from app.sessions import service as sessions
from app.store.session_row import read_state


@dataclass(frozen=True, slots=True)
class Ran:
    """A tool call's result: its text within the cap, and the message that carries
    it back to the model in the call's format."""

    call: tools.Call
    content: str
    tokens: int
    truncated: bool
    is_error: bool

    def document(self) -> dict[str, Any]:
        if self.call.format == "anthropic":
            message: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": self.call.id,
                "content": self.content,
                **({"is_error": True} if self.is_error else {}),
            }
        else:
            message = {"role": "tool", "tool_call_id": self.call.id, "content": self.content}
        return {
            "tool_call_id": self.call.id,
            "name": self.call.name,
            "format": self.call.format,
            "is_error": self.is_error,
            "content": self.content,
            "tokens": self.tokens,
            "truncated": self.truncated,
            "message": message,
        }


def _message_text(entry: HistoryEntry) -> str:
    """An entry as one readable block: its seq, role (and tool), then its content."""
    message = entry.message
    head = f"[seq {entry.seq}] {entry.role}"
    if entry.kind != "message":
        head += f" ({entry.kind})"
    name = entry.tool_name if entry.role == "tool" else None
    if name:
        head += f" ({name})"
    body: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        body.append(content)
    elif isinstance(content, list):
        # An image or a document reads as what it is, never as its bytes (the
        # history API gives them back as sent).
        body.extend(
            str(p["text"]) if "text" in p else f"[{label}]" if (label := block_label(p)) else ""
            for p in content
            if isinstance(p, dict)
        )
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        body.append(f"calls {function.get('name')}({function.get('arguments', '')})")
    return f"{head}: " + "\n".join(b for b in body if b)


def _hit_text(hit: SearchHit) -> str:
    where = f"seq {hit.seq}" + ("" if hit.on_path else f", branch {hit.branch}")
    what = hit.role + (f" ({hit.tool_name})" if hit.tool_name else "")
    state = " · compacted" if hit.compacted else ""
    return f"[{where} · {what}{state}] {hit.snippet}"


class ToolCallService:
    """The recall tools of one tenant's sessions."""

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def result_tokens(self, session_id: str) -> int:
        """The session's ``recall.result_tokens``."""
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, self.tenant_id, session_id)
        if state is None:
            raise NotFound(f"session {session_id!r} does not exist")
        return sessions.effective_config(state.config).recall.result_tokens

    async def run(self, session_id: str, raw: Any, max_tokens: int | None) -> Ran:
        try:
            call = tools.read_call(raw)
        except tools.ToolCallError as exc:  # pragma: no cover - read_call raises ValueError
            raise invalid("tool_call", str(exc)) from None
        except ValueError as exc:
            raise invalid("tool_call", str(exc)) from None
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, self.tenant_id, session_id)
        if state is None:
            raise NotFound(f"session {session_id!r} does not exist")
        config = sessions.effective_config(state.config)
        cap = max_tokens if max_tokens is not None else config.recall.result_tokens
        encoding = catalog.lookup(state.model).encoding

        def count(text: str) -> int:
            return tokens.count_text(text, encoding)

        try:
            if call.name == tools.SEARCH:
                blocks, read_on = await self._search(session_id, tools.search_args(call.arguments))
            elif call.name == tools.READ:
                blocks, read_on = await self._read(session_id, tools.read_args(call.arguments))
            else:
                raise tools.ToolCallError(
                    f"unknown tool {call.name!r}: this service answers "
                    f"{tools.SEARCH} and {tools.READ}"
                )
        except tools.ToolCallError as exc:
            text = f"Error: {exc}"
            return Ran(call, text, count(text), False, True)
        except ProblemError as exc:
            text = f"Error: {exc.detail}"
            return Ran(call, text, count(text), False, True)
        done = tools.capped(blocks, cap, count, read_on=read_on)
        return Ran(call, done.text, done.tokens, done.truncated, False)

    async def _search(self, session_id: str, args: tools.SearchArgs) -> tuple[list[str], Any]:
        page = await RecallService(self.engine, self.tenant_id).search(
            session_id,
            SearchQuery(
                q=args.query,
                roles=(args.role,) if args.role else (),  # type: ignore[arg-type]
                kinds=(args.kind,) if args.kind else (),  # type: ignore[arg-type]
                tools=(args.tool,) if args.tool else (),
                from_seq=args.from_seq,
                to_seq=args.to_seq,
                compaction=args.compaction,
                limit=args.limit,
                cursor=args.cursor,
            ),
        )
        indexing = (
            f" [{page.pending} entries are still being indexed: search again in a few seconds "
            "to include them.]"
            if page.pending
            else ""
        )
        if not page.hits:
            return [f"No entry matches {args.query!r}.{indexing}"], lambda i: ""
        blocks = [_hit_text(h) for h in page.hits]
        hits = page.hits

        def read_on(i: int) -> str:
            if i < len(hits):
                return (
                    f"[{len(hits) - i} more hits left out to stay within the result's size: "
                    f"search again with from_seq={hits[i].seq}, or read an entry with "
                    f"{tools.READ}]"
                )
            return ""

        blocks.append(
            f"[Read an entry whole with {tools.READ} and its seq."
            + (
                f" More hits: search again with cursor={page.next_cursor!r}]"
                if page.next_cursor
                else "]"
            )
            + indexing
        )
        return blocks, read_on

    async def _read(self, session_id: str, args: tools.ReadArgs) -> tuple[list[str], Any]:
        after = (args.from_seq or 1) - 1
        compaction: uuid.UUID | None = args.compaction
        if compaction is not None:
            source = await CompactionService(self.engine, self.tenant_id).source(
                session_id,
                compaction,
                after_seq=after,
                limit=tools.READ_LIMIT,
                fmt="openai",
            )
            entries, next_after = source.entries, source.next_after_seq
            if args.to_seq is not None:
                entries = [e for e in entries if e.seq <= args.to_seq]
        else:
            page = await HistoryService(self.engine, self.tenant_id).history(
                session_id,
                after_seq=after,
                limit=tools.READ_LIMIT,
                fmt="openai",
                before_seq=None if args.to_seq is None else args.to_seq + 1,
            )
            entries, next_after = page.entries, page.next_after_seq
        if not entries:
            return ["No entries there."], lambda i: ""
        where = f" and compaction={compaction}" if compaction else ""

        def read_on(i: int) -> str:
            seq = entries[i].seq if i < len(entries) else (next_after or 0) + 1
            return f"[More entries: call {tools.READ} with from_seq={seq}{where}]"

        blocks = [_message_text(e) for e in entries]
        if next_after is not None and (args.to_seq is None or next_after < args.to_seq):
            blocks.append(read_on(len(entries)))
        return blocks, read_on
