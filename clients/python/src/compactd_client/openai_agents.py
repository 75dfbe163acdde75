"""A session store for the OpenAI Agents SDK backed by compactd (``pip install
compactd-client[agents]``).

:class:`CompactdSession` implements the SDK's ``Session`` protocol: pass it as
``Runner.run(agent, input, session=CompactdSession(...))``. Its ``get_items`` returns the
*managed* context (compacted, pruned, within the model's window), so each run starts
from a context that fits; ``add_items`` appends the run's items to the history, which
keeps everything. The SDK's items (Responses API input items) are stored one chat
message each, as compactd's Responses proxy stores them (see
:mod:`compactd_client.responses_items`). After a run, ``await
session.report_usage(result)`` gives compactd the provider's figures for that context
(or pass ``hooks=session.hooks()`` to ``Runner.run``, which reports them by itself).

The module imports nothing of the SDK but in :meth:`CompactdSession.hooks`: the protocol
is structural.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from compactd_client import types as t
from compactd_client._async import AsyncCompactd
from compactd_client._store import AsyncStore, StoreSpec
from compactd_client.responses_items import items_to_messages, messages_to_items

__all__ = ["CompactdSession"]


def _as_dict(item: Any) -> Mapping[str, Any]:
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped: Mapping[str, Any] = dump(exclude_unset=True)
        return dumped
    raise TypeError(f"an item must be a dict, got {type(item).__name__}")


class CompactdSession:
    """The OpenAI Agents SDK ``Session`` protocol on a compactd session.

    ``session_id`` is the compactd session's id; it is created on first use with
    ``model`` and, when given, ``context_window``, ``max_output_tokens``, ``input_limit``,
    ``config`` and ``metadata`` (an existing one is used as it is). ``client``: an
    :class:`~compactd_client.AsyncCompactd` (by default one from ``base_url`` and
    ``api_key``, else ``$COMPACTD_URL`` and ``$COMPACTD_API_KEY``; ``aclose()`` closes the
    one it made). ``custom_tools``: the names of the agent's free-form (``custom``)
    tools. ``wait_for_compaction``: how long ``get_items`` waits, when the context is past
    the compaction threshold and a compaction is running, for it to finish (seconds; 0
    never waits).

    - ``get_items(limit)``: the managed context as the SDK's input items (the last
      ``limit`` of them). A compaction's summary is a user message at its start.
    - ``add_items(items)``: appended in one batch (a retry is stored once).
    - ``pop_item()``: the last message's item; the history keeps it (the session's
      active leaf moves back before it, see the README).
    - ``clear_session()``: the conversation goes on in a new compactd session; the old
      one is kept whole (see the README).
    """

    session_settings: Any = None

    def __init__(
        self,
        session_id: str,
        *,
        model: str,
        client: AsyncCompactd | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        input_limit: int | None = None,
        config: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        custom_tools: Iterable[str] = (),
        wait_for_compaction: float = 10.0,
        session_settings: Any = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self._owns_client = client is None
        self.client = client or AsyncCompactd(base_url, api_key=api_key)
        spec = StoreSpec(
            session_id,
            model,
            context_window=context_window,
            max_output_tokens=max_output_tokens,
            input_limit=input_limit,
            config=config,
            metadata=metadata,
        )
        self._store = AsyncStore(self.client, spec)
        self.custom_tools = frozenset(custom_tools)
        self.wait_for_compaction = wait_for_compaction
        #: The version of the last context ``get_items`` returned (its usage report's
        #: ``context_version``), None before the first.
        self.context_version: int | None = None
        #: The last context read, whole: its ``tokens``, ``state`` and ``compaction``.
        self.last_context: t.Context | None = None
        #: The last usage report's answer (its verdict, and any compaction it started).
        self.last_usage: t.UsageResult | None = None
        self._reported: int | None = None  # the context version last reported
        # A context was read and the run's input not appended yet: the SDK saves the
        # input before its first model call, whose prompt is that context plus it.
        self._input_pending = False

    async def compactd_session_id(self) -> str:
        """The compactd session that holds the conversation now: ``session_id``, or after
        a clear ``<session_id>.<n>``."""
        return await self._store.current()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        context = await self._store.context(self.wait_for_compaction)
        self.context_version = context["version"]
        self.last_context = context
        self._input_pending = True
        items = messages_to_items(context["messages"], custom_tools=self.custom_tools)
        if limit is not None:
            return items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: list[Any]) -> None:
        if not items:
            return
        messages = items_to_messages(_as_dict(item) for item in items)
        sid = await self._store.current()
        await self.client.append_messages(sid, messages)
        if self._input_pending:
            # The run's input, saved before its first model call: that call's prompt is
            # the context read plus this input, which the context read again now is (and
            # compactd records it as served), so its usage is reported against it.
            self._input_pending = False
            context = await self.client.get_context(sid, format="openai")
            self.context_version = context["version"]
            self.last_context = context

    async def pop_item(self) -> Any | None:
        message = await self._store.pop()
        if message is None:
            return None
        items = messages_to_items([message], custom_tools=self.custom_tools)
        return items[-1] if items else None

    async def clear_session(self) -> None:
        await self._store.clear()
        self.context_version = None
        self._input_pending = False

    async def report_usage(self, result: Any) -> t.UsageResult | None:
        """Report a run's usage to compactd: ``result`` is what ``Runner.run`` returned
        (or a ``ModelResponse``, or the SDK's ``Usage``). The figures are those of the
        run's first model call, the one whose input was the context ``get_items``
        returned plus the run's new input (the context read again once the SDK saved
        that input), sent with that context's version; the
        calls after it in the same run sent the run's own items too, which compactd
        counts from the history. Once per context read: None when this context's usage
        was reported already (by :meth:`hooks`, say), or the run made no model call."""
        responses = getattr(result, "raw_responses", None)
        if responses is not None:
            if not responses:
                return None
            result = responses[0]
        body = _usage_body(getattr(result, "usage", result))
        if body is None or self.context_version is None:
            return None
        if self.context_version == self._reported:
            return None
        self._reported = self.context_version
        sid = await self._store.current()
        self.last_usage = await self.client.report_usage(
            sid, body, finish_reason="stop", context_version=self.context_version
        )
        return self.last_usage

    def hooks(self) -> Any:
        """Run hooks (the SDK's ``RunHooks``) that report each run's usage by
        themselves: ``Runner.run(agent, input, session=session, hooks=session.hooks())``.
        They report the first model call after each context read, as
        :meth:`report_usage` does (the answer in ``session.last_usage``). To keep hooks
        of your own, call ``report_usage`` from their ``on_llm_end`` instead."""
        from agents import RunHooks

        session = self

        class _ReportUsage(RunHooks[Any]):
            async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
                await session.report_usage(response)

        return _ReportUsage()

    async def aclose(self) -> None:
        """Close the client, if this session made it."""
        if self._owns_client:
            await self.client.aclose()


def _usage_body(usage: Any) -> dict[str, Any] | None:
    """The SDK's ``Usage`` as the Responses API's usage object (which compactd reads)."""
    if isinstance(usage, Mapping):
        return dict(usage)
    input_tokens = getattr(usage, "input_tokens", None)
    if not isinstance(input_tokens, int) or input_tokens <= 0:
        return None
    output_tokens = int(getattr(usage, "output_tokens", 0) or 0)
    cached = getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", 0) or 0
    reasoning = getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", 0) or 0
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": int(cached)},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": int(reasoning)},
        "total_tokens": input_tokens + output_tokens,
    }
