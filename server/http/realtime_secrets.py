"""``POST /v1/realtime/client_secrets``: an app's backend mints a short-lived key (``ek_...``)
for a browser page, as with OpenAI's Realtime API.

The request needs a server token (any caller while authentication is off) and a JSON body of
OpenAI's shape, both fields optional: ``{"expires_after": {"anchor": "created_at", "seconds":
N}, "session": {...}}`` (10..7200 s, 600 by default; a GA session object, checked as the
``session`` field of ``POST /v1/realtime/calls`` is). The answer is ``{"value": "ek_...",
"expires_at": <unix s>, "session": {...}}``, the session described as ``session.created``
describes one (its ``id`` names the key; the call gets its own). A refused request mints
nothing. The key creates one session (server/http/signaling.py ``admit_session_key``), owned by
the minting token, with the key's session configuration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from server.clock import MonotonicClock
from server.config import Config
from server.errors import BadRequest
from server.http.client_secrets import SECRETS_KEY, ClientSecret, ClientSecrets, lifetime_s
from server.http.realtime_calls import session_config
from server.http.signaling import authenticate, read_body
from server.jsontext import JsonRefused, load_json
from server.wire.realtime_session import TurnSettings, session_object

log = logging.getLogger(__name__)

SECRETS_PATH = "/v1/realtime/client_secrets"
SESSION_CONFIG_KEY = web.AppKey("client_secrets_config", Config)  # the sessions' defaults
FIELDS = frozenset({"expires_after", "session"})


def describe(secret: ClientSecret, config: Config) -> dict[str, Any]:
    """The session a key carries, as ``session.created`` describes sessions: the server's
    defaults with the key's configuration applied; ``expires_at``: the key's (unix s)."""
    runtime = config.runtime
    patch = secret.patch
    conditions = {} if patch is None else patch.conditions
    turn = TurnSettings.from_config(config)
    if patch is not None:
        turn = patch.apply_turn(turn)
    persona = conditions.get("persona", runtime.persona)
    voice = conditions.get("voice", runtime.voice)
    described = session_object(secret.key_id, config, persona, voice, turn)
    return {**described, "expires_at": secret.expires_at}


async def read_request(request: web.Request) -> dict[str, Any]:
    """The JSON object of the body (an absent body: ``{}``); BadRequest otherwise."""
    if not request.body_exists:
        return {}
    try:
        data = load_json(await read_body(request, "application/json"))
    except JsonRefused as exc:
        raise BadRequest(f"body: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = set(data) - FIELDS
    if unknown:
        raise BadRequest(f"unknown field {sorted(unknown)[0][:32]!r}")
    return data


async def post_client_secret(request: web.Request) -> web.Response:
    """A new key: 200 with ``{"value", "expires_at", "session"}``; 401 without a server
    token, 400 for a malformed body or a session this server cannot apply, 429 while the
    store is full. ``Cache-Control: no-store``: the body is a credential."""
    owner = authenticate(request)  # a server token: a client secret cannot mint another
    data = await read_request(request)
    ttl_s = lifetime_s(data.get("expires_after"))
    patch = None if data.get("session") is None else session_config(data["session"])
    minted = request.app[SECRETS_KEY].mint(owner, patch, ttl_s)
    secret = minted.secret
    log.info("client secret %s minted (expires in %d s)", secret.key_id[:8], ttl_s)
    body = {
        "value": minted.value,
        "expires_at": secret.expires_at,
        "session": describe(secret, request.app[SESSION_CONFIG_KEY]),
    }
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def options_client_secrets(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": "OPTIONS, POST"})


def add_secret_routes(app: web.Application, config: Config, count: Callable[[str], None]) -> None:
    """The route and its store (``count``: told ``minted``, ``used``, ``expired``); keys live
    in this process alone, named by ``server.session_id_prefix`` (``ek_<prefix>...``)."""
    app[SESSION_CONFIG_KEY] = config
    app[SECRETS_KEY] = ClientSecrets(
        MonotonicClock(), time.time, count=count, prefix=config.server.session_id_prefix
    )
    app.router.add_post(SECRETS_PATH, post_client_secret)
    app.router.add_route("OPTIONS", SECRETS_PATH, options_client_secrets)
