"""WHIP (RFC 9725) protocol values, free of I/O: trickle ICE SDP fragments (RFC 8840),
entity-tags of a resource's ICE session, and ICE servers as ``Link`` headers.

This server answers after ICE gathering completes (no server-side trickle), accepts the
client's trickled candidates through ``PATCH`` and refuses ICE restarts with 422 (RFC 9725
section 4.3.1: a session supporting trickle but not restarts answers restarts so).

A remote candidate is an address the server will send STUN checks to, so the client's say is
bounded: :class:`CandidateFilter` drops candidates the server should never contact (multicast,
broadcast, unspecified, DNS names; and, by policy, addresses more local than the client's own,
e.g. loopback for a client on the internet), and :class:`CandidateBudget` caps the distinct
candidates of one session, offer and trickle together.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from server.errors import BadRequest, PayloadTooLarge, UnprocessableContent
from server.rtc.ice import IceServer

SDP_TYPE = "application/sdp"
SDPFRAG_TYPE = "application/trickle-ice-sdpfrag"
CANDIDATE_TRANSPORTS = ("udp", "tcp")
MDNS_SUFFIX = ".local"  # a browser's hidden host address (draft-ietf-mmusic-mdns-ice-candidates)


@dataclass(frozen=True)
class MediaFragment:
    """One media section of a fragment: its ``mid`` (or index) and the candidates in it.

    ``candidates`` are attribute values without ``a=``, e.g. ``candidate:1 1 udp ...``.
    """

    mline_index: int
    mid: str | None = None
    candidates: tuple[str, ...] = ()
    end_of_candidates: bool = False


@dataclass(frozen=True)
class SdpFragment:
    """A parsed ``application/trickle-ice-sdpfrag`` body."""

    ufrag: str | None
    pwd: str | None
    media: tuple[MediaFragment, ...] = field(default_factory=tuple)

    @property
    def candidate_count(self) -> int:
        return sum(len(m.candidates) for m in self.media)


def check_candidate(value: str) -> str:
    """A ``candidate:`` attribute value of the shape aiortc can parse; BadRequest otherwise."""
    bits = value.split()
    try:
        ok = (
            len(bits) >= 8
            and bits[0].startswith("candidate:")
            and len(bits[0]) > len("candidate:")
            and 1 <= int(bits[1]) <= 256
            and bits[2].lower() in CANDIDATE_TRANSPORTS
            and 0 <= int(bits[3]) < 2**32
            and 0 <= int(bits[5]) <= 65535
            and bits[6] == "typ"
        )
    except ValueError:
        ok = False
    if not ok:
        raise BadRequest(f"malformed ICE candidate: {value[:120]!r}")
    return value


class Scope(IntEnum):
    """How far an address reaches, most local first."""

    LOOPBACK = 0  # this machine
    LINK_LOCAL = 1  # this link (169.254/16, fe80::/10)
    PRIVATE = 2  # any other non-global unicast: RFC 1918, ULA, carrier-grade NAT, ...
    GLOBAL = 3  # the public internet


def address_scope(host: str) -> Scope | None:
    """The scope of an IP address literal; None for what no ICE check should go to (multicast,
    broadcast, unspecified, reserved) and for anything that is not an IP address."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified:
        return None
    if ip.is_loopback:
        return Scope.LOOPBACK
    if ip.is_link_local:
        return Scope.LINK_LOCAL
    if ip.is_reserved:  # 240/4 with 255.255.255.255, IPv6's unassigned blocks
        return None
    return Scope.GLOBAL if ip.is_global else Scope.PRIVATE


def candidate_address(value: str) -> str:
    """The connection address of a checked ``candidate:`` value (see check_candidate)."""
    return value.split()[4]


@dataclass(frozen=True)
class CandidateFilter:
    """Which remote candidates the server may contact: IP addresses of scope ``floor`` or
    wider, and mDNS names when ``floor`` admits private addresses (such a name stands for a
    host on the client's network). Never multicast, broadcast, unspecified or DNS names."""

    floor: Scope

    @classmethod
    def for_client(cls, policy: str, client_address: str) -> CandidateFilter:
        """``policy`` (``transport.private_candidates``): ``allow`` every scope, ``drop`` all
        but global, ``auto`` none more local than the client's own address (global when it
        is not an address): a client can make the server reach only what it reaches itself."""
        if policy == "allow":
            return cls(Scope.LOOPBACK)
        if policy == "drop":
            return cls(Scope.GLOBAL)
        client = address_scope(client_address)
        return cls(Scope.GLOBAL if client is None else client)

    def allows(self, value: str) -> bool:
        """Whether the server may send checks to the candidate ``value`` (a checked one)."""
        host = candidate_address(value)
        if host.lower().endswith(MDNS_SUFFIX):
            return self.floor <= Scope.PRIVATE
        scope = address_scope(host)
        return scope is not None and scope >= self.floor


