"""The operator's outbound exceptions (``COMPACTD_OUTBOUND_ALLOW``), parsed.

Apart from :mod:`app.core.outbound` so that the settings can check the value at
start-up without importing the HTTP clients (and the clients the settings).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Allowance:
    """The operator's exceptions (``COMPACTD_OUTBOUND_ALLOW``): host names as a URL
    writes them, and networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    def allows(self, host: str, address: IPAddress) -> bool:
        return host.lower().rstrip(".") in self.hosts or any(
            address.version == n.version and address in n for n in self.networks
        )


def parse_allow(value: str) -> Allowance:
    """``COMPACTD_OUTBOUND_ALLOW``: comma- or space-separated hosts and CIDRs (an address
    alone is its own /32 or /128). Raises ValueError naming a bad entry."""
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in re.split(r"[,\s]+", value.strip()):
        if not entry:
            continue
        text = entry.replace("[", "").replace("]", "")  # [fd12::]/16 as well
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
            continue
        except ValueError:
            if "/" in text or text.replace(".", "").isdigit():
                raise ValueError(f"{entry!r} is neither a host name nor a CIDR") from None
        if not re.fullmatch(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?", text):
            raise ValueError(f"{entry!r} is neither a host name nor a CIDR")
        hosts.add(text.lower().rstrip("."))
    return Allowance(frozenset(hosts), tuple(networks))


__all__ = ["Allowance", "IPAddress", "IPNetwork", "parse_allow"]
