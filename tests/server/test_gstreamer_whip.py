"""Interop with a WebRTC stack other than aiortc: GStreamer's webrtcbin publishing to /whip.

The client (tests/support/gst_whip_client.py) runs under the system Python, which has
GStreamer's bindings; it publishes espeak-ng speech as Opus (and VP8 video), with an RSA DTLS
certificate (aiortc's default cipher list refuses those), and reports what it received as
JSON lines. The server must hear the speech and send its tracks where the client asked.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.cli import save_wav
from tests.support.server_process import TONE_PIPELINE, ServerProcess, server_process, tone_env
from tests.support.speech import silence, speak

SYSTEM_PYTHON = "/usr/bin/python3"
CLIENT = Path(__file__).resolve().parents[1] / "support" / "gst_whip_client.py"
TOKEN = "gst-interop-token-0123456789"
QUESTION = "Hello there. What is the weather like today?"
DURATION_S = 6.0


def gstreamer_available() -> bool:
    probe = (
        "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstWebRTC', '1.0');"
        "from gi.repository import Gst; Gst.init(None);"
        "assert Gst.ElementFactory.find('webrtcbin') and Gst.ElementFactory.find('nicesrc')"
    )
    try:
        return subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.fixture(scope="module", autouse=True)
def gstreamer() -> None:
    """scripts/setup.sh installs GStreamer: its absence is a broken set-up, not a skip."""
    if not gstreamer_available():
        pytest.fail(
            "needs GStreamer webrtcbin + python3-gi for /usr/bin/python3 (scripts/setup.sh)"
        )


server = server_process(
    {"server.debug_endpoints": "true", "server.auth_tokens": TOKEN},
    pipeline=TONE_PIPELINE,
    env=tone_env(1500, sentences=1),
)


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gst") / "question.wav"
    speech = speak(QUESTION)
    padding = silence(DURATION_S * 1000 + 2000)  # the file outlasts the call
    save_wav(path, np.concatenate([silence(500), speech, padding]))
    return path


def run_client(server: ServerProcess, wav: Path, *args: str) -> tuple[dict[str, Any], list[Any]]:
    """Run the GStreamer client; its report and every event it printed."""
    proc = subprocess.run(
        [
            SYSTEM_PYTHON,
            str(CLIENT),
            "--url",
            server.url,
            "--wav",
            str(wav),
            "--token",
            TOKEN,
            "--duration",
            str(DURATION_S),
            "--local-ip",
            "127.0.0.1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    reports = [e for e in events if e["event"] == "report"]
    assert reports, f"no report (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return reports[0], events


def closed_session(server: ServerProcess, location: str) -> dict[str, Any]:
    session_id = location.rsplit("/", 1)[-1]
    found = server.session(session_id, ("closed",), token=TOKEN)
    assert found is not None, f"session {session_id} is not closed"
    return found


def assert_connected(report: dict[str, Any]) -> None:
    assert report["errors"] == []
    assert report["connection"] == "connected" and report["connect_ms"] is not None
    assert report["delete_status"] == 200  # DELETE with the creating token ended it


def test_gstreamer_publishes_opus_and_vp8_and_receives_the_avatar(
    server: ServerProcess, speech_wav: Path
) -> None:
    report, events = run_client(server, speech_wav, "--video")
    assert_connected(report)
    (answer,) = [e for e in events if e["event"] == "answer"]
    assert answer["status"] == 201 and answer["content_type"] == "application/sdp"
    assert answer["etag"] and answer["media"] == ["audio:sendrecv", "video:sendrecv"]
    received = report["received"]
    assert received["audio"]["rtp"] > 50 and received["audio"]["decoded"] > 50
    assert received["video"]["decoded"] > 10  # the server's avatar, decoded by vp8dec
    session = closed_session(server, report["location"])
    assert session["speech_starts"] >= 1  # the server's VAD heard the spoken question
    assert session["heard_until_ms"] > 3000
    print(f"GStreamer webrtcbin (full offer): connected {report['connect_ms']} ms after POST")


def test_gstreamer_trickles_its_candidates_with_patch(
    server: ServerProcess, speech_wav: Path
) -> None:
    report, events = run_client(server, speech_wav, "--trickle")
    assert_connected(report)
    (post,) = [e for e in events if e["event"] == "post"]
    assert post["candidates"] == 0  # the offer went out before gathering
    assert report["patches"] and set(report["patches"]) == {204}
    assert report["received"]["audio"]["decoded"] > 50
    assert closed_session(server, report["location"])["speech_starts"] >= 1
    print(f"GStreamer webrtcbin (trickle ICE): connected {report['connect_ms']} ms after POST")


def test_gstreamer_pure_publisher_sends_and_gets_nothing_back(
    server: ServerProcess, speech_wav: Path
) -> None:
    report, events = run_client(server, speech_wav, "--receive", "none")
    assert_connected(report)
    (answer,) = [e for e in events if e["event"] == "answer"]
    assert answer["media"] == ["audio:recvonly"]
    assert report["received"] == {}
    assert closed_session(server, report["location"])["speech_starts"] >= 1


def test_gstreamer_receives_the_server_audio_on_its_recvonly_line(
    server: ServerProcess, speech_wav: Path
) -> None:
    report, events = run_client(server, speech_wav, "--receive", "recvonly")
    assert_connected(report)
    (answer,) = [e for e in events if e["event"] == "answer"]
    assert answer["media"] == ["audio:recvonly", "audio:sendonly"]
    assert report["received"]["audio"]["decoded"] > 50
