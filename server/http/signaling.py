"""HTTP signaling: ``POST /offer`` (JSON) and WHIP (RFC 9725) on ``/whip``; ``GET
/ice-servers`` gives a browser its STUN/TURN servers before it makes the offer.

WHIP: ``POST /whip`` (SDP offer) -> ``201`` with the answer, ``Location``, ``ETag`` and ICE
servers as ``Link`` headers; ``PATCH /whip/<id>`` with ``application/trickle-ice-sdpfrag``
adds trickled candidates (``204``; an ICE restart is refused with ``422``; a stale ``If-Match``
gets ``412``); ``DELETE /whip/<id>`` ends the session; ``OPTIONS`` on both answers CORS
preflights and names the methods.

Who may call: bearer tokens when configured (a resource obeys only the token that created
it; a session may also be created with a client secret, ``admit_session_key``), browser
origins by the CORS policy, session creation by a per-address token bucket and a
per-client share of the live sessions (server/http/registry.py), trickle PATCHes by a per-session
token bucket. Remote ICE candidates, in the offer and in PATCHes, pass the candidate filter
and the session's candidate cap (server/http/whip.py) before aiortc sees them.
Typed errors are translated to HTTP here, at the edge, always with a JSON ``{"error": ...}``
body. Bodies are checked (type, size, SDP shape) before any peer is created.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from server.clock import MonotonicClock
from server.config import Config, TransportConfig
from server.conversation.conversation import Conversation
from server.errors import (
    BadRequest,
    PayloadTooLarge,
    PreconditionFailed,
    RequestError,
    TooManyRequests,
    TurnNeedsToken,
    Unauthorized,
    UnprocessableContent,
    UnsupportedMediaType,
)
from server.http.auth import BearerAuth, CorsPolicy, anonymous_turn, bearer_value, check_owner
from server.http.client_secrets import SECRET_PREFIX, SECRETS_KEY
from server.http.forwarded import TrustedProxies
from server.http.middleware import CORS_KEY
from server.http.ratelimit import RateLimiter, client_key
from server.http.registry import SessionRegistry
from server.http.whip import (
    SDP_TYPE,
    SDPFRAG_TYPE,
    CandidateBudget,
    CandidateFilter,
    entity_tag,
    filter_offer,
    ice_server_links,
    ice_ufrag,
    if_match_allows,
    is_ice_restart,
    parse_sdpfrag,
)
from server.jsontext import JsonRefused, load_json
from server.rtc.ice import TURN_SCHEMES, IceServer, ice_servers
from server.rtc.settings import add_remote_candidates, remote_candidates_complete
from server.wire.outlet import event_number
from server.wire.realtime_session import SessionPatch

log = logging.getLogger(__name__)

REGISTRY_KEY = web.AppKey("registry", SessionRegistry)
AUTH_KEY = web.AppKey("auth", BearerAuth)
LIMITER_KEY = web.AppKey("session_rate", RateLimiter)
PATCH_LIMITER_KEY = web.AppKey("patch_rate", RateLimiter)  # keyed by session id
TRANSPORT_KEY = web.AppKey("transport", TransportConfig)
ANONYMOUS_TURN_KEY = web.AppKey("anonymous_turn", bool)  # transport.ice_anonymous_turn, decided
PROXIES_KEY = web.AppKey("trusted_proxies", TrustedProxies)

MAX_MEDIA_SECTIONS = 16  # m-lines in one offer (each becomes a transceiver)
RESUME_HEADER = "Avatar-Resume-Token"
LAST_EVENT_HEADER = "Avatar-Last-Event-Id"  # the last event a resuming client received


def authenticate(request: web.Request) -> str:
    """The caller's identity (token digest, or '' with authentication off); 401 otherwise."""
    return request.app[AUTH_KEY].authenticate(request.headers.get("Authorization"))


def client_address(request: web.Request) -> str:
    """The client's address: the peer, or the right-most address in X-Forwarded-For that no
    trusted proxy wrote (server/http/forwarded.py)."""
    forwarded = request.headers.getall("X-Forwarded-For", [])
    return request.app[PROXIES_KEY].client(request.remote or "unknown", forwarded)


