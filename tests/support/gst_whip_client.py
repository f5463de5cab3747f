"""A WHIP client on GStreamer's ``webrtcbin``: a third-party WebRTC stack against ``/whip``.

Run it with the system Python, which has GStreamer's introspection bindings (``gi``); the
project's virtual environment has none, so tests start it as a subprocess::

    /usr/bin/python3 tests/support/gst_whip_client.py --url http://127.0.0.1:8080 \\
        --wav speech.wav --video --duration 8 --local-ip 127.0.0.1

It publishes Opus audio (a 48 kHz WAV, paced in real time) and optionally VP8 video (a test
pattern), with ``bundle-policy=max-bundle``. ``--receive`` chooses how it asks for the server's
tracks: ``sendrecv`` (one m-line per kind), ``recvonly`` (extra receive-only m-lines) or ``none``
(a pure publisher). With ``--trickle`` the offer goes out at once and the candidates follow in
PATCH requests (``application/trickle-ice-sdpfrag``); otherwise after ICE gathering completes.

Everything it learns is printed to stdout as JSON lines (``{"event": ...}``); the last one is
``{"event": "report", ...}`` with the connection state, connect time (ms from the POST to
``connected``) and per-kind counts of received RTP packets and decoded frames.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import gi  # type: ignore[import-not-found]

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # type: ignore[import-not-found]  # noqa: E402

OPUS_PT = 111
VP8_PT = 96
HTTP_TIMEOUT_S = 10


_STDOUT_LOCK = threading.Lock()  # GStreamer calls back from its streaming threads too


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, whole, whichever thread emits it."""
    line = json.dumps({"event": event, **fields}) + "\n"
    with _STDOUT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


@dataclass
class Received:
    """What arrived for one media kind: RTP packets and decoded frames."""

    rtp: int = 0
    decoded: int = 0
    first_rtp_ms: float | None = None


@dataclass
class Report:
    connection: str = "new"
    ice_connection: str = "new"
    connect_ms: float | None = None
    answer_ms: float | None = None
    location: str | None = None
    etag: str | None = None
    links: list[str] = field(default_factory=list)
    patches: list[int] = field(default_factory=list)
    delete_status: int | None = None
    received: dict[str, Received] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def configure_ice_agent(webrtc: Any, addresses: list[str]) -> None:
    """Gather host candidates on ``addresses`` only (libnice skips loopback otherwise) and
    without ICE-TCP (aiortc has none).

    Reading webrtcbin's ``ice-agent`` property through PyGObject frees the agent in GStreamer
    1.22 (its getter hands out a reference that PyGObject drops twice: a crash at the first
    offer), so the property is read and the agent's ``add-local-ip-address`` signal emitted
    through GObject's C API.
    """
    gobject = ctypes.CDLL("libgobject-2.0.so.0")
    capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    capsule_pointer.restype = ctypes.c_void_p
    capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    element = capsule_pointer(webrtc.__gpointer__, None)
    agent = ctypes.c_void_p()
    gobject.g_object_get.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    gobject.g_object_get(element, b"ice-agent", ctypes.byref(agent), None)
    gobject.g_object_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    gobject.g_object_set(agent, b"ice-tcp", 0, None)
    gobject.g_signal_emit_by_name.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_int),
    ]
    for address in addresses:
        added = ctypes.c_int(0)
        gobject.g_signal_emit_by_name(
            agent, b"add-local-ip-address", address.encode(), ctypes.byref(added)
        )
        if not added.value:
            raise ValueError(f"libnice refused the local address {address!r}")
    gobject.g_object_unref.argtypes = [ctypes.c_void_p]
    gobject.g_object_unref(agent)


def media_directions(sdp: str) -> list[str]:
    """``kind:direction`` of each media section of an SDP, e.g. ``audio:sendrecv``."""
    out: list[str] = []
    for line in sdp.splitlines():
        if line.startswith("m="):
            out.append(line[2:].split()[0] + ":sendrecv")
        elif out and line[2:] in ("sendrecv", "sendonly", "recvonly", "inactive"):
            out[-1] = out[-1].split(":")[0] + ":" + line[2:]
    return out


