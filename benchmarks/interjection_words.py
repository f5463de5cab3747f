"""What the words of an interjection say, offline: the recogniser and the backchannel rule alone.

``interjection_bench`` runs whole calls (40 trials, 8 minutes, one voice); this runs only the
part that decides most of its misses: the primed transcript of a short interjection and
``is_backchannel`` on it. Each phrase is spoken by espeak-ng in several voices and at three
speeds, sent through an Opus round trip (encoded as a browser's microphone: mono speech,
32 kbps, 20 ms packets, in-band FEC; decoded by the server's decoder), resampled to 16 kHz,
and cut as the conversation cuts it (server/conversation/conversation.py):

- the final clip: ``PREROLL_MS`` before the onset to ``vad.interjection_quiet_ms`` after the last
  loud sample (the judge's hearing once the speech falls quiet);
- where the voice lasts past ``vad.interruption_ms``, also the clip up to that point (the hearing
  while it goes on: any word that is not a backchannel interrupts at once).

A phrase stops the reply where either hearing is not a backchannel. Backchannels should resume,
interruptions should stop. Coughs and clicks are left out: the confirming voice model decides
those before any words are heard (``interjection_bench`` has them). Each prime (Whisper's
previous text, ``--context``; the server's ``INTERJECTION_CONTEXT`` and none by default) is
scored on the same clips.

**Over a playing reply** (``--over-reply``): each phrase (5 voices, 175 words a minute) is
said over the avatar's reply (its own voice) and heard as the recogniser hears it in a call:
through a browser's microphone and the server's echo path (AEC3 and the residual echo gate:
server/pipeline/echo.py), the reply falling silent ``PAUSE_MS`` after the onset, and cut at
the phrase's own span. Scenes (``SCENES``): 300 and 600 ms into a session's first reply, the
client cancelling its own echo (the gate does not know yet that nothing comes back), and 300
ms and 3 s into one whose echo comes back (no client AEC: -10 dB, 100 ms, a room; at 300 ms
its path is not found yet). Each with the gate's ``words_hold`` and ``onset_frames`` as they
are, with the hold alone, and with neither (the canceller's output, as before 2026-12-06):
``GATES``.

Run: ``.venv/bin/python -m benchmarks.interjection_words`` (``--quick``: one voice, one speed,
and over a reply the first scene only; ``--over-reply``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks import audio_loss_bench, write_summarised
from benchmarks.interjection_bench import BACKCHANNELS, INTERRUPTIONS
from client.cli import load_wav
from models.echo import WebRtcEchoCanceller
from server.config import VadConfig
from server.conversation.interjection import INTERJECTION_CONTEXT, PREROLL_MS, is_backchannel
from server.pipeline.echo import EchoPath
from server.pipeline.echo_gate import ONSET_FRAMES, WORDS_HOLD_FRAMES
from server.pipeline.resample import resample
from server.rtc.speech_encoder import SpeechEncoder
from tests.support.browser_mic import FRAME, RATE_HZ, encoded
from tests.support.echo import PULL, echo_of, through

PCM = npt.NDArray[np.int16]
RATE = 16_000
LOUD = 500  # a sample louder than this is voice (int16), as interjection_bench's onset
# beyond the call's sets: more backchannels, and short interruptions a prime may bend
MORE_BACKCHANNELS = ["Hmm.", "Got it.", "Alright.", "Mm.", "Yep.", "Uh huh, yeah."]
MORE_INTERRUPTIONS = ["Enough.", "No.", "Hey.", "Listen."]
VOICES = ["en-us", "en-gb", "en-us+f3", "en-gb-x-rp+m3", "en-029"]
SPEEDS = [140, 175, 210]  # words per minute (espeak-ng's default: 175)
REPLY = (
    "Rome grew from a village on seven hills into the capital of an empire that ruled the "
    "lands around the sea for many centuries."
)  # the avatar's words a phrase is said over (--over-reply)
SEED = 20261206  # the avatar's voice samples noise: seeded, the reply is the same each run
PAUSE_MS = 200  # the reply falls silent this long after the phrase's onset (the call: 150-250)
# where a phrase falls over the reply: ms into it, and whether its echo comes back. At 300
# and 600 ms the echo gate does not yet know whether anything comes back; at 3 s it has learnt
SCENES = (
    ("start 300 ms", 300, False),
    ("start 600 ms", 600, False),
    ("echo 300 ms", 300, True),
    ("echo 3 s", 3000, True),
)
# the gate's words_hold and onset_frames: as they are, the hold alone (as before 2026-12-06,
# 10:00), neither (the canceller's output, as before 2026-12-06, 06:50)
GATES = ((WORDS_HOLD_FRAMES, ONSET_FRAMES), (WORDS_HOLD_FRAMES, 0), (0, 0))


@dataclass(frozen=True)
class Clips:
    """One spoken phrase as the judge hears it: the final clip, and the clip while it goes on
    (None where the voice ends before ``vad.interruption_ms``)."""

    final: PCM
    going_on: PCM | None


@dataclass(frozen=True)
class Heard:
    """What the recogniser was given (16 kHz) and the phrase's first and last loud sample in it."""

    pcm: PCM
    span: tuple[int, int]


