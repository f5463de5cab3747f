"""The HTTP edge's middleware: every error leaves as JSON; browser origins are checked and
get CORS headers."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from aiohttp import web

from server.errors import Forbidden, RequestError
from server.http.auth import CorsPolicy

CORS_KEY = web.AppKey("cors", CorsPolicy)
CORS_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
CORS_REQUEST_HEADERS = (
    "Authorization, Content-Type, If-Match, Avatar-Resume-Token, Avatar-Last-Event-Id"
)
CORS_EXPOSED = "Location, ETag, Link, Retry-After, Accept-Patch, Accept-Post, WWW-Authenticate"
CORS_MAX_AGE_S = 600
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")  # a header name a preflight may name
MAX_ASKED_HEADERS = 16

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


OPENAI_PREFIX = "/v1/"  # paths of the OpenAI-compatible API: errors in OpenAI's shape


def error_response(
    status: int,
    message: str,
    code: str,
    headers: dict[str, str] | None = None,
    openai: bool = False,
) -> web.Response:
    """``{"error": message, "code"}``; ``openai``: ``{"error": {"message", "type", "code",
    "param"}}`` as the OpenAI API (and its client packages) have it."""
    if openai:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        error = {"message": message, "type": kind, "code": code, "param": None}
        return web.json_response({"error": error}, status=status, headers=headers)
    return web.json_response({"error": message, "code": code}, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as JSON: typed runtime errors and aiohttp's own HTTP errors."""
    openai = request.path.startswith(OPENAI_PREFIX)
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(exc.status, exc.message, exc.code, exc.headers, openai)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        code = exc.reason.lower().replace(" ", "_")
        return error_response(exc.status, exc.reason, code, headers, openai)


def allowed_headers(path: str, asked: str) -> str:
    """The request headers an allowed origin may send: the server's own, and on the OpenAI
    API (``/v1/``) those its preflight asks for too: OpenAI's SDKs add their own
    (``X-OpenAI-Agents-SDK: openai-agents-sdk.<version>`` with every offer, ``OpenAI-Beta``),
    and a browser refuses the call when one is not allowed. Header names only (letters,
    digits, dashes), at most MAX_ASKED_HEADERS."""
    if not path.startswith(OPENAI_PREFIX):
        return CORS_REQUEST_HEADERS
    own = [h.strip() for h in CORS_REQUEST_HEADERS.split(",")]
    known = {h.lower() for h in own}
    names = [n.strip() for n in asked.split(",")][:MAX_ASKED_HEADERS]
    more = [n for n in names if HEADER_NAME.fullmatch(n) and n.lower() not in known]
    return ", ".join(own + list(dict.fromkeys(n.lower() for n in more)))


@web.middleware
async def cors_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Browser origins: an allowed one gets CORS headers (preflights their own), any other is
    refused with 403 before the request does anything. Requests without Origin pass as is."""
    origin = request.headers.get("Origin")
    if origin is None or CORS_KEY not in request.app:
        return await handler(request)
    if not request.app[CORS_KEY].allows(origin, request.host):
        return error_response(403, f"origin {origin} is not allowed", Forbidden.code)
    response = await handler(request)
    response.headers["Access-Control-Allow-Origin"] = origin
    response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSED
    response.headers.add("Vary", "Origin")
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
        response.headers["Access-Control-Allow-Headers"] = allowed_headers(
            request.path, request.headers.get("Access-Control-Request-Headers", "")
        )
        response.headers["Access-Control-Max-Age"] = str(CORS_MAX_AGE_S)
    return response
