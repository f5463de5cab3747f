"""Typed errors of the runtime; translated to HTTP or events only at the edge."""

from __future__ import annotations


class RuntimeErrorBase(Exception):
    """Base of every error the session runtime raises on purpose."""

    code = "runtime_error"


class ConfigError(RuntimeErrorBase):
    """A configuration value is invalid; the message names the setting."""

    code = "invalid_config"


class InvalidTransition(RuntimeErrorBase):
    """A state machine was asked for a transition it does not allow."""

    code = "invalid_transition"


class InvalidConditionUpdate(RuntimeErrorBase):
    """A ``session.update`` named an unknown field or an invalid value; nothing changed."""

    code = "invalid_session_update"


class UnknownItem(RuntimeErrorBase):
    """No conversation item has this id (never had, or deleted, or slid out of history)."""

    code = "item_not_found"


class InvalidItem(RuntimeErrorBase):
    """A conversation item cannot be made or changed so (a taken id, a user item's audio)."""

    code = "invalid_item"


class UnknownChunk(RuntimeErrorBase):
    """A stage message named a chunk the session never opened."""

    code = "unknown_chunk"


class RequestError(RuntimeErrorBase):
    """A request the edge answers with an HTTP error status (and a JSON body)."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(RequestError):
    status = 400
    code = "bad_request"


class NotFound(RequestError):
    status = 404
    code = "not_found"


class PayloadTooLarge(RequestError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(RequestError):
    status = 415
    code = "unsupported_media_type"


class ServerFull(RequestError):
    """No room for a session now; ``retry_after_s`` (whole seconds) goes out as ``Retry-After``."""

    status = 503
    code = "server_full"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class Draining(RequestError):
    """The server is draining (a SIGTERM with ``server.drain_timeout_s``): its live sessions
    finish, new ones go to another host; ``Retry-After`` as for :class:`ServerFull`."""

    status = 503
    code = "draining"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__("server is draining: no new sessions", {"Retry-After": str(retry_after_s)})


class Unauthorized(RequestError):
    """No or a wrong bearer token; the response names the scheme (``WWW-Authenticate``)."""

    status = 401
    code = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, {"WWW-Authenticate": 'Bearer realm="avatar-server"'})


class Forbidden(RequestError):
    status = 403
    code = "forbidden"


class TurnNeedsToken(Forbidden):
    """TURN credentials asked for without a bearer token where
    ``transport.ice_anonymous_turn`` withholds them (no tokens configured, server reachable
    beyond loopback): whoever holds them can relay traffic through the TURN server."""

    code = "turn_needs_token"


class PreconditionFailed(RequestError):
    """``If-Match`` names an entity-tag the resource no longer has."""

    status = 412
    code = "precondition_failed"


class UnprocessableContent(RequestError):
    """Well-formed but not applicable, e.g. an ICE restart this server does not support."""

    status = 422
    code = "unprocessable_content"


class TooManyRequests(RequestError):
    """Rate limited; ``retry_after_s`` (whole seconds) goes out as ``Retry-After``."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class ResumeRefused(RequestError):
    """A resume token that is not (or no longer) this conversation's: used already, issued to
    another connection since, or made up."""

    status = 403
    code = "resume_token_invalid"


class ResumeExpired(RequestError):
    """The conversation a resume token names has ended (its resume window passed, or it was
    hung up)."""

    status = 410
    code = "resume_expired"