def filter_offer(sdp: str, allowed: CandidateFilter) -> tuple[str, tuple[str, ...]]:
    """An offer without the ``a=candidate`` lines ``allowed`` refuses, and the candidates it
    keeps (values without ``a=``), before aiortc sees them. BadRequest for a malformed one."""
    lines: list[str] = []
    kept: list[str] = []
    dropped = False
    for line in sdp.splitlines(keepends=True):
        if line.startswith("a=candidate:"):
            value = check_candidate(line[2:].strip())
            if not allowed.allows(value):
                dropped = True
                continue
            kept.append(value)
        lines.append(line)
    return ("".join(lines) if dropped else sdp), tuple(kept)


class TooManyCandidates(UnprocessableContent):
    """A session's remote candidates would exceed ``transport.max_remote_candidates``."""

    code = "too_many_candidates"


def candidate_key(value: str) -> tuple[str, str, str, str]:
    """What makes a candidate distinct: component, transport, address and port."""
    bits = value.split()
    return bits[1], bits[2].lower(), bits[4].lower(), bits[5]


class CandidateBudget:
    """The distinct remote candidates of one session (offer and PATCHes), at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: set[tuple[str, str, str, str]] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def admit(self, values: Iterable[str]) -> None:
        """Count ``values`` (checked candidates) in, or raise TooManyCandidates and count
        none: a candidate the session already has is not new."""
        keys = self._keys | {candidate_key(v) for v in values}
        if len(keys) > self.limit:
            raise TooManyCandidates(
                f"the session would have {len(keys)} distinct ICE candidates; at most "
                f"{self.limit}: none of these was added"
            )
        self._keys = keys


class _Section:
    def __init__(self, index: int) -> None:
        self.index = index
        self.mid: str | None = None
        self.candidates: list[str] = []
        self.end = False

    def freeze(self) -> MediaFragment:
        return MediaFragment(self.index, self.mid, tuple(self.candidates), self.end)


def parse_sdpfrag(text: str, max_lines: int) -> SdpFragment:
    """Parse a trickle ICE fragment (RFC 8840): ICE credentials, then per media section its
    ``a=mid``, ``a=candidate`` and ``a=end-of-candidates`` lines; other attributes are
    ignored. Lines before any ``m=`` belong to the first media section.

    Raises PayloadTooLarge past ``max_lines`` and BadRequest for malformed content.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > max_lines:
        raise PayloadTooLarge(f"SDP fragment has {len(lines)} lines; at most {max_lines}")
    credentials: dict[str, str] = {}
    sections: list[_Section] = []
    current: _Section | None = None
    for line in lines:
        if len(line) < 2 or line[1] != "=" or not line[0].islower():
            raise BadRequest(f"malformed SDP fragment line: {line[:80]!r}")
        kind, value = line[0], line[2:]
        if kind == "m":
            current = _Section(len(sections))
            sections.append(current)
            continue
        if kind != "a":
            continue
        name, _, rest = value.partition(":")
        if name in ("ice-ufrag", "ice-pwd"):
            if not rest or credentials.setdefault(name, rest) != rest:
                raise BadRequest(f"SDP fragment has conflicting or empty a={name}")
            continue
        if name not in ("mid", "candidate", "end-of-candidates"):
            continue
        if current is None:
            current = _Section(0)
            sections.append(current)
        if name == "mid":
            current.mid = rest or None
        elif name == "candidate":
            current.candidates.append(check_candidate(value))
        else:
            current.end = True
    return SdpFragment(
        credentials.get("ice-ufrag"),
        credentials.get("ice-pwd"),
        tuple(s.freeze() for s in sections),
    )


def ice_ufrag(sdp: str) -> str | None:
    """The first ``a=ice-ufrag`` of an SDP (bundle: the transport's), which names its ICE
    session."""
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None


def entity_tag(session_id: str, ufrag: str) -> str:
    """The strong entity-tag (quoted) of a resource's ICE session; it would change with an
    ICE restart, which this server does not perform."""
    digest = hashlib.sha256(f"{session_id}:{ufrag}".encode()).hexdigest()[:24]
    return f'"{digest}"'


def if_match_allows(header: str | None, etag: str) -> bool:
    """``If-Match`` absent, ``*``, or listing ``etag`` (strong comparison)."""
    if header is None:
        return True
    tags = [t.strip() for t in header.split(",")]
    return "*" in tags or etag in tags


def is_ice_restart(fragment: SdpFragment, current_ufrag: str | None) -> bool:
    """A fragment with other ICE credentials than the session's asks for an ICE restart."""
    return fragment.ufrag is not None and fragment.ufrag != current_ufrag


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ice_server_links(servers: Sequence[IceServer]) -> list[str]:
    """STUN/TURN servers as ``Link`` header values (RFC 9725 section 4.6)."""
    links = []
    for server in servers:
        for url in server.urls:
            link = f'<{url}>; rel="ice-server"'
            if server.username is not None:
                link += f"; username={_quoted(server.username)}"
                link += f"; credential={_quoted(server.credential or '')}"
                link += '; credential-type="password"'
            links.append(link)
    return links