def limit_session_rate(request: web.Request) -> None:
    """The per-address session rate limit: 429 (with Retry-After) when the address is over it
    (an IPv6 client is its /64)."""
    address = client_key(client_address(request))
    decision = request.app[LIMITER_KEY].take(address)
    if not decision.allowed:
        log.info("session rate limit hit by %s", address)
        raise TooManyRequests(
            "too many sessions created from this address; retry later", decision.retry_after_s
        )


def admit_session(request: web.Request) -> str:
    """Gate of session creation: the address's rate limit (429), then the token (401).
    Server tokens only: :func:`admit_session_key` also takes client secrets."""
    limit_session_rate(request)
    return authenticate(request)


@dataclass(frozen=True)
class SessionGrant:
    """Who creates a session: ``owner`` (a server token's digest; ``NO_OWNER`` with
    authentication off) and, when a client secret admitted it, the key's public ``key_id`` and
    its session configuration ``patch``."""

    owner: str
    patch: SessionPatch | None = None
    key_id: str | None = None

    def prepare(self, patch: SessionPatch | None = None) -> Callable[[Conversation], None]:
        """The ``prepare`` hook of :func:`create_session`: the key's configuration, then
        ``patch`` (the request's own, e.g. a form's ``session`` field); both validated."""

        def configure(conversation: Conversation) -> None:
            for each in (self.patch, patch):
                if each is not None:
                    conversation.configure(each)

        return configure


@contextmanager
def admit_session_key(request: web.Request) -> Iterator[SessionGrant]:
    """Gate of session creation that also takes client secrets (``Authorization: Bearer
    ek_...``, minted by ``POST /v1/realtime/client_secrets``): the address's rate limit (429),
    then a server token or an unexpired, unspent key (401). A key admits one session: it is
    spent when the block ends normally, and may be used again when the block raises (no session
    was created). Use the grant's owner and ``prepare`` for the session."""
    limit_session_rate(request)
    value = bearer_value(request.headers.get("Authorization"))
    if value is None or not value.startswith(SECRET_PREFIX):
        yield SessionGrant(authenticate(request))
        return
    store = request.app[SECRETS_KEY]
    secret = store.claim(value)
    if secret is None:  # not a key this server holds: a server token may begin so too
        if not request.app[AUTH_KEY].enabled:  # no tokens: any key admits, as any token does
            yield SessionGrant(authenticate(request))
            return
        try:
            owner = authenticate(request)
        except Unauthorized:
            raise Unauthorized("unknown or expired client secret") from None
        yield SessionGrant(owner)
        return
    try:
        yield SessionGrant(secret.owner, secret.patch, secret.key_id)
    except BaseException:
        store.release(secret)
        raise
    store.settle(secret)
    log.info("client secret %s used", secret.key_id[:8])


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The request body if it has at most ``limit`` bytes (413 otherwise; 400 if unreadable)."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"body larger than {limit} bytes")
    body = b""
    try:
        while len(body) <= limit:  # read() may return part of a body sent in pieces
            chunk = await request.content.read(limit + 1 - len(body))
            if not chunk:
                break
            body += chunk
    except web.RequestPayloadError:  # e.g. a Content-Encoding the body is not in
        raise BadRequest("cannot read the body (Content-Encoding or framing)") from None
    if len(body) > limit:
        raise PayloadTooLarge(f"body larger than {limit} bytes")
    return body


async def read_body(request: web.Request, content_type: str) -> str:
    """The request body as text if it has ``content_type`` and fits the size limit."""
    if request.content_type != content_type:
        raise UnsupportedMediaType(
            f"expected Content-Type {content_type}, got {request.content_type or 'none'}"
        )
    body = await read_limited(request, request.app[TRANSPORT_KEY].max_body_bytes)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body is not UTF-8") from None


