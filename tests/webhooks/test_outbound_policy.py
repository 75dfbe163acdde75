"""The outbound policy (app.core.outbound): where tenants' URLs and the operator's
upstreams may connect, checked when a URL is saved and again after its name is resolved.

No test here sends a packet off this machine: every client is watched through the
policy's own dial hook, which fails the test when a refused address is dialled, and
stops (before any socket) the one connection to a private address that the operator's
setting allows. Real deliveries go only to the loopback receivers the tests start."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import httpcore
import httpx
import pytest

from app.core.allowlist import parse_allow
from app.core.outbound import (
    Outbound,
    Refused,
    redact_url,
    refusal,
    url_refusal,
)
from app.core.settings import Settings
from app.upstream import signing
from app.upstream.client import UpstreamConfig, UpstreamError, complete
from app.upstream.remote import RemoteEndpoint, summarize_remote
from app.webhooks.dispatcher import Dispatcher
from tests.conftest import TEST_SETTINGS
from tests.upstream_server import Upstream
from tests.webhooks.receiver import Answer, Inbox
from tests.webhooks.support import create_webhook, delivery_log, fast, pending

METADATA = (
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.100.100.200/latest/meta-data/",
    "http://[::ffff:169.254.169.254]/latest/meta-data/",
    "http://[fe80::1]:8080/",
)
CLOSED = (
    "http://127.0.0.1:9/hook",
    "http://[::1]:9/hook",
    "http://10.20.30.40:9/hook",
    "http://192.168.1.1/hook",
    "http://172.16.0.1/hook",
    "http://100.64.0.1/hook",  # shared address space (carrier-grade NAT)
    "http://0.0.0.0:9/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
)
NO_ALLOWANCE = TEST_SETTINGS.model_copy(update={"outbound_allow": ""})


class Dials:
    """The dial hook: every address a client was about to connect to; ``forbid``
    raises (failing the request, and the test that expects it to succeed) before any
    socket is opened, ``stop`` likewise ends the attempt there, as a connect error."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def forbid(self, address: str, port: int) -> None:
        self.seen.append((address, port))
        raise AssertionError(f"dialled {address}:{port}, which the policy should refuse")

    def stop(self, address: str, port: int) -> None:
        self.seen.append((address, port))
        raise httpcore.ConnectError(f"test: {address}:{port} allowed, not dialled")

    def record(self, address: str, port: int) -> None:
        self.seen.append((address, port))


def _watched(settings: Settings, hook: Callable[[str, int], None]) -> Outbound:
    outbound = Outbound(settings)
    outbound.on_dial(hook)
    return outbound


async def _post(client: httpx.AsyncClient, url: str) -> signing.Sent:
    return await signing.post(client, url, signing.new_secret(), "m1", b"{}", 2.0)


# --- the policy itself -------------------------------------------------------------


def test_the_operator_setting_reads_hosts_and_networks() -> None:
    allow = parse_allow(" 127.0.0.1/32, 10.0.0.0/8 receiver.internal,::1,[fd12::]/16 ")
    assert allow.hosts == frozenset({"receiver.internal"})
    assert [str(n) for n in allow.networks] == [
        "127.0.0.1/32",
        "10.0.0.0/8",
        "::1/128",
        "fd12::/16",
    ]
    for bad in ("10.0.0.0/33", "300.1.2.3", "a b/c", "http://x"):
        with pytest.raises(ValueError, match="neither a host name nor a CIDR"):
            parse_allow(bad)
    with pytest.raises(ValueError, match="outbound_allow"):
        Settings(outbound_allow="10.0.0.0/40")


def test_which_addresses_are_refused_for_whom() -> None:
    none = parse_allow("")
    allow = parse_allow("127.0.0.1/32,10.0.0.0/8,169.254.0.0/16,receiver.internal")

    def why(host: str, address: str, *, trusted: bool = False, allowed: Any = none) -> Any:
        return refusal(host, ipaddress.ip_address(address), trusted=trusted, allow=allowed)

    # Metadata and link-local: for everyone, whatever the operator allows.
    for address in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "fe80::1"):
        assert "metadata" in why("h", address)
        assert "metadata" in why("h", address, trusted=True)
        assert "metadata" in why("receiver.internal", address, allowed=allow)
    assert "metadata" in why("h", "::ffff:169.254.169.254", trusted=True)  # IPv4-mapped
    assert "metadata" in why("h", "64:ff9b::a9fe:a9fe", trusted=True)  # NAT64 of it
    # Loopback and private: refused to tenants, unless allowed; fine for the operator's.
    assert "loopback" in why("h", "127.0.0.1")
    assert "loopback" in why("h", "::ffff:127.0.0.1")
    assert "private" in why("h", "10.1.2.3")
    assert "private" in why("h", "192.168.0.1")
    assert "private" in why("h", "0.0.0.0")
    assert "private" in why("h", "224.0.0.1")
    assert why("h", "127.0.0.1", allowed=allow) is None
    assert why("h", "10.1.2.3", allowed=allow) is None
    assert "private" in why("h", "192.168.0.1", allowed=allow)
    assert why("receiver.internal", "192.168.0.1", allowed=allow) is None  # by its name
    assert why("h", "10.1.2.3", trusted=True) is None
    assert why("h", "127.0.0.1", trusted=True) is None
    # Public addresses are for everyone.
    assert why("h", "93.184.215.14") is None
    assert why("h", "2606:4700::1111") is None


