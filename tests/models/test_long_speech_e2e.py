"""Speech of any length through the real server: a long utterance from a real peer comes out
whole as the user's transcript (before, Moonshine's decoder failed on ~10 s of continuous
speech and the turn ended in an ``engine_error`` with no transcript; past 30 s the utterance
was cut). The turn ends only at a pause of 1.5 s here, as a client that dictates would set it
(``silence_duration_ms``), so that one long turn is heard."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import numpy as np
import pytest

from benchmarks.words_bench import ASTERISK, asterisk_texts
from client.cli import ClientPeer, load_wav
from tests.support.peers import Peer
from tests.support.server_process import ServerProcess, metric_value, server_process
from tests.support.speech import silence, speak
from tests.support.text import edit_distance

pytestmark = pytest.mark.timeout(600)

# a minute of espeak-ng (140 words a minute) without a comma or a full stop: no pause
MONOLOGUE = (
    "when I was a child my grandmother kept a small garden behind her house where she grew "
    "tomatoes and beans and a row of sunflowers taller than the fence and every summer I "
    "spent the long afternoons there watering the plants and chasing the cat between the "
    "rows while she told me stories about the village where she grew up and the river that "
    "flooded every spring and the old bridge that the farmers rebuilt three times before "
    "they finally made it out of stone and she said that the best tomatoes were the ones "
    "you picked warm from the sun and ate right there in the garden with a little salt and "
    "nothing else and I still think she was right because nothing from a shop has ever "
    "tasted quite like that and now that I have a garden of my own I plant the same beans "
    "and the same sunflowers and I tell my own children the same stories about the river "
    "and the bridge and the cat that would never come when it was called even when the "
    "dinner was ready and the whole family stood at the door and shouted its name"
)

server = server_process(
    {
        "vad.semantic": "false",
        "vad.end_of_turn_ms": "1500",  # one long turn, as a client that dictates sets it
        "transport.connect_timeout_s": "60",
    },
    timeout=400,
    log_tail=3000,
)


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def wer(reference: str, hypothesis: str) -> float:
    return edit_distance(words(reference), words(hypothesis)) / len(words(reference))


async def transcribed(peer: ClientPeer, pcm: np.ndarray) -> str:
    """What the server heard of ``pcm`` (48 kHz), spoken into the peer's microphone."""
    peer.mic.play(np.concatenate([silence(300), pcm]))
    heard = await peer.wait_event(
        "conversation.item.input_audio_transcription.completed", timeout=len(pcm) / 48_000 + 60
    )
    return str(heard["transcript"])


@pytest.fixture
async def peer(server: ServerProcess, client_ice: None) -> AsyncIterator[ClientPeer]:
    client = Peer(server.url, video=False)
    await client.connect(timeout=30)
    yield client
    await client.close()


async def test_a_minute_long_monologue_is_heard_whole(
    server: ServerProcess, peer: ClientPeer
) -> None:
    pcm = speak(MONOLOGUE, rate=140)
    seconds = len(pcm) / 48_000
    assert 58 <= seconds <= 90, seconds
    transcript = await transcribed(peer, pcm)
    error = wer(MONOLOGUE, transcript)
    print(f"{seconds:.0f} s heard as {len(words(transcript))} words, WER {error:.3f}: {transcript}")
    assert error <= 0.25, transcript
    # its end too: nothing was cut at 10 s or 30 s
    assert (
        words(transcript)[-6:] == words(MONOLOGUE)[-6:]
        or wer(" ".join(words(MONOLOGUE)[-30:]), " ".join(words(transcript)[-30:])) <= 0.3
    ), transcript
    assert not [e for _, e in peer.events if e.get("type") == "error"]
    assert metric_value(server.metrics(), "avatar_asr_fallbacks_total") == 0


async def test_half_a_minute_of_a_person_is_heard_whole(
    server: ServerProcess, peer: ClientPeer
) -> None:
    """A real person's 30 s recording (the Asterisk PBX's welcome, a Debian package: a
    telephone recording at 8 kHz, with sentence pauses under the turn's 1.5 s)."""
    text = asterisk_texts()["demo-congrats"]
    pcm = load_wav(ASTERISK / "demo-congrats.wav")  # 48 kHz
    seconds = len(pcm) / 48_000
    assert seconds >= 29, seconds
    transcript = await transcribed(peer, pcm)
    error = wer(text, transcript)
    print(f"{seconds:.0f} s of a person heard with WER {error:.3f}: {transcript}")
    assert error <= 0.25, transcript
    assert words(transcript)[-4:] == words(text)[-4:], transcript  # its last words too