def build_pipeline(args: argparse.Namespace) -> str:
    parts = [
        "webrtcbin name=webrtc bundle-policy=max-bundle latency=40",
        f"filesrc location={args.wav} ! wavparse ! audioconvert ! audioresample ! "
        "audio/x-raw,rate=48000,channels=1 ! clocksync ! "
        f"opusenc frame-size=20 ! rtpopuspay pt={OPUS_PT} ! "
        f"application/x-rtp,media=audio,encoding-name=OPUS,payload={OPUS_PT} ! webrtc.",
    ]
    if args.video:
        parts.append(
            "videotestsrc is-live=true pattern=ball ! "
            "video/x-raw,width=320,height=240,framerate=15/1 ! videoconvert ! "
            "vp8enc deadline=1 target-bitrate=300000 keyframe-max-dist=30 ! "
            f"rtpvp8pay pt={VP8_PT} ! "
            f"application/x-rtp,media=video,encoding-name=VP8,payload={VP8_PT} ! webrtc."
        )
    return " ".join(parts)


class WhipClient:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.report = Report()
        self.loop = GLib.MainLoop()
        self.pipe = Gst.parse_launch(build_pipeline(args))
        self.webrtc = self.pipe.get_by_name("webrtc")
        self.t_post: float | None = None
        self.t0 = time.monotonic()
        self.ufrag = ""
        self.pwd = ""
        self.mid = "0"
        self.pending: list[tuple[int, str]] = []  # trickle candidates before the answer
        self.lock = threading.Lock()
        self.answered = False
        configure_ice_agent(self.webrtc, args.local_ip)
        self.webrtc.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.webrtc.connect("on-ice-candidate", self.on_ice_candidate)
        self.webrtc.connect("notify::ice-gathering-state", self.on_gathering)
        self.webrtc.connect("notify::connection-state", self.on_connection)
        self.webrtc.connect("notify::ice-connection-state", self.on_ice_connection)
        self.webrtc.connect("pad-added", self.on_pad_added)
        bus = self.pipe.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self.on_error)

    # --- helpers ---------------------------------------------------------------------------
    def elapsed_ms(self) -> float:
        return round((time.monotonic() - (self.t_post or self.t0)) * 1000, 1)

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        out = {}
        if content_type:
            out["Content-Type"] = content_type
        if self.args.token:
            out["Authorization"] = f"Bearer {self.args.token}"
        return out

    def request(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], list[str], str]:
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
                return (
                    resp.status,
                    dict(resp.headers),
                    resp.headers.get_all("Link") or [],
                    resp.read().decode(),
                )
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), [], exc.read().decode()

    def fail(self, message: str) -> None:
        self.report.errors.append(message)
        emit("error", message=message)
        self.loop.quit()

    # --- negotiation -----------------------------------------------------------------------
    def add_receive_transceivers(self) -> None:
        """Receive-only m-lines for the server's tracks (``--receive recvonly``)."""
        recvonly = GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY
        audio = Gst.Caps.from_string(
            f"application/x-rtp,media=audio,encoding-name=OPUS,payload={OPUS_PT},clock-rate=48000"
        )
        self.webrtc.emit("add-transceiver", recvonly, audio)
        if self.args.video:
            video = Gst.Caps.from_string(
                f"application/x-rtp,media=video,encoding-name=VP8,payload={VP8_PT},clock-rate=90000"
            )
            self.webrtc.emit("add-transceiver", recvonly, video)

    def set_send_directions(self) -> None:
        """The publishing transceivers: sendrecv when the server's tracks come back on them."""
        direction = (
            GstWebRTC.WebRTCRTPTransceiverDirection.SENDRECV
            if self.args.receive == "sendrecv"
            else GstWebRTC.WebRTCRTPTransceiverDirection.SENDONLY
        )
        index = 0
        while True:
            transceiver = self.webrtc.emit("get-transceiver", index)
            if transceiver is None:
                break
            if transceiver.get_property("direction") != (
                GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY
            ):
                transceiver.set_property("direction", direction)
            index += 1

    def on_negotiation_needed(self, element: Any) -> None:
        self.set_send_directions()
        promise = Gst.Promise.new_with_change_func(self.on_offer_created, None)
        element.emit("create-offer", None, promise)

    def on_offer_created(self, promise: Any, _: Any) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer")
        self.webrtc.emit("set-local-description", offer, Gst.Promise.new())
        text = offer.sdp.as_text()
        for line in reversed(text.splitlines()):  # the first m-line's values win
            if line.startswith("a=ice-ufrag:"):
                self.ufrag = line.split(":", 1)[1].strip()
            elif line.startswith("a=ice-pwd:"):
                self.pwd = line.split(":", 1)[1].strip()
            elif line.startswith("a=mid:"):
                self.mid = line.split(":", 1)[1].strip()
        if self.args.trickle:
            GLib.idle_add(self.post_offer, text)

    def on_gathering(self, element: Any, _: Any) -> None:
        state = element.get_property("ice-gathering-state")
        emit("ice-gathering", state=state.value_nick, ms=self.elapsed_ms())
        if state != GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            return
        if self.args.trickle:
            GLib.idle_add(self.send_end_of_candidates)
        else:
            text = element.get_property("local-description").sdp.as_text()
            GLib.idle_add(self.post_offer, text)

    def post_offer(self, sdp: str) -> bool:
        if self.t_post is not None:
            return False
        self.t_post = time.monotonic()
        emit(
            "post",
            candidates=sdp.count("a=candidate:"),
            trickle=self.args.trickle,
            media=media_directions(sdp),
        )
        status, headers, links, body = self.request(
            "POST", f"{self.args.url}/whip", sdp.encode(), self.headers("application/sdp")
        )
        self.report.answer_ms = self.elapsed_ms()
        if status != 201:
            self.fail(f"POST /whip answered {status}: {body}")
            return False
        self.report.location = urllib.parse.urljoin(
            self.args.url + "/whip", headers.get("Location", "")
        )
        self.report.etag = headers.get("ETag")
        self.report.links = links
        emit(
            "answer",
            status=status,
            location=self.report.location,
            etag=self.report.etag,
            content_type=headers.get("Content-Type"),
            media=media_directions(body),
            ms=self.report.answer_ms,
        )
        res, msg = GstSdp.SDPMessage.new_from_text(body)
        if res != GstSdp.SDPResult.OK:
            self.fail("cannot parse the SDP answer")
            return False
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, msg)
        self.webrtc.emit("set-remote-description", answer, Gst.Promise.new())
        with self.lock:
            self.answered = True
            pending, self.pending = self.pending, []
        for mline, candidate in pending:
            self.patch_candidate(mline, candidate)
        return False

    # --- trickle ICE -----------------------------------------------------------------------
    def on_ice_candidate(self, _: Any, mline: int, candidate: str) -> None:
        if not self.args.trickle:
            return
        with self.lock:
            if not self.answered:
                self.pending.append((mline, candidate))
                return
        GLib.idle_add(self.patch_candidate, mline, candidate)

    def sdpfrag(self, lines: list[str]) -> str:
        head = [
            f"a=ice-ufrag:{self.ufrag}",
            f"a=ice-pwd:{self.pwd}",
            "m=audio 9 UDP/TLS/RTP/SAVPF 0",
            f"a=mid:{self.mid}",
        ]
        return "\r\n".join(head + lines) + "\r\n"

    def patch(self, lines: list[str]) -> None:
        if self.report.location is None:
            return
        headers = self.headers("application/trickle-ice-sdpfrag")
        if self.report.etag:
            headers["If-Match"] = self.report.etag
        status, _, _, body = self.request(
            "PATCH", self.report.location, self.sdpfrag(lines).encode(), headers
        )
        self.report.patches.append(status)
        emit("patch", status=status, lines=len(lines), body=body[:200])

    def patch_candidate(self, mline: int, candidate: str) -> bool:
        if mline == 0:  # max-bundle: only the first m-line gathers
            self.patch([f"a={candidate}"])
        return False

    def send_end_of_candidates(self) -> bool:
        with self.lock:
            answered = self.answered
        if not answered:
            GLib.timeout_add(20, self.send_end_of_candidates)
            return False
        self.patch(["a=end-of-candidates"])
        return False

    # --- state and media -------------------------------------------------------------------
    def on_connection(self, element: Any, _: Any) -> None:
        state = element.get_property("connection-state")
        self.report.connection = state.value_nick
        if state == GstWebRTC.WebRTCPeerConnectionState.CONNECTED:
            self.report.connect_ms = self.elapsed_ms()
        emit("connection", state=state.value_nick, ms=self.elapsed_ms())
        if state == GstWebRTC.WebRTCPeerConnectionState.FAILED:
            self.fail("connection failed")

    def on_ice_connection(self, element: Any, _: Any) -> None:
        state = element.get_property("ice-connection-state")
        self.report.ice_connection = state.value_nick
        emit("ice-connection", state=state.value_nick, ms=self.elapsed_ms())

    def on_pad_added(self, _: Any, pad: Any) -> None:
        if pad.direction != Gst.PadDirection.SRC:
            return
        caps = pad.get_current_caps() or pad.query_caps(None)
        media = caps.get_structure(0).get_string("media") or "unknown"
        received = self.report.received.setdefault(media, Received())
        emit("track", kind=media, ms=self.elapsed_ms())
        chain = (
            "rtpopusdepay ! opusdec ! fakesink sync=false"
            if media == "audio"
            else "rtpvp8depay ! vp8dec ! fakesink sync=false"
        )
        sink = Gst.parse_bin_from_description(chain, True)
        self.pipe.add(sink)
        sink.sync_state_with_parent()
        pad.link(sink.get_static_pad("sink"))

        def count_rtp(_pad: Any, _info: Any) -> Any:
            if received.first_rtp_ms is None:
                received.first_rtp_ms = self.elapsed_ms()
            received.rtp += 1
            return Gst.PadProbeReturn.OK

        def count_decoded(_pad: Any, _info: Any) -> Any:
            received.decoded += 1
            return Gst.PadProbeReturn.OK

        pad.add_probe(Gst.PadProbeType.BUFFER, count_rtp)
        decoder = sink.iterate_elements()
        while True:
            ok, element = decoder.next()
            if ok != Gst.IteratorResult.OK:
                break
            name = element.get_factory().get_name()
            if name in ("opusdec", "vp8dec"):
                element.get_static_pad("src").add_probe(Gst.PadProbeType.BUFFER, count_decoded)

    def on_error(self, _: Any, message: Any) -> None:
        err, debug = message.parse_error()
        self.fail(f"{err.message} ({debug})")

    # --- run -------------------------------------------------------------------------------
    def finish(self) -> bool:
        self.loop.quit()
        return False

    def run(self) -> Report:
        if self.args.receive == "recvonly":
            self.add_receive_transceivers()
        self.pipe.set_state(Gst.State.PLAYING)
        GLib.timeout_add(int(self.args.duration * 1000), self.finish)
        self.loop.run()
        if self.report.location and not self.args.keep:
            status, _, _, _ = self.request("DELETE", self.report.location, None, self.headers())
            self.report.delete_status = status
        self.pipe.set_state(Gst.State.NULL)
        return self.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="server base URL")
    parser.add_argument("--wav", required=True, help="WAV sent as the microphone (48 kHz best)")
    parser.add_argument("--video", action="store_true", help="also publish VP8 video")
    parser.add_argument("--receive", choices=("sendrecv", "recvonly", "none"), default="sendrecv")
    parser.add_argument("--trickle", action="store_true", help="send candidates with PATCH")
    parser.add_argument("--token", default="", help="bearer token")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds to stay connected")
    parser.add_argument("--keep", action="store_true", help="do not DELETE the resource")
    parser.add_argument(
        "--local-ip", action="append", default=[], help="gather ICE candidates on this address"
    )
    args = parser.parse_args(argv)
    Gst.init(None)
    report = WhipClient(args).run()
    emit(
        "report",
        connection=report.connection,
        ice_connection=report.ice_connection,
        connect_ms=report.connect_ms,
        answer_ms=report.answer_ms,
        location=report.location,
        etag=report.etag,
        links=report.links,
        patches=report.patches,
        delete_status=report.delete_status,
        received={kind: vars(r) for kind, r in report.received.items()},
        errors=report.errors,
    )
    return 0 if report.connect_ms is not None and not report.errors else 1


if __name__ == "__main__":
    sys.exit(main())
