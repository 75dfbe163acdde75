"""Prometheus metrics: what ``/metrics`` shows (and ``compactd worker --metrics-port``).

Counters and histograms are process-wide and live in prometheus_client's default
registry, so the API, the workers and the engine's callers record into the same
place whatever app instance they belong to. Gauges that describe one app's
resources (its database pool) are read at scrape time.

**Many server processes** (``compactd serve --workers N``): a scrape of ``/metrics``
reaches whichever process accepts it, so every process must answer for all of them.
They use prometheus_client's multiprocess mode: the ``serve`` parent points
``PROMETHEUS_MULTIPROC_DIR`` at a folder (:func:`shared_folder`) before it starts its
children, each child's metrics are then kept in files there (prometheus_client reads
the variable when it is first imported, hence before any metric exists), and
``/metrics`` merges the files of every process (:func:`registries`): counters and
histograms summed over the processes, dead ones included (what they counted stays
counted), and the gauges summed over the live ones (``livesum``). A gauge read from
live state at scrape time cannot be shared that way: there each process copies its
pool's figures into ``livesum`` gauges once a second (:func:`sample_pool`), so
``compactd_db_pool_*`` is the sum over the processes, at most a second old. The
``process_*`` and ``python_*`` metrics of the default collectors describe one process
and are left out in this mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Read once, as prometheus_client read it when this module imported it: whether this
# process's metrics live in the shared files.
MULTIPROCESS = bool(os.environ.get(MULTIPROCESS_ENV))
if MULTIPROCESS:
    # The metrics below open their files there as they are made: a folder named but
    # not made yet would fail the import (with a traceback, not a line saying why).
    Path(os.environ[MULTIPROCESS_ENV]).mkdir(parents=True, exist_ok=True)
# How often a server process copies its pool's figures into the shared gauges.
POOL_SAMPLE_SECONDS = 1.0

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_JOB_SECONDS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

HTTP_REQUESTS = Counter(
    "compactd_http_requests",
    "HTTP requests answered, by route template and status.",
    ["method", "route", "status"],
)
HTTP_LATENCY = Histogram(
    "compactd_http_request_duration_seconds",
    "Time from the request's arrival to the end of its response.",
    ["method", "route"],
    buckets=_LATENCY,
)
# Gauges: in multiprocess mode, the sum over the live processes.
HTTP_IN_FLIGHT = Gauge(
    "compactd_http_requests_in_flight",
    "Requests being served now.",
    multiprocess_mode="livesum",
)
HTTP_RECEIVING = Gauge(
    "compactd_http_requests_receiving",
    "Requests whose body is still arriving (they hold a place in the queue, not a slot).",
    multiprocess_mode="livesum",
)
HTTP_WAITING = Gauge(
    "compactd_http_requests_waiting",
    "Requests waiting for a free slot (the bounded queue).",
    multiprocess_mode="livesum",
)
HTTP_REJECTED = Counter(
    "compactd_http_requests_rejected",
    "Requests refused before they ran: queue_full, tenant_queue_full, keyless_queue_full, "
    "bodies_full, tenant_bodies_full, timeout (no slot in time), body_timeout, header_timeout, "
    "header_too_large, trailer_too_large.",
    ["reason"],
)
AUTH_FAILURES = Counter(
    "compactd_auth_failures", "Requests refused for want of a valid API key.", ["reason"]
)

COMPACTION_JOBS = Counter(
    "compactd_compaction_jobs",
    "Compaction job transitions: claimed, retried, released, succeeded, failed, cancelled.",
    ["status", "reason"],
)
COMPACTION_SECONDS = Histogram(
    "compactd_compaction_duration_seconds",
    "From a job's claim (or the emergency path's start) to its commit.",
    ["reason", "summarizer"],
    buckets=_JOB_SECONDS,
)
COMPACTION_TOKENS_SAVED = Counter(
    "compactd_compaction_tokens_saved",
    "Context tokens removed by committed compactions (before minus after).",
    ["reason"],
)
UPSTREAM_CALLS = Counter(
    "compactd_upstream_calls",
    "Calls to the summarizer LLM, by outcome: ok or the failure class.",
    ["api", "outcome"],
)
UPSTREAM_SECONDS = Histogram(
    "compactd_upstream_call_duration_seconds",
    "Upstream LLM call time, whatever the outcome.",
    ["api"],
    buckets=_JOB_SECONDS,
)
# The summarizer's spend (app.engine.accounting.summarizer_spend), counted when the
# compaction or branch summary that spent it commits. No tenant label: tenants are
# not a bounded set (GET /v1/usage answers per tenant); the reason is.
SUMMARIZER_TOKENS = Counter(
    "compactd_summarizer_tokens",
    "Summarizer tokens of committed compactions and branch summaries, by kind: input (the "
    "whole prompt), output, cached (prompt tokens read from the provider's cache, part of "
    "input).",
    ["kind"],
)
for _kind in ("input", "output", "cached"):
    SUMMARIZER_TOKENS.labels(_kind)  # shown at 0 before the first compaction
SUMMARIZER_CALLS = Counter(
    "compactd_summarizer_calls",
    "Requests to the summarizer (upstream or remote) of committed compactions and branch "
    "summaries, failed ones included, by job reason.",
    ["reason"],
)
SUMMARIZER_LIMITED = Counter(
    "compactd_summarizer_limited",
    "Compactions that used the extractive summarizer because their tenant had reached "
    "COMPACTD_SUMMARIZER_TOKENS_PER_TENANT_HOUR, by job reason.",
    ["reason"],
)
PRUNE_RUNS = Counter(
    "compactd_prunes", "Prunes that hid tool outputs, by trigger (auto or manual).", ["trigger"]
)
PRUNED_TOKENS = Counter(
    "compactd_pruned_tokens", "Context tokens saved by pruning, by trigger.", ["trigger"]
)


_pending: ContextVar[list[Callable[[], None]] | None] = ContextVar("observations", default=None)


@contextmanager
def after_commit() -> Iterator[list[Callable[[], None]]]:
    """What the block observes (counts, and log lines about what its transaction did)
    is reported when the block completes, not before: a transaction that rolls back
    reports nothing. Yields the pending list (clear it to drop what an attempt that
    wrote nothing observed)."""
    pending: list[Callable[[], None]] = []
    token = _pending.set(pending)
    try:
        yield pending
    finally:
        _pending.reset(token)
    for report in pending:
        report()


def observe(report: Callable[[], None]) -> None:
    """Report now, or when the enclosing :func:`after_commit` block completes."""
    pending = _pending.get()
    if pending is None:
        report()
    else:
        pending.append(report)


def job(status: str, reason: str) -> None:
    observe(lambda: COMPACTION_JOBS.labels(status, reason).inc())


def committed(reason: str, summarizer: str, seconds: float, before: int, after: int) -> None:
    def report() -> None:
        COMPACTION_JOBS.labels("succeeded", reason).inc()
        COMPACTION_SECONDS.labels(reason, summarizer).observe(seconds)
        COMPACTION_TOKENS_SAVED.labels(reason).inc(max(0, before - after))

    observe(report)


def summarizer_spent(
    reason: str, calls: int, input_tokens: int, output_tokens: int, cached_tokens: int
) -> None:
    """A committed job's summarizer usage."""

    def report() -> None:
        if calls:
            SUMMARIZER_CALLS.labels(reason).inc(calls)
        for kind, value in (
            ("input", input_tokens),
            ("output", output_tokens),
            ("cached", cached_tokens),
        ):
            if value:
                SUMMARIZER_TOKENS.labels(kind).inc(value)

    observe(report)