def check_sdp(sdp: object, max_lines: int) -> str:
    """A cheap shape check before aiortc sees it: an SDP offer has v=0 and media sections,
    at most ``max_lines`` lines and ``MAX_MEDIA_SECTIONS`` media sections."""
    if not isinstance(sdp, str) or not sdp.strip():
        raise BadRequest("missing SDP")
    lines = sdp.strip().splitlines()
    if len(lines) > max_lines:
        raise PayloadTooLarge(f"SDP has {len(lines)} lines; at most {max_lines}")
    sections = sum(1 for line in lines if line.startswith("m="))
    if lines[0].strip() != "v=0" or not sections:
        raise BadRequest("malformed SDP: expected 'v=0' and at least one 'm=' line")
    if sections > MAX_MEDIA_SECTIONS:
        raise BadRequest(f"SDP has {sections} media sections; at most {MAX_MEDIA_SECTIONS}")
    return sdp


def _max_lines(request: web.Request) -> int:
    return request.app[TRANSPORT_KEY].max_sdp_lines


def candidate_filter(request: web.Request) -> CandidateFilter:
    """Which remote candidates this client may name (``transport.private_candidates``)."""
    policy = request.app[TRANSPORT_KEY].private_candidates
    return CandidateFilter.for_client(policy, client_address(request))


async def create_session(
    request: web.Request,
    sdp: str,
    owner: str,
    resume_token: str | None = None,
    prepare: Callable[[Conversation], None] | None = None,
    last_event: int | None = None,
) -> tuple[str, str]:
    """A session for the offer ``sdp``: its candidates filtered and counted before aiortc sees
    them (422 past the cap), then created within the client's share (``prepare``: sets up its
    conversation first); (session id, answer). With ``resume_token`` the offer resumes the
    conversation the token names instead (the new connection's candidates are counted
    afresh; ``last_event``: the number of the last event the client received)."""
    sdp, kept = filter_offer(sdp, candidate_filter(request))
    registry = request.app[REGISTRY_KEY]
    budget = CandidateBudget(request.app[TRANSPORT_KEY].max_remote_candidates)
    budget.admit(kept)
    if resume_token is not None:  # a new connection: its candidates counted on their own
        session_id, answer = await registry.resume(resume_token, sdp, owner, budget, last_event)
        return session_id, answer.sdp
    client = client_key(client_address(request))
    session_id, answer = await registry.create(sdp, owner, client, budget, prepare)
    return session_id, answer.sdp


def last_event(request: web.Request, field: object = None) -> int | None:
    """The number of the last event a resuming client received: the ``Avatar-Last-Event-Id``
    header, or (``/offer``) the body's ``last_event_id`` field; None when it does not say.
    BadRequest for anything but an ``event_id`` this server sends."""
    given = request.headers.get(LAST_EVENT_HEADER, field)
    return None if given is None else event_number(given)


def resume_token(request: web.Request, field: object = None) -> str | None:
    """The resume token a request presents: the ``Avatar-Resume-Token`` header, or (``/offer``)
    the body's ``resume_token`` field; None for a new session. BadRequest for two headers
    (proxies disagree on which one counts)."""
    if len(request.headers.getall(RESUME_HEADER, [])) > 1:
        raise BadRequest(f"one {RESUME_HEADER} header at most")
    token = request.headers.get(RESUME_HEADER)
    if token is None and field is not None:
        if not isinstance(field, str):
            raise BadRequest('"resume_token" must be a string')
        token = field
    return token


async def post_offer(request: web.Request) -> web.Response:
    """``{"sdp", "type": "offer"}`` -> ``{"sdp", "type": "answer", "session_id"}``."""
    with admit_session_key(request) as grant:
        text = await read_body(request, "application/json")
        try:
            data = load_json(text)
        except JsonRefused as exc:
            raise BadRequest(f"body: {exc}") from None
        if not isinstance(data, dict) or data.get("type") != "offer":
            raise BadRequest('expected a JSON object with "type": "offer"')
        sdp = check_sdp(data.get("sdp"), _max_lines(request))
        token = resume_token(request, data.get("resume_token"))
        after = last_event(request, data.get("last_event_id"))
        session_id, answer = await create_session(
            request, sdp, grant.owner, token, grant.prepare(), after
        )
    return web.json_response({"sdp": answer, "type": "answer", "session_id": session_id})


