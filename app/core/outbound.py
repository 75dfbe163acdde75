"""Where the process's HTTP requests may go, and the clients that send them.

**One policy for every outbound request** (webhooks, blocking hooks, a session's remote
summarizer, the upstream LLM, the proxy's upstreams):

- link-local and cloud metadata addresses (``169.254.0.0/16``, ``fe80::/10``,
  ``fd00:ec2::254``, ``100.100.100.200``, ``168.63.129.16``, ``192.0.0.192``) are
  refused always, whoever set the URL;
- for a URL a tenant gave (webhooks, hooks, ``compaction.remote_endpoint``), every
  address that is not public is refused too (loopback, private, shared, unspecified,
  multicast, reserved), unless the operator allows it: ``COMPACTD_OUTBOUND_ALLOW`` lists
  hosts (the URL's host name as written) and CIDRs, e.g.
  ``127.0.0.1/32,10.0.0.0/8,receiver.internal``;
- the URLs the operator set (``COMPACTD_UPSTREAM_BASE_URL``,
  ``COMPACTD_PROXY_*_URL``) are trusted with the rest.

It is checked where the connection is made, after the name is resolved: the client's
network backend (:class:`GuardedBackend`) resolves the host, checks every address, and
connects to an address it checked, so a name that answers a public address to a check
and a private one to the connection (DNS rebinding) gains nothing. TLS still names the
URL's host (SNI and certificate check) and the ``Host`` header is the URL's. A refused
address is never dialled; the request fails with a ``ConnectError`` whose cause is
:class:`Refused`. A URL is also checked when it is saved (:func:`url_refusal`, for
what can be seen without resolving a name: an address written in the URL, ``localhost``)
so that most mistakes are a 422 at once.

**One client, and pool, per purpose** (:class:`Outbound`): the webhook deliveries, the
hooks, the summarizer's upstream, the remote summarizers and the proxy each have their
own, so that receivers that hang cannot starve the summarizer, nor one tenant another.
Each :class:`Lane` bounds its requests in flight per tenant and in all (no more than its
pool's connections); a request takes its slot *before* its own timeout starts, so the
wait for a slot is never counted against it, and the pool never has a request waiting for
a connection: a request cancelled while it waited for one could leave its half-made
connection in the pool for good (encode/httpcore#1093, httpcore 1.0.9), and enough of
them wedge the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpcore
import httpx

from app.core.allowlist import Allowance, IPAddress, IPNetwork, parse_allow
from app.core.errors import invalid
from app.core.tls import client_context

if TYPE_CHECKING:
    from app.core.settings import Settings


# Refused always: link-local (where every cloud's instance metadata lives) and the
# metadata services that answer elsewhere (AWS over IPv6, Alibaba, Azure's wire
# server, Oracle's legacy one).
NEVER: Final[tuple[IPNetwork, ...]] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",
        "fe80::/10",
        "fd00:ec2::254/128",
        "100.100.100.200/32",
        "168.63.129.16/32",
        "192.0.0.192/32",
    )
)
_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")


class Refused(httpcore.ConnectError):
    """A connection the outbound policy refused, before any packet was sent. httpx
    raises it as an ``httpx.ConnectError`` (message kept) whose ``__cause__`` is this."""


def refused_cause(exc: BaseException) -> Refused | None:
    """The :class:`Refused` behind ``exc`` (an httpx error), or None."""
    seen = exc
    for _ in range(4):
        if isinstance(seen, Refused):
            return seen
        if seen.__cause__ is None:
            return None
        seen = seen.__cause__
    return None


def _unwrapped(address: IPAddress) -> IPAddress:
    """An IPv6 address that carries an IPv4 one (mapped, NAT64, 6to4) is judged as it."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def refusal(host: str, address: IPAddress, *, trusted: bool, allow: Allowance) -> str | None:
    """Why the policy refuses a connection to ``address`` (``host`` resolved to it), or
    None when it may be made."""
    address = _unwrapped(address)
    if any(address.version == n.version and address in n for n in NEVER):
        return "a link-local or cloud metadata address, never reached"
    if trusted or allow.allows(host, address):
        return None
    if address.is_loopback:
        return "a loopback address (COMPACTD_OUTBOUND_ALLOW can allow it)"
    if address.is_unspecified or address.is_multicast or not address.is_global:
        return (
            "a private, reserved or multicast address, not a public one "
            "(COMPACTD_OUTBOUND_ALLOW can allow it)"
        )
    return None


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


