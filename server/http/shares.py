"""Each client's share of the server: how many live sessions one address, or one bearer token,
may hold."""

from __future__ import annotations

from collections.abc import Sequence

from server.config import Config, TransportConfig
from server.errors import TooManyRequests
from server.http.auth import is_loopback
from server.owner import NO_OWNER


class TooManySessions(TooManyRequests):
    """The client (address or token) already holds its share of the sessions."""

    code = "too_many_sessions"


def client_limit(transport: TransportConfig) -> int:
    """Live sessions one client may hold (``transport.max_sessions_per_client``; 0: half of
    ``max_sessions``, at least 1)."""
    return transport.max_sessions_per_client or max(1, transport.max_sessions // 2)


def check_share(
    config: Config, clients: Sequence[str], owners: Sequence[str], client: str, owner: str
) -> None:
    """TooManySessions when ``client`` (an address key) or ``owner`` (a token digest) already
    holds its share, given the ``clients`` and ``owners`` of the live sessions. The automatic
    limit leaves loopback clients alone: on this machine, or behind a proxy not in
    ``server.trusted_proxies``, every client is one. Tokens count when there are several (with
    one, every client shares it)."""
    transport = config.transport
    limit = client_limit(transport)
    by_address = bool(client) and (transport.max_sessions_per_client > 0 or not is_loopback(client))
    if by_address and sum(c == client for c in clients) >= limit:
        raise TooManySessions(
            f"this client address already has {limit} live sessions (its share of the "
            "server); end one first",
            transport.retry_after_s,
        )
    by_token = owner != NO_OWNER and len(config.server.auth_tokens) > 1
    if by_token and sum(o == owner for o in owners) >= limit:
        raise TooManySessions(
            f"this token already has {limit} live sessions (its share of the server); "
            "end one first",
            transport.retry_after_s,
        )