def _turn_withheld(request: web.Request) -> bool:
    """Whether this caller gets no TURN credentials: it has no token because none are
    configured, and transport.ice_anonymous_turn withholds them from such callers."""
    return not (request.app[AUTH_KEY].enabled or request.app[ANONYMOUS_TURN_KEY])


def _client_ice_servers(request: web.Request) -> tuple[IceServer, ...]:
    """The ICE servers for a client (issued TURN credentials are fresh for each request)."""
    servers = ice_servers(request.app[TRANSPORT_KEY], time.time(), "client")
    if _turn_withheld(request):
        return tuple(server for server in servers if not server.turn)
    return servers


def _ice_links(request: web.Request) -> list[tuple[str, str]]:
    return [("Link", link) for link in ice_server_links(_client_ice_servers(request))]


async def get_ice_servers(request: web.Request) -> web.Response:
    """``{"iceServers": [...]}`` for a browser's ``RTCPeerConnection``, asked before its offer
    (WHIP clients get the same in ``Link`` headers); needs the token when tokens are set.
    Without tokens, ``403`` where transport.ice_anonymous_turn withholds TURN credentials."""
    authenticate(request)
    turn = any(url.startswith(TURN_SCHEMES) for url in request.app[TRANSPORT_KEY].ice_urls)
    if turn and _turn_withheld(request):
        raise TurnNeedsToken(
            "TURN credentials need a bearer token: set server.auth_tokens "
            "(or transport.ice_anonymous_turn=allow)"
        )
    servers = [server.to_json() for server in _client_ice_servers(request)]
    return web.json_response({"iceServers": servers}, headers={"Cache-Control": "no-store"})


