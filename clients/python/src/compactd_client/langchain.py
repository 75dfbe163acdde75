"""LangChain's chat message history backed by compactd (``pip install
compactd-client[langchain]``).

:class:`CompactdChatMessageHistory` is a ``BaseChatMessageHistory``: give it where a
LangChain app keeps its history (``RunnableWithMessageHistory``'s
``get_session_history``, or a loop of your own). Its ``messages`` are the *managed*
context (compacted, pruned, within the model's window), so the app sends the model a
context that fits however long the conversation runs; ``add_messages`` appends to the
history, which keeps everything. The messages travel as OpenAI chat messages
(``langchain_core``'s own converters, both ways).

An AI message that carries ``usage_metadata`` (chat models set it) is reported to
compactd as the usage of the model call made on the last context read, once per
context: compactd then counts the window with the provider's own figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    convert_to_messages,
    convert_to_openai_messages,
)

from compactd_client import types as t
from compactd_client._store import StoreSpec, SyncStore
from compactd_client._sync import Compactd

__all__ = ["CompactdChatMessageHistory", "usage_of"]


def usage_of(message: AIMessage) -> dict[str, int] | None:
    """An AI message's ``usage_metadata`` as compactd's native figures (the prompt less
    what was cached, the cache reads and writes, the output); None without one."""
    usage = message.usage_metadata
    if not usage or usage.get("input_tokens", 0) <= 0:
        return None
    details: Mapping[str, Any] = usage.get("input_token_details") or {}
    read = int(details.get("cache_read") or 0)
    written = int(details.get("cache_creation") or 0)
    return {
        "input_tokens": max(0, usage["input_tokens"] - read - written),
        "output_tokens": usage.get("output_tokens", 0),
        "cache_read_tokens": read,
        "cache_write_tokens": written,
    }


class CompactdChatMessageHistory(BaseChatMessageHistory):
    """LangChain's ``BaseChatMessageHistory`` on a compactd session.

    ``session_id`` is the compactd session's id; it is created on first use with
    ``model`` and, when given, ``context_window``, ``max_output_tokens``,
    ``input_limit``, ``config`` and ``metadata`` (an existing one is used as it is).
    ``client``: a :class:`~compactd_client.Compactd` (by default one from ``base_url``
    and ``api_key``, else ``$COMPACTD_URL`` and ``$COMPACTD_API_KEY``; ``close()``
    closes the one it made). ``report_usage``: report the usage of the AI messages
    added (see the module). ``wait_for_compaction``: how long a read waits, when the
    context is past the compaction threshold and a compaction is running, for it to
    finish (seconds; 0 never waits).

    - ``messages``: the managed context; a compaction's summary is a human message at
      its start.
    - ``add_messages(messages)``: appended in one batch (a retry is stored once).
    - ``clear()``: the conversation goes on in a new compactd session; the old one is
      kept whole (see the README).
    - ``pop()``: the last message, which the history keeps (the session's active leaf
      moves back before it). Not part of LangChain's interface.
    """

    def __init__(
        self,
        session_id: str,
        *,
        model: str,
        client: Compactd | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        input_limit: int | None = None,
        config: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        report_usage: bool = True,
        wait_for_compaction: float = 10.0,
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self._owns_client = client is None
        self.client = client or Compactd(base_url, api_key=api_key)
        spec = StoreSpec(
            session_id,
            model,
            context_window=context_window,
            max_output_tokens=max_output_tokens,
            input_limit=input_limit,
            config=config,
            metadata=metadata,
        )
        self._store = SyncStore(self.client, spec)
        self.report_usage = report_usage
        self.wait_for_compaction = wait_for_compaction
        #: The version of the last context read, None before the first.
        self.context_version: int | None = None
        #: The last context read, whole: its ``tokens``, ``state`` and ``compaction``.
        self.last_context: t.Context | None = None
        #: The last usage report's answer (its verdict, and any compaction it started).
        self.last_usage: t.UsageResult | None = None
        self._reported: int | None = None  # the context version last reported

    @property
    def compactd_session_id(self) -> str:
        """The compactd session that holds the conversation now: ``session_id``, or
        after a clear ``<session_id>.<n>``."""
        return self._store.current()

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        context = self._store.context(self.wait_for_compaction)
        self.context_version = context["version"]
        self.last_context = context
        return convert_to_messages(context["messages"])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        sid = self._store.current()
        dicts = convert_to_openai_messages(list(messages), include_id=True)
        self.client.append_messages(sid, [_without_empty_id(m) for m in dicts])
        if not self.report_usage or self.context_version in (None, self._reported):
            return
        for message in messages:
            usage = usage_of(message) if isinstance(message, AIMessage) else None
            if usage is not None:
                # The first reply after the context read is the call made on it.
                self._reported = self.context_version
                self.last_usage = self.client.report_usage(
                    sid, usage, context_version=self.context_version
                )
                return

    def pop(self) -> BaseMessage | None:
        """Take the last message out of the context (the history keeps it)."""
        message = self._store.pop()
        return None if message is None else convert_to_messages([message])[0]

    def clear(self) -> None:
        self._store.clear()
        self.context_version = None

    def close(self) -> None:
        """Close the client, if this history made it."""
        if self._owns_client:
            self.client.close()


def _without_empty_id(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("id") is None:
        message.pop("id", None)
    return message