def test_what_a_saved_url_shows_is_checked_then() -> None:
    none = parse_allow("")
    assert "loopback" in (url_refusal("http://localhost:8080/x", none) or "")
    assert "loopback" in (url_refusal("http://LOCALHOST./x", none) or "")
    assert "loopback" in (url_refusal("http://api.localhost/x", none) or "")
    assert "metadata" in (url_refusal("http://169.254.169.254/", parse_allow("0.0.0.0/0")) or "")
    assert url_refusal("http://localhost:8080/x", parse_allow("127.0.0.1/32")) is None
    # A name is resolved at every request, not when it is saved.
    assert url_refusal("https://hooks.example.com/x", none) is None


# --- through the clients, watched --------------------------------------------------


async def test_metadata_is_refused_before_any_connection_even_for_trusted_upstreams() -> None:
    dials = Dials()
    everything = NO_ALLOWANCE.model_copy(
        update={"outbound_allow": "0.0.0.0/0,::/0,169.254.0.0/16,fe80::/10"}
    )
    async with _watched(everything, dials.forbid) as outbound:
        for lane in outbound.lanes:
            for url in METADATA:
                sent = await _post(lane.client, url)
                assert sent.status is None, (lane.name, url)
                assert sent.error is not None
                assert "outbound policy" in sent.error, sent.error
                assert "metadata" in sent.error, sent.error
    assert dials.seen == []


async def test_loopback_and_private_addresses_are_refused_to_tenants_without_the_setting() -> None:
    dials = Dials()
    async with _watched(NO_ALLOWANCE, dials.forbid) as outbound:
        for lane in (outbound.webhooks, outbound.hooks, outbound.remote):
            for url in CLOSED:
                sent = await _post(lane.client, url)
                assert sent.error is not None, (url, sent)
                assert "outbound policy" in sent.error, (url, sent)
    assert dials.seen == []


async def test_a_private_address_the_operator_allows_is_dialled() -> None:
    dials = Dials()
    allowing = NO_ALLOWANCE.model_copy(update={"outbound_allow": "10.0.0.0/8"})
    async with _watched(allowing, dials.stop) as outbound:
        sent = await _post(outbound.webhooks.client, "http://10.20.30.40:9/hook")
        assert sent.error is not None, sent
        assert "allowed, not dialled" in sent.error, sent
        # Beside it, what the setting does not name stays refused.
        other = await _post(outbound.webhooks.client, "http://192.168.1.1:9/hook")
        assert other.error is not None
        assert "outbound policy" in other.error
    assert dials.seen == [("10.20.30.40", 9)]


async def test_a_name_is_judged_by_the_addresses_it_resolves_to(inbox: Inbox) -> None:
    inbox.always("named", Answer(204))
    port = inbox.url("named").split(":")[2].split("/")[0]
    url = inbox.url("named").replace("127.0.0.1", "localhost")
    dials = Dials()
    async with _watched(NO_ALLOWANCE, dials.forbid) as outbound:
        sent = await _post(outbound.webhooks.client, url)
    assert sent.error is not None, sent
    assert "outbound policy: localhost refused" in sent.error, sent
    assert "127.0.0.1 is a loopback address" in sent.error
    assert dials.seen == []
    assert inbox.received("named") == []
    # Allowed by the operator's setting, the same name reaches the receiver, at the
    # address that was checked.
    seen = Dials()
    async with _watched(TEST_SETTINGS, seen.record) as outbound:
        sent = await _post(outbound.webhooks.client, url)
    assert sent.status == 204, sent
    assert ("127.0.0.1", int(port)) in seen.seen
    assert all(ipaddress.ip_address(a).is_loopback for a, _ in seen.seen)
    assert len(inbox.received("named")) == 1


