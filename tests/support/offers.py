"""SDP offers for signaling tests: a real aiortc offer, and candidate lines to put in one."""

from __future__ import annotations

from aiortc import RTCConfiguration, RTCPeerConnection

from client.cli import ScriptedMic


async def trickle_offer() -> str:
    """An aiortc offer (audio and the events channel) without candidates or
    end-of-candidates: a WHIP client that would trickle them. Until a PATCH brings some, the
    server's ICE has nobody to check; a session made from it never connects."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("events")
    mic = ScriptedMic()
    pc.addTrack(mic)
    try:
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
    finally:
        mic.stop()
        await pc.close()
    kept = [
        line
        for line in sdp.splitlines()
        if not line.startswith(("a=candidate:", "a=end-of-candidates"))
    ]
    return "\r\n".join(kept) + "\r\n"


def first_mid(sdp: str) -> str:
    """The ``a=mid`` of the first media section."""
    return next(line[6:] for line in sdp.splitlines() if line.startswith("a=mid:"))


def host_candidate(address: str, port: int, foundation: str = "1") -> str:
    """A ``candidate:`` attribute value of a UDP host candidate at ``address``:``port``."""
    return f"candidate:{foundation} 1 udp 2130706431 {address} {port} typ host"


def with_candidates(sdp: str, candidates: list[str]) -> str:
    """``sdp`` with ``a=<candidate>`` lines added to its first media section."""
    lines = sdp.strip().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("m="))
    end = next((i for i in range(first + 1, len(lines)) if lines[i].startswith("m=")), len(lines))
    lines[end:end] = [f"a={c}" for c in candidates]
    return "\r\n".join(lines) + "\r\n"


def without_candidates(sdp: str) -> tuple[str, list[str], str, str]:
    """A trickling client's offer: ``sdp`` without candidate lines, with the candidates of its
    first media section (max-bundle: the only ones needed) and its ICE ufrag and password."""
    kept: list[str] = []
    candidates: list[str] = []
    ufrag = pwd = ""
    section = -1
    for line in sdp.splitlines():
        if line.startswith("m="):
            section += 1
        if line.startswith("a=candidate:"):
            if section == 0:
                candidates.append(line[2:])
            continue
        if line.startswith("a=end-of-candidates"):
            continue
        if not ufrag and line.startswith("a=ice-ufrag:"):
            ufrag = line.split(":", 1)[1]
        if not pwd and line.startswith("a=ice-pwd:"):
            pwd = line.split(":", 1)[1]
        kept.append(line)
    return "\r\n".join(kept) + "\r\n", candidates, ufrag, pwd


def sdpfrag(ufrag: str, pwd: str, mid: str, lines: list[str]) -> str:
    """An RFC 8840 fragment of ``lines`` for the media section ``mid``."""
    head = [f"a=ice-ufrag:{ufrag}", f"a=ice-pwd:{pwd}", "m=audio 9 UDP/TLS/RTP/SAVPF 0"]
    return "\r\n".join([*head, f"a=mid:{mid}", *lines]) + "\r\n"