@functools.lru_cache(maxsize=8)
def allowance(value: str) -> Allowance:
    """:func:`parse_allow`, once per setting's value."""
    return parse_allow(value)


def check_tenant_url(field: str, url: object, settings: Settings) -> None:
    """The save-time check of a URL a tenant gives: a 422 naming ``field`` when the
    policy refuses it as written (see :func:`url_refusal`)."""
    if not isinstance(url, str):
        return  # the body's own validation says what is wrong
    why = url_refusal(url, allowance(settings.outbound_allow or ""))
    if why is not None:
        raise invalid(field, why)


def url_refusal(url: str, allow: Allowance) -> str | None:
    """Why a tenant's ``url`` is refused as it is written, or None: the save-time half
    of the check (an address in the URL, ``localhost``); a name is checked when it is
    resolved, at every request."""
    try:
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError:
        return None  # the URL's own check says what is wrong with it
    address = _literal(host)
    if address is None and (host == "localhost" or host.endswith(".localhost")):
        address = ipaddress.IPv4Address("127.0.0.1")
    if address is None:
        return None
    why = refusal(host, address, trusted=False, allow=allow)
    return f"its host {host} is {why}" if why else None


@dataclass
class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend with the policy in it: resolve, check, then connect to
    a checked address (see the module's docstring). ``dialled`` is called with each
    address and port just before a connection to it is attempted (tests count dials)."""

    trusted: bool
    allow: Allowance
    inner: httpcore.AsyncNetworkBackend = field(default_factory=httpcore.AnyIOBackend)
    dialled: list[Callable[[str, int], None]] = field(default_factory=list)

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The addresses ``host`` stands for, in the resolver's order."""
        literal = _literal(host)
        if literal is not None:
            return [literal]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (OSError, UnicodeError) as exc:
            raise httpcore.ConnectError(f"{host} could not be resolved: {exc}") from exc
        found: list[IPAddress] = []
        for info in infos:
            address = _literal(str(info[4][0]))
            if address is not None and address not in found:
                found.append(address)
        return found

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await self.resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"{host} was not resolved in time") from None
        allowed: list[IPAddress] = []
        reasons: list[str] = []
        for address in addresses:
            why = refusal(host, address, trusted=self.trusted, allow=self.allow)
            if why is None:
                allowed.append(address)
            else:
                reasons.append(f"{address} is {why}")
        if not allowed:
            detail = "; ".join(reasons) or "no address"
            raise Refused(f"outbound policy: {host} refused ({detail})")
        failure: Exception | None = None
        for address in allowed:  # each in turn, as the resolver ordered them
            for hook in self.dialled:
                hook(str(address), port)
            try:
                return await self.inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise Refused("outbound policy: unix sockets are not reached")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a pool whose connections :class:`GuardedBackend` makes;
    TLS with the process's one context (:mod:`app.core.tls`). No proxy from the
    environment: the policy judges the addresses actually reached."""

    def __init__(self, backend: GuardedBackend, limits: httpx.Limits) -> None:
        super().__init__(verify=client_context(), limits=limits, trust_env=False)
        self.backend = backend
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=client_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )


def guarded_client(
    *,
    trusted: bool,
    allow: Allowance,
    timeout: httpx.Timeout,
    max_connections: int,
    max_keepalive: int | None = None,
    **options: Any,
) -> httpx.AsyncClient:
    """An httpx client whose every connection follows the policy."""
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections if max_keepalive is None else max_keepalive,
    )
    transport = GuardedTransport(GuardedBackend(trusted=trusted, allow=allow), limits)
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False, **options)


def backend_of(client: httpx.AsyncClient) -> GuardedBackend:
    """The policy's backend under ``client`` (one :func:`guarded_client` made)."""
    transport = client._transport
    assert isinstance(transport, GuardedTransport)
    return transport.backend


