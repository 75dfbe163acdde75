"""The synchronous client."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, cast

import httpx

from compactd_client import types as t
from compactd_client._base import (
    RETRYABLE_ERRORS,
    BaseClient,
    SupportsModelDump,
    as_dict,
    drop_none,
    path,
)
from compactd_client.errors import CompactdConnectionError, ProblemError


class Compactd(BaseClient):
    """A compactd client. ``base_url`` defaults to ``$COMPACTD_URL``, else
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
        http_client: httpx.Client | None = None,
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
        self._http = http_client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Compactd:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(
        self,
        method: str,
        url_path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        idempotency_key: str | None = None,
        if_match: int | str | None = None,
        wait: float | None = None,
    ) -> httpx.Response:
        headers = self._headers(method, idempotency_key, if_match)
        timeout = self._timeout(self._http.timeout, wait)
        url = self.base_url + url_path
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, url, params=params, json=json, headers=headers, timeout=timeout
                )
            except RETRYABLE_ERRORS as exc:
                delay = self._delay(attempt, None)
                if delay is None:
                    raise CompactdConnectionError(
                        f"compactd at {self.base_url} did not answer {method} {url_path}: {exc!r}"
                    ) from exc
            else:
                if response.is_success:
                    return response
                delay = self._delay(attempt, response)
                if delay is None:
                    raise ProblemError.from_response(response)
            attempt += 1
            time.sleep(delay)

    def _json(self, method: str, url_path: str, **kwargs: Any) -> Any:
        return self._request(method, url_path, **kwargs).json()

    # Ops

    def healthz(self) -> t.Health:
        """The process is up."""
        return cast(t.Health, self._json("GET", "/healthz"))

    def readyz(self) -> t.Readiness:
        """The database answers and its schema is current (else a 503 ProblemError)."""
        return cast(t.Readiness, self._json("GET", "/readyz"))

    def metrics(self) -> str:
        """The Prometheus metrics, as text."""
        return self._request("GET", "/metrics").text

    # Sessions

    def create_session(
        self,
        model: str,
        *,
        id: str | None = None,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        input_limit: int | None = None,
        config: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> t.Session:
        """Create a session; the window comes from the model catalog unless given."""
        body = drop_none(
            model=model,
            id=id,
            context_window=context_window,
            max_output_tokens=max_output_tokens,
            input_limit=input_limit,
            config=config,
            metadata=metadata,
        )
        return cast(
            t.Session,
            self._json("POST", "/v1/sessions", json=body, idempotency_key=idempotency_key),
        )

    def list_sessions(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> t.SessionPage:
        """A page of sessions in creation order; ``metadata`` filters on exact values."""
        params = drop_none(
            limit=limit,
            cursor=cursor,
            metadata=[f"{k}={v}" for k, v in metadata.items()] if metadata else None,
        )
        return cast(t.SessionPage, self._json("GET", "/v1/sessions", params=params))

    def get_session(self, session_id: str) -> t.Session:
        """The session with its live accounting."""
        return cast(t.Session, self._json("GET", path("/v1/sessions/{}", session_id)))

    def update_session(
        self,
        session_id: str,
        changes: t.SessionChanges,
        *,
        if_match: int | str | None = None,
    ) -> t.Session:
        """PATCH the session: only the keys in ``changes`` change (``input_limit: None``
        goes back to the catalog's; ``config`` is merged, a None in it resets that key)."""
        return cast(
            t.Session,
            self._json(
                "PATCH", path("/v1/sessions/{}", session_id), json=changes, if_match=if_match
            ),
        )

    def delete_session(self, session_id: str, *, if_match: int | str | None = None) -> None:
        """Delete the session and all of its data."""
        self._request("DELETE", path("/v1/sessions/{}", session_id), if_match=if_match)

    # History

    def append_messages(
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
        body = drop_none(messages=list(messages), format=format, system=system, tools=tools)
        return cast(
            t.AppendResult,
            self._json(
                "POST",
                path("/v1/sessions/{}/messages", session_id),
                json=body,
                idempotency_key=idempotency_key,
                if_match=if_match,
            ),
        )

    def list_messages(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        limit: int | None = None,
        format: t.Format | None = None,
    ) -> t.HistoryPage:
        """The whole stored history by seq, pruned and compacted entries included."""
        params = drop_none(after_seq=after_seq, limit=limit, format=format)
        return cast(
            t.HistoryPage,
            self._json("GET", path("/v1/sessions/{}/messages", session_id), params=params),
        )

    def get_context(self, session_id: str, *, format: t.Format | None = None) -> t.Context:
        """The messages to send to the model now (and ``system``, for Anthropic)."""
        return cast(
            t.Context,
            self._json(
                "GET", path("/v1/sessions/{}/context", session_id), params=drop_none(format=format)
            ),
        )

    # Budget

    def get_overflow(self, session_id: str) -> t.Verdict:
        """How full the window is, and what to do about it."""
        return cast(t.Verdict, self._json("GET", path("/v1/sessions/{}/overflow", session_id)))

    def report_usage(
        self,
        session_id: str,
        usage: Mapping[str, Any] | SupportsModelDump,
        *,
        finish_reason: str | None = None,
        context_version: int | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tools_tokens: int | None = None,
        idempotency_key: str | None = None,
    ) -> t.UsageResult:
        """Report a model call's usage, right after the call: the provider SDK's usage
        object as it returns it (``response.usage``, or its dict), the whole response
        (its usage and stop reason are read), or compactd's own figures
        (``input_tokens``, ``output_tokens``, ``cache_read_tokens``...)."""
        body = as_dict(usage) | drop_none(
            finish_reason=finish_reason,
            context_version=context_version,
            tools=tools,
            tools_tokens=tools_tokens,
        )
        return cast(
            t.UsageResult,
            self._json(
                "POST",
                path("/v1/sessions/{}/usage", session_id),
                json=body,
                idempotency_key=idempotency_key,
            ),
        )

    def prune(
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
        body = drop_none(
            dry_run=dry_run,
            protect_tokens=protect_tokens,
            minimum_tokens=minimum_tokens,
            protect_turns=protect_turns,
        )
        return cast(
            t.PruneResult,
            self._json(
                "POST",
                path("/v1/sessions/{}/prune", session_id),
                json=body,
                idempotency_key=idempotency_key,
            ),
        )

    def report_provider_error(
        self,
        session_id: str,
        message: str,
        *,
        status: int | None = None,
        context_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> t.ProviderErrorVerdict:
        """Forward a provider's error; a context overflow starts its relief."""
        body = drop_none(message=message, status=status, context_version=context_version)
        return cast(
            t.ProviderErrorVerdict,
            self._json(
                "POST",
                path("/v1/sessions/{}/overflow-errors", session_id),
                json=body,
                idempotency_key=idempotency_key,
            ),
        )

    # Compactions

    def request_compaction(
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
        body = drop_none(
            instructions=instructions,
            strategy=strategy,
            summarizer=summarizer,
            model=model,
            wait=wait,
        )
        return cast(
            t.Compaction,
            self._json(
                "POST",
                path("/v1/sessions/{}/compactions", session_id),
                json=body,
                idempotency_key=idempotency_key,
                wait=wait,
            ),
        )

    def list_compactions(
        self, session_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> t.CompactionPage:
        """The session's compactions, newest first."""
        return cast(
            t.CompactionPage,
            self._json(
                "GET",
                path("/v1/sessions/{}/compactions", session_id),
                params=drop_none(limit=limit, cursor=cursor),
            ),
        )

    def get_compaction(self, session_id: str, compaction_id: str) -> t.Compaction:
        """One compaction: its status and, when done, its summary."""
        return cast(
            t.Compaction,
            self._json("GET", path("/v1/sessions/{}/compactions/{}", session_id, compaction_id)),
        )

    def cancel_compaction(
        self, session_id: str, compaction_id: str, *, idempotency_key: str | None = None
    ) -> t.Compaction:
        """Cancel a queued compaction, or stop a running one before it commits."""
        return cast(
            t.Compaction,
            self._json(
                "POST",
                path("/v1/sessions/{}/compactions/{}/cancel", session_id, compaction_id),
                idempotency_key=idempotency_key,
            ),
        )

    def compaction_source(
        self,
        session_id: str,
        compaction_id: str,
        *,
        after_seq: int | None = None,
        limit: int | None = None,
        format: t.Format | None = None,
    ) -> t.SourcePage:
        """The entries the compaction replaced, as stored, a page at a time."""
        return cast(
            t.SourcePage,
            self._json(
                "GET",
                path("/v1/sessions/{}/compactions/{}/source", session_id, compaction_id),
                params=drop_none(after_seq=after_seq, limit=limit, format=format),
            ),
        )
