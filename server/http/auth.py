"""Who may call the API: bearer tokens, the resource owner rule and browser origins (CORS).

Tokens are kept and compared only as SHA-256 digests (constant-time comparison); a session
remembers the digest of the token that created it, and only that token may change or end it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from server.config import MIN_TOKEN_CHARS
from server.errors import ConfigError, Forbidden, Unauthorized
from server.owner import NO_OWNER


def token_digest(token: str) -> str:
    """SHA-256 hex digest of a token: what is stored and compared, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_value(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for any other header."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


class BearerAuth:
    """``Authorization: Bearer <token>`` against the configured tokens (none: open)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        for token in tokens:
            if len(token) < MIN_TOKEN_CHARS or any(ch.isspace() for ch in token):
                raise ConfigError(
                    f"server.auth_tokens: every token needs >= {MIN_TOKEN_CHARS} characters "
                    "and no whitespace"
                )
        self._digests = tuple(token_digest(t) for t in tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def authenticate(self, authorization: str | None) -> str:
        """The caller's identity (its token's digest; ``NO_OWNER`` when authentication is off).

        Raises Unauthorized for a missing, malformed or unknown token.
        """
        if not self.enabled:
            return NO_OWNER
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("this server needs an 'Authorization: Bearer <token>' header")
        digest = token_digest(token.strip())
        # compare with every configured digest, so timing does not tell which one matched
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(known, digest)
        if not matched:
            raise Unauthorized("unknown bearer token")
        return digest


def check_owner(owner: str, caller: str) -> None:
    """Only the token that created a resource may change or end it (Forbidden otherwise)."""
    if not hmac.compare_digest(owner, caller):
        raise Forbidden("this resource was created with another token")


class CorsPolicy:
    """Which browser origins may call the API; the server's own origin always may."""

    def __init__(self, origins: Sequence[str]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o.rstrip("/").lower() for o in origins if o != "*")

    def allows(self, origin: str, host: str) -> bool:
        """``origin`` (the Origin header) calling a server reached as ``host`` (Host header)."""
        origin = origin.rstrip("/").lower()
        if self.any or origin in self.origins:
            return True
        return urlsplit(origin).netloc == host.lower()  # same origin (any scheme: proxies)


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def anonymous_turn(setting: str, host: str) -> bool:
    """Whether callers without a bearer token get TURN credentials
    (``transport.ice_anonymous_turn``): 'allow', 'deny', or 'auto': while the server listens
    on loopback alone."""
    return setting == "allow" or (setting == "auto" and is_loopback(host))


def exposure_warning(host: str, tokens: Sequence[str]) -> str | None:
    """A warning when the server listens beyond localhost without authentication."""
    if tokens or is_loopback(host):
        return None
    return (
        f"listening on {host} without authentication: anyone who reaches this address can "
        "open sessions; set server.auth_tokens (AVATAR_SERVER_AUTH_TOKENS)"
    )
