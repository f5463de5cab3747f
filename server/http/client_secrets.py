"""Client secrets (``ek_...`` keys) of ``POST /v1/realtime/client_secrets``: what a key carries,
and the bounded store that keeps them.

An app's backend mints a key with its server token and hands it to a browser page; the page may
create one session with it before ``expires_at``. The session belongs to the minting token (its
owner) and starts with the key's session configuration. The store never holds a key, only its
SHA-256 digest (looked up as a dict key: the digest of a guessed key says nothing about a real
one). Time comes from an injected monotonic clock (ms) and an injected wall clock (unix s, for
``expires_at`` alone).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiohttp import web

from server.clock import Clock
from server.errors import BadRequest, TooManyRequests, Unauthorized
from server.http.auth import token_digest
from server.wire.realtime_session import SessionPatch

SECRET_PREFIX = "ek_"  # what OpenAI's SDKs expect of a browser's key
SECRET_BYTES = 32  # the key's entropy (bytes): 43 URL-safe characters
ID_BYTES = 9  # a key's public name (bytes), for logs and the response's session id
DEFAULT_TTL_S = 600  # a key's lifetime when the request names none (s), as OpenAI's
MIN_TTL_S, MAX_TTL_S = 10, 7200  # the lifetimes a request may ask for (s), as OpenAI's
MAX_KEYS = 4096  # keys kept at once, spent ones included until they expire


@dataclass(frozen=True)
class ClientSecret:
    """What a key carries: ``digest`` (SHA-256 of the key, what is stored), ``key_id`` (a public
    name), ``owner`` (the minting token's digest; ``NO_OWNER`` with authentication off),
    ``patch`` (its session configuration; None: the server's defaults), ``expires_at`` (unix
    s), ``deadline_ms`` (the same moment on the monotonic clock, ms) and ``spent`` (claimed by
    a session)."""

    digest: str
    key_id: str
    owner: str
    patch: SessionPatch | None
    expires_at: int
    deadline_ms: float
    spent: bool = False


@dataclass(frozen=True)
class Minted:
    """A new key: ``value`` (given to the caller once, never stored) and its record."""

    value: str
    secret: ClientSecret


def lifetime_s(expires_after: object) -> int:
    """The lifetime (s) asked for by a request's ``expires_after`` (``{"anchor":
    "created_at", "seconds": N}``, both optional; None: ``DEFAULT_TTL_S``). BadRequest for
    another anchor, a number that is not a whole one, or one outside 10..7200 s."""
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        raise BadRequest("expires_after must be an object")
    unknown = set(expires_after) - {"anchor", "seconds"}
    if unknown:
        raise BadRequest(f"expires_after has an unknown field {sorted(unknown)[0][:32]!r}")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise BadRequest('expires_after.anchor must be "created_at"')
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise BadRequest("expires_after.seconds must be a whole number of seconds")
    if not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise BadRequest(f"expires_after.seconds must be between {MIN_TTL_S} and {MAX_TTL_S}")
    return seconds


class ClientSecrets:
    """The live keys by digest, at most ``capacity``; expired ones are dropped whenever a key
    is minted or claimed. ``count`` is told each event: ``minted``, ``used`` (a session was
    created with a key), ``expired`` (dropped unused)."""

    def __init__(
        self,
        clock: Clock,
        wall_s: Callable[[], float],
        capacity: int = MAX_KEYS,
        count: Callable[[str], None] = lambda event: None,
        prefix: str = "",
    ) -> None:
        self._clock = clock
        self._wall_s = wall_s  # unix time (s): only for expires_at, which clients read
        self._capacity = capacity
        self._count = count
        self._prefix = prefix  # server.session_id_prefix: names the worker that holds the key
        self._keys: dict[str, ClientSecret] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def mint(self, owner: str, patch: SessionPatch | None, ttl_s: int) -> Minted:
        """A new key for ``owner`` carrying ``patch``, valid for ``ttl_s`` seconds from now.
        TooManyRequests (Retry-After: when the first kept key expires) while the store is
        full."""
        now_ms = self._clock.now_ms()
        self.prune()
        if len(self._keys) >= self._capacity:
            first_ms = min(k.deadline_ms for k in self._keys.values())
            retry_s = max(1, math.ceil((first_ms - now_ms) / 1000))
            raise TooManyRequests("too many live client secrets; retry later", retry_s)
        value = SECRET_PREFIX + self._prefix + secrets.token_urlsafe(SECRET_BYTES)
        wall = self._wall_s()
        expires_at = int(wall) + ttl_s  # whole seconds, as OpenAI's; never past wall + ttl_s
        secret = ClientSecret(
            token_digest(value),
            "cs_" + secrets.token_urlsafe(ID_BYTES),
            owner,
            patch,
            expires_at,
            now_ms + (expires_at - wall) * 1000,
        )
        self._keys[secret.digest] = secret
        self._count("minted")
        return Minted(value, secret)

    def claim(self, value: str) -> ClientSecret | None:
        """The record of key ``value``, now claimed for one session: :meth:`settle` once the
        session exists, :meth:`release` if it was not created. None for a key this store does
        not hold (never issued, or expired and dropped); Unauthorized for one that expired or
        was spent."""
        secret = self._keys.get(token_digest(value))
        if secret is None:
            self.prune()
            return None
        if self._clock.now_ms() >= secret.deadline_ms:
            self.prune()
            raise Unauthorized("this client secret has expired: mint a new one")
        if secret.spent:
            raise Unauthorized("this client secret was used already: one session per key")
        self._keys[secret.digest] = replace(secret, spent=True)
        return secret

    def settle(self, secret: ClientSecret) -> None:
        """The session ``secret`` was claimed for exists: counted as used."""
        self._count("used")

    def release(self, secret: ClientSecret) -> None:
        """The session ``secret`` was claimed for was not created: the key may be used again
        until it expires."""
        if secret.digest in self._keys:
            self._keys[secret.digest] = replace(secret, spent=False)

    def prune(self) -> int:
        """Drop the keys past their deadline; how many were dropped."""
        now_ms = self._clock.now_ms()
        gone = [d for d, k in self._keys.items() if now_ms >= k.deadline_ms]
        for digest in gone:
            if not self._keys.pop(digest).spent:
                self._count("expired")
        return len(gone)


SECRETS_KEY = web.AppKey("client_secrets", ClientSecrets)
