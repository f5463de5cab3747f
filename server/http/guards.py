"""Checks every HTTP request passes before it is routed: its path, its ``Host``, and (in a
worker) the router's key.

- **Dot segments.** A path with a ``.`` or ``..`` segment (also percent-encoded) is refused with
  400. Routing sees the raw path while URL libraries normalise it, so ``POST /./offer`` would be
  routed as something else than what a worker finally serves.
- **Host allowlist (DNS rebinding).** A page on ``attacker.example`` whose name is rebound to
  127.0.0.1 makes the browser send ``Host: attacker.example``. Only ``localhost``, IP literals
  (which no DNS answer can rebind), the bound name and ``server.allowed_hosts`` are served; any
  other host gets 421.
- **Worker key.** Behind the supervisor's router a worker serves only requests that carry the
  key the supervisor gave it (in the environment, never on a command line), so nothing reaches
  a worker's loopback port past the router's limits.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web
from aiohttp.typedefs import Middleware

from server.config import Config

log = logging.getLogger(__name__)

WORKER_KEY_HEADER = "X-Avatar-Worker-Key"
LOCAL_NAMES = frozenset({"localhost"})
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::"})
_HOST = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>\d{1,5}))?$"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _refuse(status: int, message: str, code: str) -> web.Response:
    return web.json_response({"error": message, "code": code}, status=status)


def has_dot_segment(raw_path: str) -> bool:
    """Whether the path (without its query) has a ``.`` or ``..`` segment, decoded or not."""
    path = raw_path.split("?", 1)[0]
    for form in (path, unquote(path)):
        if any(segment in (".", "..") for segment in form.replace("\\", "/").split("/")):
            return True
    return False


def host_name(host_header: str) -> str | None:
    """The name (or address) in a ``Host`` header, lower case without a trailing dot; None if
    the header is not a host[:port]."""
    match = _HOST.match(host_header.strip())
    if match is None:
        return None
    return (match.group("v6") or match.group("name") or "").lower().rstrip(".")


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostAllowlist:
    """The names a server answers to (see the module doc). ``*`` in ``allowed`` allows any."""

    def __init__(self, bound: str, allowed: tuple[str, ...]) -> None:
        names = {n.lower().rstrip(".") for n in allowed}
        self.any = "*" in names
        bound_name = bound.lower().rstrip(".")
        if bound_name not in ANY_ADDRESS and not is_ip_literal(bound_name):
            names.add(bound_name)
        self.names = frozenset(names | LOCAL_NAMES)

    def allows(self, host_header: str) -> bool:
        if self.any:
            return True
        name = host_name(host_header)
        if name is None:
            return False
        return name in self.names or is_ip_literal(name)


def request_guards(config: Config) -> list[Middleware]:
    """The middlewares of this server's checks, first to last (see the module doc)."""
    hosts = HostAllowlist(config.server.host, config.server.allowed_hosts)
    worker_key = config.server.worker_key.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if worker_key and not hmac.compare_digest(
            request.headers.get(WORKER_KEY_HEADER, "").encode(), worker_key
        ):
            return _refuse(403, "a worker answers its router only", "forbidden")
        if has_dot_segment(request.raw_path):
            return _refuse(400, "the path has '.' or '..' segments", "bad_request")
        host = request.headers.get("Host", "")
        if not hosts.allows(host):
            log.info("refused a request for host %r (server.allowed_hosts)", host[:64])
            return _refuse(
                421, "this server does not answer to that host name", "misdirected_request"
            )
        return await handler(request)

    return [guard]
