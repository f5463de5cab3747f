"""Resume tokens: a client that lost its connection attaches a new one to the same conversation.

A token is ``<session id>.<secret>``: the secret is 192 random bits, kept only as its SHA-256
digest and compared in constant time. A conversation has one token out at a time; it works
once (each attached connection gets a new one in its ``session.created``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from server.errors import BadRequest

SECRET_BYTES = 24  # 192 random bits, URL-safe
MAX_TOKEN_CHARS = 256


def split_token(token: str) -> tuple[str, str]:
    """(session id, secret) of a presented token; BadRequest if it has no such shape."""
    session_id, dot, secret = token.strip().rpartition(".")
    if not dot or not session_id or not secret or len(token) > MAX_TOKEN_CHARS:
        raise BadRequest("a resume token is '<session id>.<secret>'")
    return session_id, secret


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "replace")).digest()


class ResumeTicket:
    """The resume token a conversation has given out (at most one valid at a time)."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._digest: bytes | None = None
        self.issued = 0  # tokens handed out so far

    def issue(self) -> str:
        """A new token; any earlier one stops working."""
        secret = secrets.token_urlsafe(SECRET_BYTES)
        self._digest = _digest(secret)
        self.issued += 1
        return f"{self._session_id}.{secret}"

    def reinstate(self, secret: str) -> None:
        """Make a redeemed token valid again (the connection it was for could not be made)."""
        self._digest = _digest(secret)

    def valid(self, secret: str) -> bool:
        """Whether ``secret`` is the current token's (nothing is used up)."""
        expected = self._digest
        given = _digest(secret)
        ok = hmac.compare_digest(expected if expected is not None else bytes(32), given)
        return ok and expected is not None

    def redeem(self, secret: str) -> bool:
        """Whether ``secret`` is the current token's; a token that matches is used up."""
        if self.valid(secret):
            self._digest = None
            return True
        return False


@dataclass(frozen=True)
class Resumption:
    """A connection that resumes a conversation; ``after``: the number of the last event its
    client received (``last_event_id``), None when it did not say (nothing is sent again)."""

    after: int | None = None


Resumed = Resumption | None  # None: a new conversation's first connection