async def test_the_operator_s_upstream_may_be_on_loopback(upstream: Upstream) -> None:
    dials = Dials()
    async with _watched(NO_ALLOWANCE, dials.record) as outbound:
        config = UpstreamConfig(base_url=upstream.url, api="openai", timeout_seconds=10)
        done = await complete(outbound.summarizer.client, config, model="m", system="s", prompt="p")
    assert done.text
    assert dials.seen
    assert all(ipaddress.ip_address(a).is_loopback for a, _ in dials.seen)


async def test_a_refused_remote_endpoint_is_a_client_error_not_retried(upstream: Upstream) -> None:
    dials = Dials()
    async with _watched(NO_ALLOWANCE, dials.forbid) as outbound:
        endpoint = RemoteEndpoint(url=f"{upstream.url}/summarize", timeout_seconds=5)
        with pytest.raises(UpstreamError) as caught:
            await summarize_remote(outbound.remote.client, endpoint, system="s", prompt="p")
    assert caught.value.kind == "client"
    assert caught.value.retryable is False
    assert "loopback" in str(caught.value)
    assert dials.seen == []
    assert upstream.requests == []


# --- through the API and the dispatcher --------------------------------------------


@pytest.fixture
def settings() -> Settings:
    return NO_ALLOWANCE  # the app's: no address beyond the public ones for tenants


async def test_urls_the_policy_refuses_are_422_when_saved(client: httpx.AsyncClient) -> None:
    for url in (*METADATA, *CLOSED, "http://localhost:8080/hook"):
        r = await client.post("/v1/webhooks", json={"url": url})
        assert r.status_code == 422, (url, r.text)
        problem = r.json()
        assert problem["errors"][0]["field"] == "url", problem
        assert "address" in problem["errors"][0]["detail"], problem
    r = await client.post(
        "/v1/sessions",
        json={
            "model": "gpt-4o",
            "config": {"compaction": {"remote_endpoint": "http://169.254.169.254/summarize"}},
        },
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "config.compaction.remote_endpoint"
    r = await client.post("/v1/sessions", json={"model": "gpt-4o", "id": "s"})
    assert r.status_code == 201, r.text
    r = await client.patch(
        "/v1/sessions/s",
        json={"config": {"compaction": {"remote_endpoint": "http://10.0.0.7:8000/summarize"}}},
    )
    assert r.status_code == 422, r.text
    # A public name passes (it is resolved at every request, never here).
    made = await create_webhook(client, url="https://hooks.example.com/compactd")
    assert made["url"] == "https://hooks.example.com/compactd"


async def test_a_webhook_saved_while_allowed_is_refused_at_delivery_once_it_is_not(
    db_url: str, inbox: Inbox
) -> None:
    """The check that counts is the one made at each delivery, after the name is
    resolved: a receiver on loopback saved while the operator allowed it gets nothing
    once the setting no longer does, and no connection is made."""
    from app.main import create_app

    allowed = create_app(TEST_SETTINGS, database_url=db_url)
    async with allowed.router.lifespan_context(allowed):
        transport = httpx.ASGITransport(app=allowed)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            hook = await create_webhook(
                client, url=inbox.url("r").replace("127.0.0.1", "localhost")
            )
            r = await client.post(f"/v1/webhooks/{hook['id']}/test")
            assert r.is_success, r.text
            dials = Dials()
            strict = fast(outbound_allow="", webhook_max_attempts=1)
            async with _watched(strict, dials.forbid) as outbound:
                dispatcher = Dispatcher(allowed.state.engine, outbound.webhooks, strict)
                assert await dispatcher.run_once() == 1
            assert await pending(allowed) == 0
            assert dials.seen == []
            assert inbox.received("r") == []
            [delivery] = await delivery_log(client, hook["id"])
            assert delivery["status"] == "failed"
            assert "outbound policy: localhost refused" in delivery["last_error"]


def test_refused_is_a_connect_error_for_httpx() -> None:
    assert issubclass(Refused, httpcore.ConnectError)


def test_credentials_are_taken_out_of_urls() -> None:
    assert redact_url("https://user:hunter2@llm.internal:8443/v1?key=abc&model=x") == (
        "https://***@llm.internal:8443/v1?key=***&model=x"
    )
    assert redact_url("http://[::1]:9/v1?api_key=s3&token=t&x_api_key=k") == (
        "http://[::1]:9/v1?api_key=***&token=***&x_api_key=***"
    )
    assert redact_url("https://api.openai.com/v1") == "https://api.openai.com/v1"
