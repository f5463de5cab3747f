"""OpenAI Realtime over WebRTC: ``POST /v1/realtime/calls`` and the call resource.

``POST /v1/realtime/calls`` takes an SDP offer, either as the body (``application/sdp``) or as
``multipart/form-data`` with the field ``sdp`` and an optional ``session`` (a GA session
object, JSON: instructions, voice, turn detection; server/wire/realtime_session.py),
which is applied before the first response. It answers ``201 Created`` with the SDP answer
(``application/sdp``) and ``Location: /v1/realtime/calls/<call id>``. ``DELETE`` of that
Location (or ``POST .../hangup``, as the ``openai`` package's ``calls.hangup`` sends) ends the
call. The client's data channel ``oai-events`` carries GA events.

Who may call, and every limit, are those of ``/whip`` (server/http/signaling.py); a client
secret (``Bearer ek_...``, server/http/realtime_secrets.py) creates one call. Errors on
these paths have OpenAI's shape: ``{"error": {"message", "type", "code", "param"}}``.
"""

from __future__ import annotations

import re
from email.errors import MessageError
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP

from aiohttp import web

from server.errors import BadRequest, InvalidConditionUpdate, UnsupportedMediaType
from server.http.signaling import (
    TRANSPORT_KEY,
    admit_session_key,
    check_sdp,
    create_session,
    delete_whip,
    read_limited,
)
from server.http.whip import SDP_TYPE
from server.jsontext import JsonRefused, load_json
from server.runtime.conditions import validate_update
from server.wire.protocol import ProtocolError
from server.wire.realtime_session import SessionPatch, parse_session

CALLS_PATH = "/v1/realtime/calls"
MULTIPART_TYPE = "multipart/form-data"
BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")  # RFC 2046


def _boundary(content_type: str) -> str:
    """The ``boundary`` parameter of a multipart Content-Type: 1-70 characters of RFC 2046's
    set (ASCII); BadRequest otherwise."""
    params = dict(
        (k.strip().lower(), v.strip().strip('"'))
        for k, _, v in (part.partition("=") for part in content_type.split(";")[1:])
    )
    boundary = params.get("boundary", "")
    if not BOUNDARY.fullmatch(boundary):
        raise BadRequest("multipart/form-data needs a boundary of 1-70 RFC 2046 characters")
    return boundary


def _form_fields(content_type: str, body: bytes) -> dict[str, bytes]:
    """The fields of a ``multipart/form-data`` body (name -> bytes); BadRequest if it is not
    one."""
    boundary = _boundary(content_type)
    head = f'Content-Type: {MULTIPART_TYPE}; boundary="{boundary}"\r\nMIME-Version: 1.0\r\n\r\n'
    try:
        message = BytesParser(policy=HTTP).parsebytes(head.encode("ascii") + body)
        if not message.is_multipart() or any(p.is_multipart() for p in message.iter_parts()):
            raise BadRequest("malformed multipart/form-data body (no parts, or nested ones)")
    except (ValueError, RecursionError, MessageError):
        raise BadRequest("malformed multipart/form-data body") from None
    fields: dict[str, bytes] = {}
    for part in message.iter_parts():
        assert isinstance(part, Message)
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = payload
    return fields


def _text(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"the {name} field is not UTF-8") from None


def session_patch(raw: str) -> SessionPatch:
    """The ``session`` field: a GA session object this server can apply, or BadRequest naming
    what it cannot (nothing is created then)."""
    try:
        data = load_json(raw)
    except JsonRefused as exc:
        raise BadRequest(f"the session field: {exc}") from None
    return session_config(data)


def session_config(data: object) -> SessionPatch:
    """A GA session object (parsed JSON) this server can apply, or BadRequest naming what it
    cannot: the ``session`` of a call's form and of a client secret."""
    try:
        patch = parse_session(data)
        if patch.conditions:
            validate_update(patch.conditions)
    except ProtocolError as exc:
        where = f" ({exc.param})" if exc.param else ""
        raise BadRequest(f"{exc.message}{where}") from None
    except InvalidConditionUpdate as exc:
        raise BadRequest(str(exc)) from None
    return patch


async def read_offer(request: web.Request) -> tuple[str, SessionPatch | None]:
    """The SDP offer and the session configuration of a ``POST /v1/realtime/calls``."""
    limit = request.app[TRANSPORT_KEY].max_body_bytes
    if request.content_type == SDP_TYPE:
        return _text(await read_limited(request, limit), "body"), None
    if request.content_type != MULTIPART_TYPE:
        raise UnsupportedMediaType(
            f"expected Content-Type {SDP_TYPE} or {MULTIPART_TYPE}, got "
            f"{request.content_type or 'none'}"
        )
    fields = _form_fields(request.headers["Content-Type"], await read_limited(request, limit))
    if "sdp" not in fields:
        raise BadRequest("the form has no sdp field")
    session = fields.get("session")
    patch = None if session is None else session_patch(_text(session, "session"))
    return _text(fields["sdp"], "sdp"), patch


async def post_call(request: web.Request) -> web.Response:
    """An SDP offer in, 201 with the SDP answer and the call's Location."""
    with admit_session_key(request) as grant:  # a client secret's configuration comes first
        offer, patch = await read_offer(request)
        sdp = check_sdp(offer, request.app[TRANSPORT_KEY].max_sdp_lines)
        prepare = grant.prepare(patch)  # validated: it cannot fail there
        call_id, answer = await create_session(request, sdp, grant.owner, prepare=prepare)
    headers = {"Location": f"{CALLS_PATH}/{call_id}"}
    return web.Response(status=201, body=answer.encode(), content_type=SDP_TYPE, headers=headers)


async def options_calls(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": "OPTIONS, POST", "Accept-Post": SDP_TYPE})


async def options_call(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": "OPTIONS, DELETE"})


def add_call_routes(app: web.Application) -> None:
    """The routes; what they need (limits, tokens, the registry) comes from signaling's."""
    app.router.add_post(CALLS_PATH, post_call)
    app.router.add_route("OPTIONS", CALLS_PATH, options_calls)
    # ending a call is ending a WHIP session: the same rules (404, 403 for another's token)
    app.router.add_delete(CALLS_PATH + "/{session_id}", delete_whip)
    app.router.add_post(CALLS_PATH + "/{session_id}/hangup", delete_whip)
    app.router.add_route("OPTIONS", CALLS_PATH + "/{session_id}", options_call)
