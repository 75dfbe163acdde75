"""No credential the operator put in an upstream URL reaches an agent or a log line: the
proxy's 502 and 504 name the upstream with its user, password and key-like query
parameters as ``***`` (app.core.outbound.redact_url)."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.e2e.server import running

PASSWORD = "s3cret-pass-9d2f"
QUERY_KEY = "sk-in-query-41c7"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_the_proxy_s_502_names_the_upstream_without_its_credentials(
    db_url: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    port = _closed_port()
    upstream = f"http://agent:{PASSWORD}@127.0.0.1:{port}/v1?key={QUERY_KEY}"
    configured = settings.model_copy(
        update={"proxy_openai_url": upstream, "proxy_anthropic_url": upstream}
    )
    caplog.set_level(logging.DEBUG)
    with running(create_app(configured, database_url=db_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            for path, body in (
                (
                    "/proxy/openai/v1/chat/completions",
                    {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
                ),
                (
                    "/proxy/anthropic/v1/messages",
                    {
                        "model": "claude-sonnet-4-5",
                        "max_tokens": 100,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                ),
            ):
                r = await client.post(
                    path,
                    json=body,
                    headers={"X-Compactd-Session": f"cred-{path.split('/')[2]}"},
                )
                assert r.status_code == 502, r.text
                assert PASSWORD not in r.text
                assert QUERY_KEY not in r.text
                assert f"http://***@127.0.0.1:{port}/v1" in r.text, r.text
                assert "could not be reached" in r.text
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert PASSWORD not in logged
    assert QUERY_KEY not in logged
