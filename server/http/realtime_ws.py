"""OpenAI Realtime over a WebSocket: ``GET /v1/realtime`` (the ``openai`` package's
``client.realtime.connect()``, the Agents SDK's ``OpenAIRealtimeWebSocket``, and any client
without WebRTC).

Who may connect is decided before the upgrade, as for ``POST /v1/realtime/calls``: the same
gate (``admit_session_key``: the address's session rate, then a server token or a client
secret, ``ek_...``, which admits one session and applies its configuration), the CORS policy
for a browser's ``Origin`` (the middleware), and the registry's capacity and per-client share;
a refusal is an HTTP error in OpenAI's shape. A browser cannot set ``Authorization`` on a
WebSocket: it offers the key as the subprotocol ``openai-insecure-api-key.<key>`` instead
(with ``realtime``, which the answer names). ``?model=`` is accepted and ignored; joining a
WebRTC call (``?call_id=``) and transcription sessions (``?intent=transcription``) are not
supported (400).

The socket carries GA events both ways (server/http/socket_link.py). Closing it ends the
conversation (no resume over a WebSocket); a server shutting down closes every socket with
1001 (going away) before the sessions end.
"""

from __future__ import annotations

import contextlib
import logging

from aiohttp import WSCloseCode, web

from server.conversation.conversation import Conversation
from server.errors import BadRequest, NotFound
from server.http.ratelimit import client_key
from server.http.signaling import REGISTRY_KEY, admit_session_key, client_address
from server.http.socket_link import SocketLink
from server.wire.realtime_audio import MAX_APPEND_CHARS

log = logging.getLogger(__name__)

REALTIME_PATH = "/v1/realtime"
SUBPROTOCOLS = ("realtime", "openai-beta.realtime-v1")  # answered, the first one offered
KEY_PROTOCOL = "openai-insecure-api-key."  # a browser's key, offered as a subprotocol
MAX_MESSAGE_BYTES = 2 * MAX_APPEND_CHARS  # larger: closed with 1009 (message too big)
HEARTBEAT_S = 20.0  # a ping this often; no answer: the client is gone
SOCKETS_KEY: web.AppKey[set[SocketLink]] = web.AppKey("realtime_sockets")
UNSUPPORTED_QUERY = {
    "call_id": "joining a WebRTC call over a WebSocket (call_id) is not supported",
    "intent": "transcription sessions (intent) are not supported",
}


def offered_protocols(request: web.Request) -> list[str]:
    """The subprotocols the client offers (``Sec-WebSocket-Protocol``), in order."""
    offered = ",".join(request.headers.getall("Sec-WebSocket-Protocol", []))
    return [p.strip() for p in offered.split(",") if p.strip()]


def with_key(request: web.Request) -> web.Request:
    """The request as the token gate reads it: a key offered as a subprotocol becomes its
    ``Authorization`` header (one the client sent wins)."""
    if "Authorization" in request.headers:
        return request
    keys = [p for p in offered_protocols(request) if p.startswith(KEY_PROTOCOL)]
    if not keys:
        return request
    headers = request.headers.copy()
    headers["Authorization"] = "Bearer " + keys[0][len(KEY_PROTOCOL) :]
    return request.clone(headers=headers)


async def get_realtime(request: web.Request) -> web.WebSocketResponse:
    """Upgrade to a WebSocket carrying a new conversation in OpenAI Realtime GA events."""
    ws = web.WebSocketResponse(
        protocols=SUBPROTOCOLS, max_msg_size=MAX_MESSAGE_BYTES, heartbeat=HEARTBEAT_S
    )
    if not ws.can_prepare(request).ok:
        raise BadRequest("GET /v1/realtime is a WebSocket: send an Upgrade request")
    registry = request.app[REGISTRY_KEY]
    config = registry.config
    links: list[SocketLink] = []

    def make(conversation: Conversation) -> SocketLink:
        link = SocketLink(conversation, ws, config, MAX_MESSAGE_BYTES)
        links.append(link)
        return link

    client = client_key(client_address(request))
    # a client secret is spent once its session exists; a refusal before leaves it unspent
    with admit_session_key(with_key(request)) as grant:
        for name, message in UNSUPPORTED_QUERY.items():
            if name in request.query:
                raise BadRequest(message)
        conversation = await registry.carry(make, grant.owner, client, grant.prepare())
    link = links[0]
    sockets = request.app[SOCKETS_KEY]
    sockets.add(link)
    try:
        await ws.prepare(request)
        log.info("session %s: WebSocket open", conversation.session_id[:8])
        link.start()
        await link.serve()
    finally:
        sockets.discard(link)
        with contextlib.suppress(NotFound):
            await registry.close(conversation.session_id)
        log.info("session %s: WebSocket closed (%s)", conversation.session_id[:8], ws.close_code)
    return ws


async def close_sockets(app: web.Application) -> None:
    """At shutdown (before the sessions end): every socket closes with 1001 (going away)."""
    sockets = app[SOCKETS_KEY]
    for link in [*sockets]:
        await link.close(WSCloseCode.GOING_AWAY)


def add_realtime_socket(app: web.Application) -> None:
    """The route, and the shutdown that closes its sockets."""
    sockets: set[SocketLink] = set()
    app[SOCKETS_KEY] = sockets
    app.on_shutdown.append(close_sockets)
    app.router.add_get(REALTIME_PATH, get_realtime)
