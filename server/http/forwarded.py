"""Which address a request comes from when reverse proxies stand in front (X-Forwarded-For).

Each proxy appends the address it received the request from, so the list reads left to right
from the client towards this server; a client can write anything into it before the first
proxy does. Only entries added by proxies this server trusts are believed: walk the list from
the right, starting at the peer of the TCP connection, and stop at the first address that is
not a trusted proxy. That is the client. Several ``X-Forwarded-For`` header lines (HAProxy's
``option forwardfor`` adds one of its own) are one list, in order.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_network(entry: str) -> Network:
    """An address (``10.0.0.5``, ``fd00::1``) or CIDR range (``10.0.0.0/8``) as a network;
    ValueError for anything else (a host name, a typo)."""
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"{entry!r} is neither an IP address nor a CIDR range (e.g. 10.0.0.0/8)"
        ) from None


def _address(entry: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address an X-Forwarded-For entry names (IPv4-mapped IPv6 as IPv4), or None."""
    text = entry.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True)
class TrustedProxies:
    """The reverse proxies (addresses and CIDR ranges) whose X-Forwarded-For is believed."""

    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> TrustedProxies:
        """From ``server.trusted_proxies``; ValueError names an entry that is neither."""
        return cls(tuple(parse_network(entry) for entry in entries))

    def trusts(self, address: str) -> bool:
        """Whether ``address`` is one of the trusted proxies."""
        ip = _address(address)
        return ip is not None and any(ip in network for network in self.networks)

    def client(self, peer: str, forwarded: Sequence[str]) -> str:
        """The client's address: the right-most entry of the X-Forwarded-For lines
        ``forwarded`` that a trusted proxy did not write, or ``peer`` (the TCP peer) when it
        is not a trusted proxy. An entry that is no address ends the walk at the hop that
        wrote it."""
        hops = [entry for line in forwarded for entry in line.split(",")]
        client = peer
        while hops and self.trusts(client):
            ip = _address(hops.pop())
            if ip is None:
                break
            client = str(ip)
        return client