async def options_ice_servers(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": "OPTIONS, GET"})


async def post_whip(request: web.Request) -> web.Response:
    """WHIP (RFC 9725): SDP offer in, 201 with the SDP answer and the resource's Location."""
    with admit_session_key(request) as grant:
        sdp = check_sdp(await read_body(request, SDP_TYPE), _max_lines(request))
        token, after = resume_token(request), last_event(request)
        session_id, answer = await create_session(
            request, sdp, grant.owner, token, grant.prepare(), after
        )
    ufrag = ice_ufrag(sdp)
    headers = CIMultiDict(
        [
            ("Location", f"/whip/{session_id}"),
            ("ETag", entity_tag(session_id, ufrag or "")),
            ("Accept-Patch", SDPFRAG_TYPE),
            *_ice_links(request),
        ]
    )
    return web.Response(status=201, body=answer.encode(), content_type=SDP_TYPE, headers=headers)


def limit_patch_rate(request: web.Request, session_id: str) -> None:
    """The per-session PATCH rate limit: 429 (with Retry-After) when the session is over it."""
    decision = request.app[PATCH_LIMITER_KEY].take(session_id)
    if not decision.allowed:
        log.info("session %s: trickle PATCH rate limit hit", session_id[:8])
        raise TooManyRequests(
            "too many PATCH requests for this session; retry later", decision.retry_after_s
        )


async def patch_whip(request: web.Request) -> web.Response:
    """Trickle ICE: the client's later candidates (``204``). ICE restarts: ``422``; past the
    session's candidate cap: ``422``; past its PATCH rate: ``429``. A refused PATCH adds
    nothing; candidates the filter drops are left out silently (the server would never
    reach them)."""
    caller = authenticate(request)
    registry = request.app[REGISTRY_KEY]
    session_id = request.match_info["session_id"]
    peer = registry.get(session_id)
    check_owner(peer.owner, caller)
    limit_patch_rate(request, session_id)
    text = await read_body(request, SDPFRAG_TYPE)
    remote = peer.pc.remoteDescription
    ufrag = ice_ufrag(remote.sdp if remote is not None else "")
    etag = entity_tag(session_id, ufrag or "")
    if not if_match_allows(request.headers.get("If-Match"), etag):
        raise PreconditionFailed(f"If-Match does not match the resource's ETag {etag}")
    fragment = parse_sdpfrag(text, _max_lines(request))
    if is_ice_restart(fragment, ufrag):
        raise UnprocessableContent(
            "ICE restarts are not supported (aiortc cannot restart ICE): end this session "
            "with DELETE and POST a new offer",
            {"ETag": etag},
        )
    if fragment.candidate_count and remote_candidates_complete(peer.pc):
        raise UnprocessableContent("the client already signalled end-of-candidates")
    mids = {t.mid for t in peer.pc.getTransceivers()} | {None}
    if peer.pc.sctp is not None:
        mids.add(peer.pc.sctp.mid)
    for media in fragment.media:
        if media.mid not in mids:
            raise BadRequest(f"the session has no media section with mid {media.mid!r}")
    allowed = candidate_filter(request)
    kept = [tuple(c for c in m.candidates if allowed.allows(c)) for m in fragment.media]
    registry.candidates(session_id).admit(c for cs in kept for c in cs)  # 422 past the cap
    added = 0
    for media, candidates in zip(fragment.media, kept, strict=True):
        try:
            added += await add_remote_candidates(
                peer.pc,
                candidates,
                mid=media.mid,
                mline_index=media.mline_index,
                end_of_candidates=media.end_of_candidates,
            )
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    dropped = fragment.candidate_count - sum(len(cs) for cs in kept)
    log.info("session %s: %d trickled candidates (%d dropped)", session_id[:8], added, dropped)
    return web.Response(status=204, headers={"ETag": etag})


async def delete_whip(request: web.Request) -> web.Response:
    """End the session: 404 for an unknown id, 403 for a token other than its creator's."""
    caller = authenticate(request)
    registry = request.app[REGISTRY_KEY]
    session_id = request.match_info["session_id"]
    check_owner(registry.owner_of(session_id), caller)
    await registry.close(session_id)
    return web.Response(status=200)


async def options_whip(request: web.Request) -> web.Response:
    """The endpoint's methods; its ICE servers too, for callers who may use them."""
    headers: CIMultiDict[str] = CIMultiDict([("Allow", "OPTIONS, POST"), ("Accept-Post", SDP_TYPE)])
    try:
        authenticate(request)
    except RequestError:
        pass  # a browser preflight carries no token: no TURN credentials for it
    else:
        headers.extend(_ice_links(request))
    return web.Response(status=204, headers=headers)


async def options_resource(request: web.Request) -> web.Response:
    return web.Response(
        status=204, headers={"Allow": "OPTIONS, PATCH, DELETE", "Accept-Patch": SDPFRAG_TYPE}
    )


async def options_offer(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={"Allow": "OPTIONS, POST"})


def add_session_limit(app: web.Application, config: Config) -> None:
    """What ``limit_session_rate`` needs: the rate limiter and the proxies trusted to name the
    client (server/fleet/router.py keeps the limit too, once for all workers)."""
    app[PROXIES_KEY] = TrustedProxies.parse(config.server.trusted_proxies)
    app[LIMITER_KEY] = RateLimiter(
        config.transport.session_rate_per_min,
        config.transport.session_burst,
        MonotonicClock(),
    )


def add_routes(app: web.Application, config: Config) -> None:
    """Signaling routes and what they need: limits, tokens, origins, the rate limiter."""
    app[TRANSPORT_KEY] = config.transport
    app[AUTH_KEY] = BearerAuth(config.server.auth_tokens)
    app[ANONYMOUS_TURN_KEY] = anonymous_turn(
        config.transport.ice_anonymous_turn, config.server.host
    )
    app[CORS_KEY] = CorsPolicy(config.server.cors_origins)
    add_session_limit(app, config)
    app[PATCH_LIMITER_KEY] = RateLimiter(
        config.transport.patch_rate_per_min, config.transport.patch_burst, MonotonicClock()
    )
    app.router.add_get("/ice-servers", get_ice_servers)
    app.router.add_route("OPTIONS", "/ice-servers", options_ice_servers)
    app.router.add_post("/offer", post_offer)
    app.router.add_route("OPTIONS", "/offer", options_offer)
    app.router.add_post("/whip", post_whip)
    app.router.add_route("OPTIONS", "/whip", options_whip)
    app.router.add_patch("/whip/{session_id}", patch_whip)
    app.router.add_delete("/whip/{session_id}", delete_whip)
    app.router.add_route("OPTIONS", "/whip/{session_id}", options_resource)
