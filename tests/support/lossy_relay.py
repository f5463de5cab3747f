"""A UDP relay on loopback between a browser and the server that loses some of the browser's
audio packets: loss that a real browser's encoder sees reported back (RTCP) and answers,
where loopback itself loses nothing and Chromium has no switch to pretend it does.

The relay has two ports: the browser is told (in the answer) that the server is at
``browser_side``, the server is told (in the offer) that the browser is at ``server_side``;
each is left one candidate, so every ICE check and every packet goes through the relay. A
thread owns the sockets; :meth:`LossyRelay.close` stops and joins it.
"""

from __future__ import annotations

import random
import re
import selectors
import socket
import threading

CANDIDATE = re.compile(r"a=candidate:\S+ 1 udp \d+ 127\.0\.0\.1 (\d+) typ host.*")
MAX_DATAGRAM = 65_535
LOOPBACK = "127.0.0.1"


def rtp_payload_type(data: bytes) -> int | None:
    """The payload type of an (S)RTP packet, None for STUN, DTLS, RTCP or anything else: its
    header is not encrypted."""
    if len(data) < 12 or not 128 <= data[0] <= 191 or 192 <= data[1] <= 223:
        return None
    return data[1] & 0x7F


def on_port(sdp: str, port: int) -> tuple[str, int]:
    """``sdp`` with its first loopback UDP host candidate moved to ``port`` and its other
    candidates taken out, and that candidate's own port."""
    kept: list[str] = []
    found_port: int | None = None
    for line in sdp.split("\r\n"):
        if line.startswith("a=candidate:"):
            found = CANDIDATE.fullmatch(line)
            if found is None or found_port is not None:
                continue
            found_port = int(found.group(1))
            line = line.replace(f" {found_port} typ host", f" {port} typ host")
        kept.append(line)
    assert found_port is not None, f"no loopback UDP host candidate in {sdp!r}"
    return "\r\n".join(kept), found_port


class LossyRelay:
    """Relays between a browser and the server on 127.0.0.1; of the browser's RTP packets of
    ``payload_type``, each is lost with probability ``share`` (seeded)."""

    def __init__(self, payload_type: int, share: float, seed: int = 1) -> None:
        self._payload_type, self._share = payload_type, share
        self._random = random.Random(seed)
        self._browser_side = self._bound()
        self._server_side = self._bound()
        self.browser_side: int = self._browser_side.getsockname()[1]
        self.server_side: int = self._server_side.getsockname()[1]
        self.browser: int | None = None  # the ports the two peers really listen on
        self.server: int | None = None
        self.relayed = self.lost = 0  # the browser's packets of that payload type
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lossy-relay", daemon=True)
        self._thread.start()

    @staticmethod
    def _bound() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((LOOPBACK, 0))
        return sock

    def offer(self, sdp: str) -> str:
        """The browser's offer as the server should see it: the browser at ``server_side``."""
        sdp, self.browser = on_port(sdp, self.server_side)
        return sdp

    def answer(self, sdp: str) -> str:
        """The server's answer as the browser should see it: the server at ``browser_side``."""
        sdp, self.server = on_port(sdp, self.browser_side)
        return sdp

    def _lose(self, data: bytes) -> bool:
        if rtp_payload_type(data) != self._payload_type:
            return False
        if self._random.random() < self._share:
            self.lost += 1
            return True
        self.relayed += 1
        return False

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._browser_side, selectors.EVENT_READ)
            selector.register(self._server_side, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    data, _source = sock.recvfrom(MAX_DATAGRAM)
                    if self.browser is None or self.server is None:
                        continue  # not yet told where the peers are
                    if sock is self._browser_side:
                        if not self._lose(data):
                            self._server_side.sendto(data, (LOOPBACK, self.server))
                    else:
                        self._browser_side.sendto(data, (LOOPBACK, self.browser))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._browser_side.close()
        self._server_side.close()
