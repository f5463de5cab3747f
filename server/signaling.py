"""HTTP signaling: ``POST /offer`` (JSON), WHIP ``POST /whip`` / ``DELETE /whip/<id>``.

Typed errors are translated to HTTP here, at the edge, always with a JSON ``{"error": ...}``
body. Bodies are checked (type, size, SDP shape) before any peer is created.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from server.errors import (
    BadRequest,
    PayloadTooLarge,
    RequestError,
    UnsupportedMediaType,
)
from server.registry import SessionRegistry

log = logging.getLogger(__name__)

REGISTRY_KEY = web.AppKey("registry", SessionRegistry)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    status: int, message: str, code: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": message, "code": code}, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON: typed runtime errors and aiohttp's own HTTP errors."""
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(exc.status, exc.message, exc.code, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        return error_response(exc.status, exc.reason, exc.reason.lower().replace(" ", "_"), headers)


async def read_body(request: web.Request, content_type: str) -> str:
    """The request body as text if it has ``content_type`` and fits the size limit."""
    if request.content_type != content_type:
        raise UnsupportedMediaType(
            f"expected Content-Type {content_type}, got {request.content_type or 'none'}"
        )
    limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body larger than {limit} bytes")
    body = await request.content.read(limit + 1)
    if len(body) > limit:
        raise PayloadTooLarge(f"body larger than {limit} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body is not UTF-8") from None


def check_sdp(sdp: object) -> str:
    """A cheap shape check before aiortc sees it: an SDP offer has v=0 and media sections."""
    if not isinstance(sdp, str) or not sdp.strip():
        raise BadRequest("missing SDP")
    lines = sdp.strip().splitlines()
    if lines[0].strip() != "v=0" or not any(line.startswith("m=") for line in lines):
        raise BadRequest("malformed SDP: expected 'v=0' and at least one 'm=' line")
    return sdp


async def post_offer(request: web.Request) -> web.Response:
    """``{"sdp", "type": "offer"}`` -> ``{"sdp", "type": "answer", "session_id"}``."""
    text = await read_body(request, "application/json")
    try:
        data = json.loads(text)
    except ValueError:
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(data, dict) or data.get("type") != "offer":
        raise BadRequest('expected a JSON object with "type": "offer"')
    sdp = check_sdp(data.get("sdp"))
    session_id, answer = await request.app[REGISTRY_KEY].create(sdp)
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session_id": session_id})


async def post_whip(request: web.Request) -> web.Response:
    """WHIP (RFC 9725): SDP offer in, 201 with the SDP answer and the resource's Location."""
    sdp = check_sdp(await read_body(request, "application/sdp"))
    session_id, answer = await request.app[REGISTRY_KEY].create(sdp)
    return web.Response(
        status=201,
        body=answer.sdp.encode(),
        content_type="application/sdp",
        headers={"Location": f"/whip/{session_id}"},
    )


async def delete_whip(request: web.Request) -> web.Response:
    """End the session; 404 for an unknown id."""
    await request.app[REGISTRY_KEY].close(request.match_info["session_id"])
    return web.Response(status=200)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/offer", post_offer)
    app.router.add_post("/whip", post_whip)
    app.router.add_delete("/whip/{session_id}", delete_whip)
