"""The asynchronous client: the same methods as :class:`Compactd`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from compactd_client import _calls as calls
from compactd_client import types as t
from compactd_client._base import RETRYABLE_ERRORS, BaseClient
from compactd_client._calls import Call, SupportsModelDump
from compactd_client._events import AsyncEventStream

T = TypeVar("T")


class AsyncCompactd(BaseClient):
    """An asyncio compactd client. ``base_url`` defaults to ``$COMPACTD_URL``, else
    ``http://127.0.0.1:8080``; ``api_key`` to ``$COMPACTD_API_KEY`` (none: an open
    server). Failed requests are retried ``max_retries`` times (connection errors, 429
    and 5xx, after ``Retry-After``); each POST carries one ``Idempotency-Key`` for all
    its attempts. Errors raise :class:`~compactd_client.ProblemError`."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_retry_after: float = 60.0,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(
            base_url,
            api_key=api_key,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            max_retry_after=max_retry_after,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncCompactd:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        """Send ``call``, again after each retryable failure, and read its answer."""
        request = self._build_request(self._http, call)
        attempt = 0
        while True:
            try:
                response = await self._http.send(request)
            except RETRYABLE_ERRORS as exc:
                delay = self._retry_delay(call, attempt, exc)
            else:
                if response.is_success:
                    return call.decode(response)
                delay = self._retry_delay(call, attempt, response)
            attempt += 1
            await asyncio.sleep(delay)

    # Ops

    async def healthz(self) -> t.Health:
        """The process is up."""
        return await self._send(calls.healthz())

    async def readyz(self) -> t.Readiness:
        """The database answers and its schema is current (else a 503 ProblemError)."""
        return await self._send(calls.readyz())

    async def metrics(self) -> str:
        """The Prometheus metrics, as text."""
        return await self._send(calls.metrics())

    # Sessions

    async def create_session(
        self,
        model: str,
        *,
        id: str | None = None,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        input_limit: int | None = None,
        config: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> t.Session:
        """Create a session; the window comes from the model catalog unless given.
        ``parent_id``: the session this one is a side conversation of (422 if none)."""
        return await self._send(
            calls.create_session(
                model,
                id=id,
                context_window=context_window,
                max_output_tokens=max_output_tokens,
                input_limit=input_limit,
                config=config,
                metadata=metadata,
                parent_id=parent_id,
                idempotency_key=idempotency_key,
            )
        )

    async def list_sessions(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
        parent_id: str | None = None,
    ) -> t.SessionPage:
        """A page of sessions in creation order; ``metadata`` filters on exact values,
        ``parent_id`` keeps that session's children (its side conversations)."""
        return await self._send(
            calls.list_sessions(limit=limit, cursor=cursor, metadata=metadata, parent_id=parent_id)
        )

    async def get_session(self, session_id: str) -> t.Session:
        """The session with its live accounting."""
        return await self._send(calls.get_session(session_id))

    async def update_session(
        self,
        session_id: str,
        changes: t.SessionChanges,
        *,
        if_match: int | str | None = None,
    ) -> t.Session:
        """PATCH the session: only the keys in ``changes`` change (``input_limit: None``
        goes back to the catalog's; ``config`` is merged, a None in it resets that key)."""
        return await self._send(calls.update_session(session_id, changes, if_match=if_match))

    async def delete_session(self, session_id: str, *, if_match: int | str | None = None) -> None:
        """Delete the session and all of its data."""
        await self._send(calls.delete_session(session_id, if_match=if_match))

    # History

    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[t.Message],
        *,
        format: t.Format | None = None,
        system: str | Sequence[Mapping[str, Any]] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        idempotency_key: str | None = None,
        if_match: int | str | None = None,
    ) -> t.AppendResult:
        """Append messages (OpenAI's, or Anthropic's with ``format="anthropic"``) in one
        batch. A retry of this call is stored once."""
        return await self._send(
            calls.append_messages(
                session_id,
                messages,
                format=format,
                system=system,
                tools=tools,
                idempotency_key=idempotency_key,
                if_match=if_match,
            )
        )

    async def list_messages(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        limit: int | None = None,
        format: t.Format | None = None,
    ) -> t.HistoryPage:
        """The whole stored history by seq, pruned and compacted entries included."""
        return await self._send(
            calls.list_messages(session_id, after_seq=after_seq, limit=limit, format=format)
        )

    async def get_context(self, session_id: str, *, format: t.Format | None = None) -> t.Context:
        """The messages to send to the model now (and ``system``, for Anthropic)."""
        return await self._send(calls.get_context(session_id, format=format))

    # Budget

    async def get_overflow(self, session_id: str) -> t.Verdict:
        """How full the window is, and what to do about it."""
        return await self._send(calls.get_overflow(session_id))

    async def get_usage(self) -> t.TenantUsage:
        """What compaction cost and saved the key's tenant (summarizer calls and tokens,
        compactions, saved tokens), since the start and this hour."""
        return await self._send(calls.get_usage())

    async def report_usage(
        self,
        session_id: str,
        usage: Mapping[str, Any] | SupportsModelDump | object,
        *,
        finish_reason: str | None = None,
        context_version: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tools_tokens: int | None = None,
        format: t.Format | None = None,
        idempotency_key: str | None = None,
    ) -> t.UsageResult:
        """Report a model call's usage, right after the call: the provider SDK's usage
        object as it returns it (``response.usage``, or its dict), the whole response
        (its usage and stop reason are read), or compactd's own figures
        (``input_tokens``, ``output_tokens``, ``cache_read_tokens``...). ``format``: the
        session's message format (checked: ``openai`` or ``anthropic``); the figures'
        own shape is recognised from their fields."""
        return await self._send(
            calls.report_usage(
                session_id,
                usage,
                finish_reason=finish_reason,
                context_version=context_version,
                tools=tools,
                tools_tokens=tools_tokens,
                format=format,
                idempotency_key=idempotency_key,
            )
        )

    async def prune(
        self,
        session_id: str,
        *,
        dry_run: bool | None = None,
        protect_tokens: int | None = None,
        minimum_tokens: int | None = None,
        protect_turns: int | None = None,
        idempotency_key: str | None = None,
    ) -> t.PruneResult:
        """Hide old tool outputs from the model (or, ``dry_run``, say which)."""
        return await self._send(
            calls.prune(
                session_id,
                dry_run=dry_run,
                protect_tokens=protect_tokens,
                minimum_tokens=minimum_tokens,
                protect_turns=protect_turns,
                idempotency_key=idempotency_key,
            )
        )

    async def report_provider_error(
        self,
        session_id: str,
        message: str,
        *,
        status: int | None = None,
        context_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> t.ProviderErrorVerdict:
        """Forward a provider's error; a context overflow starts its relief."""
        return await self._send(
            calls.report_provider_error(
                session_id,
                message,
                status=status,
                context_version=context_version,
                idempotency_key=idempotency_key,
            )
        )

    # Compactions

    async def request_compaction(
        self,
        session_id: str,
        *,
        instructions: str | None = None,
        strategy: t.Strategy | None = None,
        summarizer: t.Summarizer | None = None,
        model: str | None = None,
        wait: float | None = None,
        idempotency_key: str | None = None,
    ) -> t.Compaction:
        """Compact the history in the background (``wait`` seconds for the result); a
        session with one queued or running gets that one."""
        return await self._send(
            calls.request_compaction(
                session_id,
                instructions=instructions,
                strategy=strategy,
                summarizer=summarizer,
                model=model,
                wait=wait,
                idempotency_key=idempotency_key,
            )
        )

    async def list_compactions(
        self, session_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> t.CompactionPage:
        """The session's compactions, newest first."""
        return await self._send(calls.list_compactions(session_id, limit=limit, cursor=cursor))

    async def get_compaction(self, session_id: str, compaction_id: str) -> t.Compaction:
        """One compaction: its status and, when done, its summary."""
        return await self._send(calls.get_compaction(session_id, compaction_id))

    async def cancel_compaction(
        self, session_id: str, compaction_id: str, *, idempotency_key: str | None = None
    ) -> t.Compaction:
        """Cancel a queued compaction, or stop a running one before it commits."""
        return await self._send(
            calls.cancel_compaction(session_id, compaction_id, idempotency_key=idempotency_key)
        )

    async def compaction_source(
        self,
        session_id: str,
        compaction_id: str,
        *,
        after_seq: int | None = None,
        limit: int | None = None,
        format: t.Format | None = None,
    ) -> t.SourcePage:
        """The entries the compaction replaced, as stored, a page at a time."""
        return await self._send(
            calls.compaction_source(
                session_id, compaction_id, after_seq=after_seq, limit=limit, format=format
            )
        )

    # Tree

    async def get_tree(
        self, session_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> t.TreePage:
        """A page of the session's tree, every branch, in (branch, seq) order; the
        active leaf and path marked."""
        return await self._send(calls.get_tree(session_id, limit=limit, cursor=cursor))

    async def navigate(
        self,
        session_id: str,
        *,
        entry_id: str | None = None,
        seq: int | None = None,
        summarize: bool | None = None,
        instructions: str | None = None,
        idempotency_key: str | None = None,
        if_match: int | str | None = None,
    ) -> t.NavigateResult:
        """Move the active leaf to an entry of the session's tree (``entry_id``, or
        ``seq`` on the active path): the next append goes after it. With ``summarize``
        the abandoned branch is summarized first (``status`` ``"pending"``, the job in
        ``branch_summary``) and the leaf moves once it is. A retry of this call moves
        once."""
        return await self._send(
            calls.navigate(
                session_id,
                entry_id=entry_id,
                seq=seq,
                summarize=summarize,
                instructions=instructions,
                idempotency_key=idempotency_key,
                if_match=if_match,
            )
        )

    async def fork(
        self,
        session_id: str,
        *,
        at_seq: int | None = None,
        id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> t.Session:
        """A new session whose history is this one's active path up to ``at_seq`` (its
        leaf by default), sharing its storage. A retry of this call forks once."""
        return await self._send(
            calls.fork(
                session_id,
                at_seq=at_seq,
                id=id,
                metadata=metadata,
                idempotency_key=idempotency_key,
            )
        )

    # Recall

    async def search(
        self,
        session_id: str,
        q: str,
        *,
        role: Sequence[t.Role] | None = None,
        tool: Sequence[str] | None = None,
        kind: Sequence[t.EntryKind] | None = None,
        from_seq: int | None = None,
        to_seq: int | None = None,
        compaction: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> t.SearchPage:
        """Search the session's whole history (every branch, compacted and pruned entries,
        tool calls and outputs), best first, each hit with a snippet and its place.
        ``q``: words (any form), or an identifier, path or phrase as written; ``role``,
        ``tool`` and ``kind`` filter on any of their values, ``from_seq``/``to_seq`` on a
        seq range, ``compaction`` on the entries that compaction replaced."""
        return await self._send(
            calls.search(
                session_id,
                q,
                role=role,
                tool=tool,
                kind=kind,
                from_seq=from_seq,
                to_seq=to_seq,
                compaction=compaction,
                limit=limit,
                cursor=cursor,
            )
        )

    async def get_tools(self, *, format: t.Format | None = None) -> t.ToolDefinitions:
        """The recall tools (``history_search``, ``history_read``) to add to the agent's
        own, in the provider's format (``openai`` by default)."""
        return await self._send(calls.get_tools(format=format))

    async def run_tool_call(
        self,
        session_id: str,
        tool_call: Mapping[str, Any] | SupportsModelDump,
        *,
        max_tokens: int | None = None,
    ) -> t.ToolCallResult:
        """Run the model's call of a recall tool, as the model produced it (an OpenAI
        ``tool_calls`` item or an Anthropic ``tool_use`` block, the SDK's object or its
        dict); the result within ``max_tokens`` (default: the session's
        ``config["recall"]["result_tokens"]``), ``result["message"]`` ready to append."""
        return await self._send(calls.run_tool_call(session_id, tool_call, max_tokens=max_tokens))

    # Events

    async def events(
        self,
        session_id: str,
        *,
        after: str | None = None,
        last_event_id: str | None = None,
    ) -> AsyncEventStream:
        """The session's events as they happen (verdict changes, prunes, compactions
        queued, started, retrying, succeeded, failed and cancelled, navigations, hook
        calls: docs/events.md), from every retained one, or after ``last_event_id`` (or
        ``after``: an event id, or ``"now"`` for only those to come). Connects now (a
        missing session raises ``NotFoundError`` here); iterate over the stream, and
        close it when done. A dropped connection is resumed after the last event read:
        none lost or repeated."""
        return await self._stream(calls.session_events(session_id, after=after), last_event_id)

    async def tenant_events(
        self,
        *,
        types: Sequence[str] | None = None,
        after: str | None = None,
        last_event_id: str | None = None,
    ) -> AsyncEventStream:
        """Every event of the tenant's sessions (and the tenant's own, such as
        ``webhook.disabled``), of ``types`` only if given, as :meth:`events` has them."""
        return await self._stream(calls.tenant_events(types=types, after=after), last_event_id)

    async def _stream(self, call: Call[None], last_event_id: str | None) -> AsyncEventStream:
        stream = AsyncEventStream(self, self._http, call, last_event_id)
        await stream.open()
        return stream

    # Webhooks

    async def create_webhook(
        self,
        url: str,
        *,
        types: Sequence[str] | None = None,
        session_id: str | None = None,
        hook: bool = False,
        timeout_seconds: float | None = None,
        description: str | None = None,
        idempotency_key: str | None = None,
    ) -> t.WebhookCreated:
        """Subscribe ``url`` to the tenant's events: of ``types`` (``compaction.*`` for
        a family; default: all), of ``session_id``'s only if given. With ``hook`` it is
        a blocking hook, called before a compaction or a navigation (``types``: the
        points) and waited for up to ``timeout_seconds``. The answer's ``secret`` signs
        the deliveries (check them with :func:`~compactd_client.verify_webhook`); it is
        shown this once. (A retry after a lost answer may create a second webhook:
        ``list_webhooks`` shows it.)"""
        return await self._send(
            calls.create_webhook(
                url,
                types=types,
                session_id=session_id,
                hook=hook,
                timeout_seconds=timeout_seconds,
                description=description,
                idempotency_key=idempotency_key,
            )
        )

    async def list_webhooks(self) -> t.WebhookList:
        """The tenant's webhooks, oldest first (at most 100 exist)."""
        return await self._send(calls.list_webhooks())

    async def get_webhook(self, webhook_id: str) -> t.Webhook:
        """One webhook: whether it is enabled, its failures in a row and why it was
        disabled."""
        return await self._send(calls.get_webhook(webhook_id))

    async def update_webhook(self, webhook_id: str, *, enabled: bool) -> t.Webhook:
        """Enable a webhook again (after it was disabled for failing: its failure count
        starts over), or pause it (``enabled=False``)."""
        return await self._send(calls.update_webhook(webhook_id, enabled=enabled))

    async def delete_webhook(self, webhook_id: str) -> None:
        """Delete a webhook; its pending deliveries are skipped."""
        await self._send(calls.delete_webhook(webhook_id))

    async def test_webhook(
        self, webhook_id: str, *, idempotency_key: str | None = None
    ) -> t.Delivery:
        """Queue a signed ``webhook.test`` delivery to an enabled webhook; the answer is
        that delivery (``pending``), and the delivery log shows how it went."""
        return await self._send(calls.test_webhook(webhook_id, idempotency_key=idempotency_key))

    async def list_deliveries(
        self, webhook_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> t.DeliveryPage:
        """A page of the webhook's delivery log, newest first: each delivery's event,
        status (pending, succeeded, failed, skipped), attempts and the receiver's last
        answer."""
        return await self._send(calls.list_deliveries(webhook_id, limit=limit, cursor=cursor))
