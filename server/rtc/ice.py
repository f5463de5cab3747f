"""The STUN/TURN servers given to ICE: the server's own peers, WHIP ``Link`` headers and the
page's ``GET /ice-servers``.

TURN credentials are either the configured static pair or, with ``transport.ice_auth_secret``,
issued per client and short-lived by the TURN REST API scheme that coturn checks with
``--use-auth-secret --static-auth-secret``: the username is ``<expiry in unix s>:<label>`` and
the credential is base64(HMAC-SHA1(secret, username)). The TURN server needs only the shared
secret; a leaked credential stops working at its expiry.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from server.config import TransportConfig

TURN_SCHEMES = ("turn:", "turns:")


@dataclass(frozen=True)
class IceServer:
    """One ``RTCIceServer``: its URLs and, for TURN, the credentials to use them."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    @property
    def turn(self) -> bool:
        """Whether this is a TURN server (which relays for whoever holds its credentials)."""
        return any(url.startswith(TURN_SCHEMES) for url in self.urls)

    def to_json(self) -> dict[str, Any]:
        """The browser's ``RTCIceServer`` dictionary."""
        out: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            out["username"] = self.username
            out["credential"] = self.credential or ""
        return out


def rest_credential(secret: str, username: str) -> str:
    """The TURN REST API password of ``username``: base64(HMAC-SHA1(secret, username))."""
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def ice_servers(config: TransportConfig, now_s: float, label: str) -> tuple[IceServer, ...]:
    """The configured servers, STUN first (no credentials), then TURN with credentials.

    ``now_s``: wall-clock unix time (s), which the TURN server compares the expiry with;
    ``label``: who the issued credential is for (shows in the TURN server's log).
    """
    stun = tuple(url for url in config.ice_urls if not url.startswith(TURN_SCHEMES))
    turn = tuple(url for url in config.ice_urls if url.startswith(TURN_SCHEMES))
    servers = [IceServer(stun)] if stun else []
    if turn and config.ice_auth_secret:
        username = f"{int(now_s) + config.ice_credential_ttl_s}:{label}"
        servers.append(IceServer(turn, username, rest_credential(config.ice_auth_secret, username)))
    elif turn:
        servers.append(IceServer(turn, config.ice_username or None, config.ice_credential or None))
    return tuple(servers)