class Lane:
    """One purpose's client, with its requests in flight bounded per tenant and in all
    (see the module's docstring)."""

    def __init__(self, name: str, client: httpx.AsyncClient, *, size: int, per_tenant: int):
        self.name = name
        self.client = client
        self.size = size
        self.per_tenant = max(1, min(per_tenant, size))
        self._all = asyncio.Semaphore(size)
        self._tenants: dict[str, asyncio.Semaphore] = {}
        self._busy: dict[str, int] = {}

    @property
    def backend(self) -> GuardedBackend:
        return backend_of(self.client)

    def busy(self, tenant_id: str) -> int:
        """The tenant's requests in flight (or waiting for their slot) in this lane."""
        return self._busy.get(tenant_id, 0)

    @contextlib.asynccontextmanager
    async def slot(self, tenant_id: str) -> AsyncIterator[httpx.AsyncClient]:
        """Wait for a place of the tenant's and one of the lane's, then the client: the
        request's own timeout starts inside."""
        gate = self._tenants.get(tenant_id)
        if gate is None:
            gate = self._tenants[tenant_id] = asyncio.Semaphore(self.per_tenant)
        self._busy[tenant_id] = self._busy.get(tenant_id, 0) + 1
        try:
            async with gate, self._all:
                yield self.client
        finally:
            left = self._busy[tenant_id] - 1
            if left:
                self._busy[tenant_id] = left
            else:  # no state kept for a tenant with nothing in flight
                del self._busy[tenant_id]
                self._tenants.pop(tenant_id, None)


# Connections (and requests in flight) per lane.
WEBHOOK_CONNECTIONS: Final = 32
HOOK_CONNECTIONS: Final = 32
REMOTE_CONNECTIONS: Final = 16


class Outbound:
    """The process's outbound clients, one per purpose (see the module's docstring):
    made at start-up, closed at shutdown."""

    def __init__(self, settings: Settings) -> None:
        allow = allowance(settings.outbound_allow or "")
        per_tenant = settings.outbound_tenant_connections
        self.allow = allow

        def lane(name: str, size: int, seconds: float, *, trusted: bool) -> Lane:
            client = guarded_client(
                trusted=trusted,
                allow=allow,
                # Each call passes its own timeout; the pool never makes one wait (the
                # lane admits no more requests than it has connections).
                timeout=httpx.Timeout(seconds, connect=min(seconds, 10.0)),
                max_connections=size,
                follow_redirects=False,
            )
            return Lane(name, client, size=size, per_tenant=per_tenant)

        upstream = max(4, settings.compaction_workers * 4)
        self.webhooks = lane(
            "webhooks", WEBHOOK_CONNECTIONS, settings.webhook_timeout_seconds, trusted=False
        )
        self.hooks = lane("hooks", HOOK_CONNECTIONS, 30.0, trusted=False)
        self.remote = lane(
            "remote", REMOTE_CONNECTIONS, settings.upstream_timeout_seconds, trusted=False
        )
        self.summarizer = lane(
            "summarizer", upstream, settings.upstream_timeout_seconds, trusted=True
        )
        self.lanes = (self.webhooks, self.hooks, self.remote, self.summarizer)

    def on_dial(self, hook: Callable[[str, int], None]) -> None:
        """Call ``hook(address, port)`` before every connection any lane attempts."""
        for lane in self.lanes:
            lane.backend.dialled.append(hook)

    async def aclose(self) -> None:
        for lane in self.lanes:
            await lane.client.aclose()

    async def __aenter__(self) -> Outbound:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


# --- credentials out of every URL that is shown ------------------------------------

_SECRET_PARAM = re.compile(
    r"(?i)^(.*[-_])?(key|api[-_]?key|apikey|token|access[-_]?token|secret|password|passwd|pwd"
    r"|auth|authorization|signature|sig|credential|credentials|code)$"
)
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()]+")


def redact_url(url: str | httpx.URL) -> str:
    """``url`` without its credentials: the user and password part, and the values of
    query parameters named like a key, token, secret or password, become ``***``."""
    text = str(url)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return re.sub(r"//[^/@\s]*@", "//***@", text)
    netloc = parts.netloc
    if "@" in netloc:
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = "***@" + host + (f":{port}" if port is not None else "")
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAM.match(k) for k, _ in pairs):
            query = urlencode(
                [(k, "***" if _SECRET_PARAM.match(k) else v) for k, v in pairs], safe="*"
            )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_urls(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url`."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
