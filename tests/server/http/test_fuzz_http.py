"""Fuzz of the HTTP surface: generated bad requests against the real server over loopback.

Hypothesis draws methods, paths, headers and bodies (JSON garbage, broken SDP offers, wrong
content types, bodies over the limit, bad UTF-8). Every answer to a bad
request must be a 4xx with a JSON ``{"error": ...}`` body, never a 5xx, never a session; a real
peer connected all along must not notice (its id never shows, it still gets replies); the
server's tasks and descriptors end where they began. Requests go out over a raw socket so that
anything HTTP allows can be sent; malformed HTTP framing has a test of its own (aiohttp's
parser answers those before the application, in plain text), and so do bodies that are not
in the Content-Encoding they claim: aiohttp decodes while it parses, so whether the parser or
the handler notices first depends on how the bytes arrive.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.cli import ClientPeer
from server.rtc.settings import pin_host_addresses
from tests.support.loop_thread import LoopThread
from tests.support.peers import Peer
from tests.support.server_process import (
    ROOT,
    TONE_PIPELINE,
    ServerProcess,
    server_process,
    tone_env,
)

REQUESTS = 1200  # examples; each sends one request (>= 1000 of them bad ones)
FRAMING_REQUESTS = 200
MAX_BODY = 65_536
SOCKET_TIMEOUT_S = 15.0
SAFE_GETS = {"/", "/healthz", "/metrics"}
RESOURCE_PATHS = ("/offer", "/whip")
STATIC_FILES = {p.name for p in (ROOT / "web").glob("*") if p.is_file()}
TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
URL_SAFE = string.ascii_letters + string.digits + "-_"
VISIBLE = "".join(chr(c) for c in range(0x21, 0x7F))
FRAMING_HEADERS = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "content-type",
    "content-encoding",
    "expect",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "http2-settings",
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes = field(repr=False)


def send_raw(port: int, data: bytes, idle_s: float | None = None) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it, or (with
    ``idle_s``) until it has been quiet that long: a request it took as complete and valid
    keeps the connection open for the next one."""
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as sock:
        # the server may answer early (413) and stop reading: then read its answer
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        sock.settimeout(idle_s or SOCKET_TIMEOUT_S)
        chunks: list[bytes] = []
        try:
            while chunk := sock.recv(65_536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        except TimeoutError:
            if idle_s is None:
                raise
    return b"".join(chunks)


def parse_response(raw: bytes) -> Response:
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete HTTP response: {raw[:200]!r}"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return Response(status, headers, body, raw)


def encode(request: Request, port: int) -> bytes:
    head = [
        f"{request.method} {request.path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: close",
        f"Content-Length: {len(request.body)}",
        *(f"{name}: {value}" for name, value in request.headers),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + request.body


def broken_offers(sdp: str) -> list[str]:
    """Mutations of a real offer that the server must refuse, whatever media it offers (each
    checked against aiortc: missing ICE credentials, no media, no version line, bad port, bad
    setup role, bad rtpmap, only unknown codecs, unknown media kind, no codecs, bad ssrc).
    aiortc accepts duplicate mids and payload types over 127 in some offers: not used."""

    def sub(pattern: str, repl: str) -> str:
        return re.sub(pattern, repl, sdp, flags=re.M)

    def drop(prefix: str) -> str:
        return "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith(prefix))

    return [
        drop("a=ice-ufrag"),
        drop("a=ice-pwd"),
        drop("m="),
        drop("v=0"),
        sub(r"^m=audio \d+", "m=audio abc"),
        sub(r"^a=setup:\w+", "a=setup:bogus"),
        sub(r"^a=rtpmap:(\d+) .*$", r"a=rtpmap:\1 x"),
        sub(r"^a=rtpmap:(\d+) .*$", r"a=rtpmap:\1 foo/8000"),
        sub(r"^m=audio", "m=text"),
        sub(r"^(m=\w+ \d+ \S+).*$", r"\1 "),
        sub(r"^a=ssrc:\d+", "a=ssrc:xyz"),
    ]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def damaged(offers: list[str]) -> st.SearchStrategy[str]:
    """A refused offer, sometimes with extra garbage lines that cannot repair it."""
    garbage_line = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=60)

    def insert(sdp: str, at: int, lines: list[str]) -> str:
        parts = sdp.split("\r\n")
        at = at % (len(parts) + 1)
        return "\r\n".join([*parts[:at], *lines, *parts[at:]])

    base = st.sampled_from(offers)
    return base | st.builds(insert, base, st.integers(0, 200), st.lists(garbage_line, max_size=3))


def sdp_garbage(offers: list[str]) -> st.SearchStrategy[str]:
    lines = st.lists(st.text(VISIBLE + " =", max_size=40), max_size=8)
    return st.one_of(
        damaged(offers),
        st.text(max_size=300),
        lines.map(lambda ls: "v=0\r\n" + "\r\n".join(ls)),  # no media section
        st.just(""),
    )


def bodies(offers: list[str]) -> st.SearchStrategy[bytes]:
    sdp = sdp_garbage(offers)
    offer_objects = st.fixed_dictionaries(
        {"type": st.just("offer") | json_values, "sdp": sdp | json_values},
        optional={"session_id": st.text(max_size=40), "extra": json_values},
    )
    return st.one_of(
        st.just(b""),
        offer_objects.map(lambda o: json.dumps(o).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        sdp.map(str.encode),
        st.binary(max_size=2000),
        st.binary(min_size=1, max_size=200).map(lambda b: b"\xff\xfe\xc3" + b),  # bad UTF-8
        st.integers(MAX_BODY + 1, 6 * MAX_BODY).map(lambda n: b"{" * n),  # over the limit
        st.text(max_size=200).map(lambda t: t.encode("utf-16")),
    )


content_types = st.one_of(
    st.sampled_from(
        [
            "application/json",
            "application/sdp",
            "application/trickle-ice-sdpfrag",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=utf-16",
            "APPLICATION/SDP",
            "*/*",
            "",
        ]
    ),
    st.text(TOKEN + "/;= ", max_size=40).map(str.strip),
)
header_names = st.text(TOKEN, min_size=1, max_size=20).filter(
    lambda n: n.lower() not in FRAMING_HEADERS
)
header_values = st.text(VISIBLE + " ", max_size=80).map(str.strip)
authorization = st.sampled_from(["Bearer ", "Basic ", "bearer ", ""]).flatmap(
    lambda scheme: st.text(VISIBLE, max_size=60).map(lambda t: scheme + t)
)
origins = st.sampled_from(["http://evil.example", "null", "https://127.0.0.1.evil", "file://"])
# the methods llhttp (aiohttp's parser) knows; any other token is a framing error
methods = st.sampled_from(
    [
        *("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE"),
        *("COPY", "LOCK", "MKCOL", "MOVE", "PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK"),
        *("REPORT", "MKACTIVITY", "CHECKOUT", "MERGE", "M-SEARCH", "NOTIFY", "SUBSCRIBE"),
        *("UNSUBSCRIBE", "PURGE", "MKCALENDAR", "LINK", "UNLINK", "SOURCE", "QUERY"),
    ]
)
segments = st.text(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@", max_size=20)
session_ids = st.text(URL_SAFE, max_size=64)
paths = st.one_of(
    st.sampled_from(
        [
            "/offer",
            "/whip",
            "/whip/",
            "/offer/",
            "//offer",
            "/OFFER",
            "/debug/sessions",
            "/static/",
            "/static/../server/config.py",
            "/static/%2e%2e/%2e%2e/etc/passwd",
            "/static/..%2f..%2fpyproject.toml",
            "/%00",
            "/%zz",
            "/whip/%00",
            "/whip/..%2f..%2fhealthz",
        ]
    ),
    session_ids.map(lambda s: "/whip/" + s),
    st.lists(segments, max_size=5).map(lambda segs: "/" + "/".join(segs)),
    st.integers(100, 6000).map(lambda n: "/" + "a" * n),
)
queries = st.text(string.ascii_letters + string.digits + "=&%+-_.", max_size=60)


def requests(offers: list[str]) -> st.SearchStrategy[Request]:
    extra_headers = st.lists(st.tuples(header_names, header_values), max_size=4)

    @st.composite
    def build(draw: st.DrawFn) -> Request:
        shape = draw(st.sampled_from(["offer", "whip", "sdp", "resource", "anything"]))
        body: bytes | None = None
        if shape == "sdp":  # well-formed requests whose offer aiortc itself must refuse
            sdp = draw(damaged(offers))
            if draw(st.booleans()):
                method, path, ctype = "POST", "/offer", "application/json"
                body = json.dumps({"type": "offer", "sdp": sdp}).encode()
            else:
                method, path, ctype = "POST", "/whip", "application/sdp"
                body = sdp.encode()
        elif shape == "offer":
            method, path = "POST", "/offer"
            ctype = draw(st.just("application/json") | content_types)
        elif shape == "whip":
            method, path = "POST", "/whip"
            ctype = draw(st.just("application/sdp") | content_types)
        elif shape == "resource":
            method = draw(st.sampled_from(["DELETE", "PATCH", "GET", "POST", "OPTIONS", "PUT"]))
            path = "/whip/" + draw(session_ids)
            ctype = draw(st.just("application/trickle-ice-sdpfrag") | content_types)
        else:
            method, path, ctype = draw(methods), draw(paths), draw(content_types)
        if draw(st.booleans()):
            path += "?" + draw(queries)
        headers = [("Content-Type", ctype)] if ctype else []
        if draw(st.integers(0, 3)) == 3:
            headers.append(("Authorization", draw(authorization)))
        if draw(st.integers(0, 5)) == 5:
            headers.append(("Origin", draw(origins)))
        headers += draw(extra_headers)
        if body is None:
            body = draw(bodies(offers))
        return Request(method, path, tuple(headers), body)

    return build()


def is_legitimate(request: Request, response: Response) -> bool:
    """A request that is not bad after all: a page, health, metrics, or a CORS preflight."""
    bare = urlsplit(request.path).path
    if request.method in ("GET", "HEAD") and response.status == 200:
        if bare in SAFE_GETS:
            return True
        return bare.startswith("/static/") and bare.removeprefix("/static/") in STATIC_FILES
    is_endpoint = bare in RESOURCE_PATHS or bare.startswith("/whip/")
    return request.method == "OPTIONS" and response.status in (200, 204) and is_endpoint


@dataclass
class Tally:
    bad: int = 0
    legitimate: int = 0
    refused_by_aiortc: int = 0  # got as far as setRemoteDescription
    statuses: dict[int, int] = field(default_factory=dict)


server = server_process(
    {
        "transport.max_sessions": "4",
        "transport.connect_timeout_s": "3",  # any offer let through is soon closed
        "transport.session_rate_per_min": "0",  # the fuzz is one address: no rate limit
    },
    pipeline=TONE_PIPELINE,
    env=tone_env(500, sentences=1),
)


@pytest.fixture(scope="module")
def victim(server: ServerProcess) -> Iterator[tuple[LoopThread, ClientPeer]]:
    """A real peer connected during the whole fuzz, on a loop of its own."""
    pin_host_addresses(["127.0.0.1"])
    with LoopThread() as loop:

        async def connect() -> ClientPeer:
            peer = Peer(server.url, video=False)
            await peer.connect()
            return peer

        peer = loop.run(connect(), 30)
        yield loop, peer
        loop.run(peer.close(), 30)


def settle(server: ServerProcess, tasks: int, fds: int, timeout_s: float = 10) -> dict[str, Any]:
    """Health once tasks and descriptors are back to at most ``tasks``, ``fds``."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = server.health()
        done = health["tasks"] <= tasks and health["open_fds"] <= fds
        if done or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def still_answers(loop: LoopThread, peer: ClientPeer) -> str:
    async def ask() -> str:
        n = len(peer.events)
        peer.send({"type": "conversation.item.create", "text": "are you still there?"})
        return str((await peer.wait_event("response.done", timeout=15, after=n))["status"])

    return loop.run(ask(), 30)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_fuzzed_bad_requests_get_json_4xx_and_change_nothing(
    server: ServerProcess, victim: tuple[LoopThread, ClientPeer]
) -> None:
    loop, peer = victim
    secret = str(peer.session_id)
    offers = broken_offers(peer.pc.localDescription.sdp)
    before = server.health()
    assert before["sessions"] == 1
    tally = Tally()
    started = time.monotonic()

    @settings(
        max_examples=REQUESTS,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests(offers))
    def check(request: Request) -> None:
        response = parse_response(send_raw(server.port, encode(request, server.port)))
        tally.statuses[response.status] = tally.statuses.get(response.status, 0) + 1
        assert response.status < 500, (request, response.raw[:500])
        assert secret.encode() not in response.raw  # no other session ever shows
        if is_legitimate(request, response):
            tally.legitimate += 1
            return
        tally.bad += 1
        assert 400 <= response.status < 500, (request, response.raw[:500])
        assert response.headers.get("content-type", "").startswith("application/json")
        if request.method != "HEAD":
            error = json.loads(response.body)["error"]
            assert isinstance(error, str) and error, response.body
            tally.refused_by_aiortc += error.startswith("cannot use this SDP offer")

    check()
    after = settle(server, before["tasks"], before["open_fds"])
    print(
        "http fuzz:",
        json.dumps(
            {
                "requests": tally.bad + tally.legitimate,
                "bad": tally.bad,
                "legitimate": tally.legitimate,
                "refused_by_aiortc": tally.refused_by_aiortc,
                "statuses": dict(sorted(tally.statuses.items())),
                "tasks": [before["tasks"], after["tasks"]],
                "open_fds": [before["open_fds"], after["open_fds"]],
                "seconds": round(time.monotonic() - started, 1),
            }
        ),
    )
    assert tally.bad >= 1000
    assert after["sessions"] == 1  # none was made, the one there was kept
    assert after["tasks"] <= before["tasks"]
    assert after["open_fds"] <= before["open_fds"]
    assert still_answers(loop, peer) == "completed"


FRAMING = [
    b"GARBAGE\r\n\r\n",
    b"GET / FOO\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET /healthz HTTP/1.1\nHost: x\n\n",
    b"GET /healthz HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nBad Header\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    b"POST /offer HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    b"POST /offer HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /offer HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"POST /offer HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /offer HTTP/1.1\r\nTransfer-Encoding: bogus\r\n\r\nabc",
    b"POST /offer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\nabc\r\n",
    b"POST /offer HTTP/1.1\r\nContent-Encoding: br\r\nContent-Length: 3\r\n\r\nabc",
    b"PRI /offer HTTP/1.1\r\n\r\n",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(1000)) + b"\r\n",
]


def compressed_garbage(encoding: str, body: bytes) -> bytes:
    """A body that is not in the Content-Encoding it claims (aiohttp decodes while parsing)."""
    head = (
        f"POST /offer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Encoding: {encoding}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def test_malformed_http_framing_is_refused_and_the_server_keeps_serving(
    server: ServerProcess,
) -> None:
    """Framing errors are answered by aiohttp's HTTP parser before any handler runs: 4xx, in
    plain text (the only answers that are not JSON), and the connection is closed."""
    before = server.health()
    statuses: dict[int, int] = {}

    @settings(max_examples=FRAMING_REQUESTS, deadline=None, derandomize=True, database=None)
    @given(
        st.one_of(
            st.sampled_from(FRAMING),
            st.builds(
                compressed_garbage, st.sampled_from(["gzip", "deflate", "br", "x"]), st.binary()
            ),
            st.text(string.ascii_uppercase, min_size=1, max_size=10).map(
                lambda m: f"{m} /offer HTTP/1.1\r\n\r\n".encode()  # methods llhttp refuses
            ),
            st.binary(min_size=1, max_size=300).map(lambda b: b + b"\r\n\r\n"),
            st.binary(min_size=1, max_size=100).map(
                lambda b: b"GET /healthz HTTP/1.1\r\n" + b.replace(b"\n", b"") + b"\r\n\r\n"
            ),
        )
    )
    def check(data: bytes) -> None:
        raw = send_raw(server.port, data, idle_s=1.0)
        if not raw:
            return  # nothing parseable arrived (e.g. bare line breaks): closed, no answer
        response = parse_response(raw)
        statuses[response.status] = statuses.get(response.status, 0) + 1
        assert response.status < 500, (data[:200], raw[:300])

    check()
    after = settle(server, before["tasks"], before["open_fds"])
    print("framing fuzz:", json.dumps({"statuses": dict(sorted(statuses.items()))}))
    assert after["sessions"] == before["sessions"]
    assert after["tasks"] <= before["tasks"]