def summarizer_limited(reason: str) -> None:
    """A compaction the spend limit sent to the extractive summarizer."""
    observe(lambda: SUMMARIZER_LIMITED.labels(reason).inc())


def pruned(trigger: str, tokens: int) -> None:
    def report() -> None:
        PRUNE_RUNS.labels(trigger).inc()
        PRUNED_TOKENS.labels(trigger).inc(tokens)

    observe(report)


_POOL_DOCS = {
    "compactd_db_pool_size": "Connections the pool keeps open.",
    "compactd_db_pool_checked_out": "Connections in use now.",
    "compactd_db_pool_overflow": "Connections open beyond the pool size (negative: not yet opened).",
    "compactd_db_pool_idle": "Open connections waiting in the pool.",
}


def pool_figures(engine: Any) -> dict[str, int]:
    """The pool's figures now, by metric name."""
    pool = engine.pool
    return {
        "compactd_db_pool_size": pool.size(),
        "compactd_db_pool_checked_out": pool.checkedout(),
        "compactd_db_pool_overflow": pool.overflow(),
        "compactd_db_pool_idle": pool.checkedin(),
    }


class PoolCollector(Collector):
    """The SQLAlchemy pool of one engine, read when scraped."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterable[GaugeMetricFamily]:
        for name, value in pool_figures(self.engine).items():
            yield GaugeMetricFamily(name, _POOL_DOCS[name], value=value)


# The pools' figures in multiprocess mode, summed over the live processes. Registered
# nowhere: the shared files are what /metrics reads then (in a single process the
# PoolCollector answers, at scrape time).
_SHARED_POOL = {
    name: Gauge(name, doc, registry=None, multiprocess_mode="livesum")
    for name, doc in _POOL_DOCS.items()
}


async def sample_pool(engine: Any, every: float = POOL_SAMPLE_SECONDS) -> None:
    """Copy ``engine``'s pool figures into the shared gauges every ``every`` seconds,
    until cancelled (multiprocess mode: see the module's docstring)."""
    while True:
        for name, value in pool_figures(engine).items():
            _SHARED_POOL[name].set(value)
        await asyncio.sleep(every)


def app_registry(engine: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PoolCollector(engine))
    return registry


class _SharedFiles(MultiProcessCollector):
    """The shared files' metrics, without the files of a process that is starting: it
    makes its file empty and only then sizes it, and prometheus_client fails the whole
    read on an empty one (``struct.error``: /metrics answered 500 while a server process
    of ``serve --workers N`` was being replaced)."""

    def collect(self) -> Iterable[Any]:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            with contextlib.suppress(OSError):  # gone meanwhile: a dead process's, removed
                if os.path.getsize(path) >= _SMALLEST_FILE:
                    files.append(path)
        merged: Iterable[Any] = self.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
        return merged


# The first 8 bytes of a metrics file say how much of it is used.
_SMALLEST_FILE = 8

_merged: CollectorRegistry | None = None


def registries(app_state: Any) -> list[CollectorRegistry]:
    """What /metrics writes: in multiprocess mode, every process's metrics merged from
    the shared files; else this process's, and its app's pool."""
    global _merged
    if MULTIPROCESS:
        if _merged is None:
            _merged = CollectorRegistry()
            _SharedFiles(_merged)  # type: ignore[no-untyped-call]
        return [_merged]
    own: CollectorRegistry | None = getattr(app_state, "metrics", None)
    return [REGISTRY] if own is None else [REGISTRY, own]


@contextmanager
def shared_folder() -> Iterator[Path]:
    """The folder the server processes of ``serve --workers N`` keep their metrics in,
    named by ``PROMETHEUS_MULTIPROC_DIR`` for the processes started inside the block.
    The operator's folder when the variable is set (its ``*.db`` files, left by an
    earlier run, are deleted first, as prometheus_client requires), else a new
    temporary folder, removed at the end."""
    given = os.environ.get(MULTIPROCESS_ENV)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):
            stale.unlink(missing_ok=True)
        yield folder
        return
    folder = Path(tempfile.mkdtemp(prefix="compactd-metrics-"))
    os.environ[MULTIPROCESS_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(MULTIPROCESS_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def process_ended(pid: int) -> None:
    """A server process has ended: its live gauges stop counting (its counters stay)."""
    folder = os.environ.get(MULTIPROCESS_ENV)
    if folder:
        mark_process_dead(pid, folder)  # type: ignore[no-untyped-call]