def espeak(text: str, voice: str, speed: int) -> PCM:
    """``text`` said by espeak-ng (48 kHz mono int16)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "said.wav"
        cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text]
        subprocess.run(cmd, check=True, capture_output=True)
        return load_wav(path)


def browser_mic(pcm: PCM) -> PCM:
    """48 kHz mono int16 as a browser's microphone sends it (tests/support/browser_mic.py: Opus
    mono speech, 32 kbps, in-band FEC) and as the server decodes it (server/rtc/opus.py, no
    packet lost), still at 48 kHz."""
    padded = np.concatenate([pcm, np.zeros(-len(pcm) % FRAME, np.int16)])
    packets = encoded(padded, SpeechEncoder(fec=True))
    return audio_loss_bench.heard(packets, set(), conceal=True)[0]


def opus_round_trip(pcm: PCM) -> PCM:
    """:func:`browser_mic`, resampled to 16 kHz."""
    return resample(browser_mic(pcm), RATE_HZ, RATE)


def over_reply(phrase: PCM, reply: PCM, onset_ms: int, echo: bool, gate: tuple[int, int]) -> Heard:
    """``phrase`` (48 kHz) said ``onset_ms`` into ``reply`` (48 kHz, the avatar's voice) as the
    recogniser hears it: through a browser's microphone and the server's echo path (AEC3 and
    the residual echo gate with ``words_hold`` and ``onset_frames`` = ``gate``, the rewinds
    applied as the server applies them). The reply falls silent
    ``PAUSE_MS`` after the phrase's onset. Without ``echo`` the microphone hears only the
    phrase (a client that cancels its own echo), with it also the reply (-10 dB, 100 ms later,
    through a room: tests/support/echo.py)."""
    loud = np.flatnonzero(np.abs(phrase.astype(np.int32)) > LOUD)
    lead = int(PREROLL_MS * RATE_HZ / 1000)  # kept before the phrase's first loud sample
    said = np.concatenate([np.zeros(max(0, lead - int(loud[0])), np.int16), phrase])
    said = said[max(0, int(loud[0]) - lead) :]
    onset = onset_ms * RATE_HZ // 1000  # the phrase's first loud sample
    n = onset - lead + len(said) + RATE_HZ // 2
    n += -n % PULL
    far = np.zeros(n, np.int16)
    far[: min(n, len(reply))] = reply[:n]
    far[onset + PAUSE_MS * RATE_HZ // 1000 :] = 0
    mic = echo_of(far, 100, True).astype(np.int32) if echo else np.zeros(n, np.int32)
    mic[onset - lead : onset - lead + len(said)] += said
    path = EchoPath(WebRtcEchoCanceller())
    path.gate.words_hold, path.gate.onset_frames = gate
    words, _ = through(path, far, browser_mic(np.clip(mic, -32768, 32767).astype(np.int16)))
    last = onset + int(loud[-1] - loud[0])
    return Heard(words, (onset * RATE // RATE_HZ, last * RATE // RATE_HZ))


def clips_of(pcm: PCM, vad: VadConfig, span: tuple[int, int] | None = None) -> Clips:
    """16 kHz speech cut as the floor cuts an interjection (see the module's docstring); its
    first and last loud sample are ``span``, else found in ``pcm``."""
    if span is None:
        loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
        span = int(loud[0]), int(loud[-1])
    onset, last = span
    preroll = int(PREROLL_MS * RATE / 1000)
    lead = np.zeros(max(0, preroll - onset), np.int16)  # silence where the audio began sooner
    tail = last + int(vad.interjection_quiet_ms * RATE / 1000)
    final = np.concatenate([lead, pcm[max(0, onset - preroll) : tail]])
    upto = preroll + int(vad.interruption_ms * RATE / 1000)
    return Clips(final, final[:upto] if last - onset > upto - preroll else None)


def stops(heard: list[str]) -> bool:
    """Whether the reply stops on these hearings (any of them not a backchannel)."""
    return any(not is_backchannel(text) for text in heard)


def score(trials: list[dict[str, Any]], context: str) -> dict[str, Any]:
    """Backchannels resumed and interruptions stopped with ``context``, and the misses."""
    false = [t for t in trials if not t["real"]]
    real = [t for t in trials if t["real"]]
    missed = [t for t in trials if stops(t["heard"][context]) != t["real"]]
    return {
        "backchannels_resumed": sum(not stops(t["heard"][context]) for t in false),
        "backchannels": len(false),
        "interruptions_stopped": sum(stops(t["heard"][context]) for t in real),
        "interruptions": len(real),
        "decode_ms_p50": round(statistics.median(t["ms"][context] for t in trials), 1),
        "missed": [
            f"{t['text']} ({t['voice']}, {t['speed']}): {t['heard'][context]}" for t in missed
        ],
    }


def run(quick: bool, contexts: list[str], over: bool) -> dict[str, Any]:
    from models.asr import WhisperAsr
    from models.tts import OnnxVoiceTts

    asr = WhisperAsr()
    vad = VadConfig()
    phrases = [(t, False) for t in BACKCHANNELS + MORE_BACKCHANNELS]
    phrases += [(t, True) for t in INTERRUPTIONS + MORE_INTERRUPTIONS]
    voices, speeds = (VOICES, SPEEDS[1:2] if over else SPEEDS)
    if quick:
        voices, speeds = VOICES[:1], SPEEDS[1:2]
    reply = OnnxVoiceTts(seed=SEED, cache_dir=None).synthesize(REPLY).pcm if over else None
    scenes = SCENES[:1] if quick else SCENES
    plan = list(itertools.product(scenes, GATES))  # --over-reply's arms
    arms = [f"{scene}, words hold {hold}, onset {onset}" for (scene, _, _), (hold, onset) in plan]
    trials: list[dict[str, Any]] = []
    for (text, real), voice, speed in itertools.product(phrases, voices, speeds):
        phrase = espeak(text, voice, speed)
        hearings: dict[str, tuple[Clips, str]] = {}
        if reply is None:
            clips = clips_of(opus_round_trip(phrase), vad)
            hearings = {context: (clips, context) for context in contexts}
        else:
            for arm, ((_, onset_ms, echo), gate) in zip(arms, plan, strict=True):
                got = over_reply(phrase, reply, onset_ms, echo, gate)
                hearings[arm] = (clips_of(got.pcm, vad, got.span), INTERJECTION_CONTEXT)
        heard: dict[str, list[str]] = {}
        ms: dict[str, float] = {}
        for name, (clips, context) in hearings.items():
            started = time.perf_counter()
            heard[name] = [
                asr.transcribe_after(clip, context)
                for clip in (clips.going_on, clips.final)
                if clip is not None
            ]
            ms[name] = (time.perf_counter() - started) * 1000
        trials.append(
            {"text": text, "real": real, "voice": voice, "speed": speed, "heard": heard, "ms": ms}
        )
    by_arm = {name or "(none)": score(trials, name) for name in (arms if over else contexts)}
    summary = {
        name: {k: v for k, v in figures.items() if k != "missed"}
        for name, figures in by_arm.items()
    }
    return {"summary": summary, "contexts": by_arm, "trials": trials}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the words of interjections, offline")
    parser.add_argument(
        "--quick", action="store_true", help="one voice at one speed (over a reply: one scene)"
    )
    parser.add_argument(
        "--context",
        action="append",
        default=None,
        help="a prime to compare (repeatable; default: the server's and none)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/interjection_words.json")
    )
    parser.add_argument(
        "--over-reply",
        action="store_true",
        help="each phrase over a playing reply, through the echo path (the server's prime)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    contexts = args.context or [INTERJECTION_CONTEXT, ""]
    write_summarised(run(args.quick, contexts, args.over_reply), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
