"""Prometheus metrics: what ``/metrics`` shows (and ``compactd worker --metrics-port``).

Counters and histograms are process-wide and live in prometheus_client's default
registry, so the API, the workers and the engine's callers record into the same
place whatever app instance they belong to. Gauges that describe one app's
resources (its database pool, the job queue) are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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
HTTP_IN_FLIGHT = Gauge("compactd_http_requests_in_flight", "Requests being served now.")
HTTP_RECEIVING = Gauge(
    "compactd_http_requests_receiving",
    "Requests whose body is still arriving (they hold a place in the queue, not a slot).",
)
HTTP_WAITING = Gauge(
    "compactd_http_requests_waiting", "Requests waiting for a free slot (the bounded queue)."
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


def pruned(trigger: str, tokens: int) -> None:
    def report() -> None:
        PRUNE_RUNS.labels(trigger).inc()
        PRUNED_TOKENS.labels(trigger).inc(tokens)

    observe(report)


class PoolCollector(Collector):
    """The SQLAlchemy pool of one engine, read when scraped."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterable[GaugeMetricFamily]:
        pool = self.engine.pool
        metrics = {
            "compactd_db_pool_size": ("Connections the pool keeps open.", pool.size()),
            "compactd_db_pool_checked_out": ("Connections in use now.", pool.checkedout()),
            "compactd_db_pool_overflow": (
                "Connections open beyond the pool size (negative: not yet opened).",
                pool.overflow(),
            ),
            "compactd_db_pool_idle": ("Open connections waiting in the pool.", pool.checkedin()),
        }
        for name, (doc, value) in metrics.items():
            yield GaugeMetricFamily(name, doc, value=value)


def app_registry(engine: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PoolCollector(engine))
    return registry


def registries(app_state: Any) -> list[CollectorRegistry]:
    own: CollectorRegistry | None = getattr(app_state, "metrics", None)
    return [REGISTRY] if own is None else [REGISTRY, own]
