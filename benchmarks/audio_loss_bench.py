"""What is heard of speech when audio packets are lost: the user's words by the server's
recogniser, and the avatar's voice by a browser.

**The microphone** (``mic``): the asr_bench set (24 questions, each in two voices: the
avatar's own and espeak-ng) encoded as browsers send a microphone (Opus mono speech, 32 kbps,
20 ms packets: server/rtc/speech_encoder.py), with in-band FEC (``fec``: Chrome's and the
mobile SDKs' way once the receiver asks, which the server does) and without (``plain``). The
packets left are decoded in two ways:

- ``silence``: aiortc's decoder, the lost frames heard as silence (the inbound path's gap
  filling: the server before server/rtc/opus.py);
- ``decoder``: the server's decoder (server/rtc/opus.py), which recovers a lost frame from
  the copy in the next packet, or extrapolates it.

**The avatar's voice** (``voice``): the same questions in the avatar's voice, encoded as the
server sends them: ``aiortc`` (aiortc's encoder, stereo at 96 kbps: the server before
server/rtc/speech_encoder.py) or ``speech`` (mono speech at 32 kbps with FEC copies, which
every browser's offer asks for); what is left is decoded as a browser's libopus does it
(copies used, the rest extrapolated: server/rtc/opus.py's decoder).

Packets are lost at random (seeded, the same packets for every way of hearing; ``--draws``
patterns per rate, their WER pooled), and Whisper tiny.en (the server's recogniser, on the
utterance's audio) transcribes each clip. Reported per loss rate: each way's word error rate
and the lost frames recovered from a copy; per encoder its bitrate; and what decoding and
encoding cost (µs per 20 ms packet).

Run: ``.venv/bin/python -m benchmarks.audio_loss_bench`` (``--quick``: 4 sentences, 2 rates).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiortc.codecs.base import Encoder
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame

from benchmarks import stamped
from benchmarks.asr_bench import SENTENCES, score, voices
from server.machine import this_machine
from server.pipeline.resample import resample
from server.rtc.opus import Concealed, ConcealingOpusDecoder
from server.rtc.speech_encoder import SpeechEncoder
from tests.support.browser_mic import FRAME, RATE_HZ, Packets, encoded, frames

ASR_RATE_HZ = 16_000
RATES = (0.0, 0.02, 0.05, 0.10, 0.20)
PCM = npt.NDArray[np.int16]


Encoders = dict[str, Callable[[], Encoder]]
MIC: Encoders = {"fec": lambda: SpeechEncoder(fec=True), "plain": lambda: SpeechEncoder(fec=False)}
VOICE: Encoders = {"aiortc": OpusEncoder, "speech": lambda: SpeechEncoder(fec=True)}


def heard(packets: Packets, lost: set[int], conceal: bool) -> tuple[PCM, dict[str, int]]:
    """The audio at 48 kHz mono as the server hears it, and the frames made by how
    (``conceal``: the server's decoder; else aiortc's, the lost time left silent)."""
    decoder = ConcealingOpusDecoder() if conceal else OpusDecoder()
    out = np.zeros(len(packets) * FRAME, np.int16)
    for n, (payload, timestamp) in enumerate(packets):
        if n in lost:
            continue
        for frame in decoder.decode(JitterFrame(payload, timestamp)):
            assert isinstance(frame, av.AudioFrame) and frame.pts is not None
            pcm = frame.to_ndarray().reshape(-1, 2).mean(axis=1).astype(np.int16)
            out[frame.pts : frame.pts + len(pcm)] = pcm[: len(out) - frame.pts]
    if isinstance(decoder, ConcealingOpusDecoder):
        return out, {str(how): count for how, count in decoder.made.items()}
    return out, {}


def cost_us(packets: Packets, pcm: PCM, encoders: Encoders) -> dict[str, float]:
    """Median µs per 20 ms packet: decoding (the server's decoder and aiortc's, taking turns
    by packet) and encoding ``pcm`` with each of ``encoders``."""
    ours, theirs = ConcealingOpusDecoder(), OpusDecoder()
    times: dict[str, list[float]] = {"decode/server": [], "decode/aiortc": []}
    for payload, timestamp in packets:
        for name, decoder in (("decode/server", ours), ("decode/aiortc", theirs)):
            started = time.perf_counter()
            decoder.decode(JitterFrame(payload, timestamp))
            times[name].append((time.perf_counter() - started) * 1e6)
    for name, make in encoders.items():
        encoder, spent = make(), times.setdefault(f"encode/{name}", [])
        for frame in frames(pcm):
            started = time.perf_counter()
            encoder.encode(frame)
            spent.append((time.perf_counter() - started) * 1e6)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def hear_all(
    asr: Any,
    clips: list[tuple[str, str, PCM]],
    encoded: dict[str, list[Packets]],
    silence_too: bool,
    rates: tuple[float, ...],
    draws: int,
) -> dict[str, Any]:
    """Per loss rate and way of hearing (sender/decoding): WER, lost and made frames."""
    found: dict[str, Any] = {}
    for rate in rates:
        row: dict[str, Any] = {}
        for sender, all_packets in encoded.items():
            for conceal in (False, True) if silence_too else (True,):
                texts, made = [], dict.fromkeys(map(str, Concealed), 0)
                lost_frames = 0
                for draw in range(draws if rate else 1):
                    for k, packets in enumerate(all_packets):
                        pick = random.Random(f"{k}/{rate}/{draw}")  # the same for every way
                        lost = {n for n in range(len(packets)) if pick.random() < rate}
                        lost_frames += len(lost)
                        pcm, counts = heard(packets, lost, conceal)
                        for how, count in counts.items():
                            made[how] += count
                        texts.append(asr.transcribe(resample(pcm, RATE_HZ, ASR_RATE_HZ)))
                wer, misses = score(clips * (draws if rate else 1), texts)
                way = f"{sender}/{'decoder' if conceal else 'silence'}"
                row[way] = {"wer": wer, "lost_frames": lost_frames, "misheard": misses}
                if conceal:
                    row[way]["made"] = made
        shown = ", ".join(f"{way} WER {row[way]['wer']:.1%}" for way in row)
        print(f"loss {rate:.0%}: {shown}", flush=True)
        found[f"{rate:.2f}"] = row
    return found


def kbps(packets: list[Packets]) -> float:
    """The payload bitrate (kbit/s) of 20 ms packets."""
    count = sum(len(p) for p in packets)
    return round(sum(len(d) for p in packets for d, _ in p) * 8 / (count * 0.02) / 1000, 1)


def run(sentences: list[str], rates: tuple[float, ...], draws: int) -> dict[str, Any]:
    from models.asr import WhisperAsr

    asr = WhisperAsr(cpu_threads=2, window="audio")
    clips = voices(sentences)
    said = [resample(pcm, ASR_RATE_HZ, RATE_HZ) for _, _, pcm in clips]
    results: dict[str, Any] = {"clips": len(clips), "draws": draws}
    print("the microphone, as the server hears it:")
    mic = {name: [encoded(pcm, make()) for pcm in said] for name, make in MIC.items()}
    results["mic"] = {"rates": hear_all(asr, clips, mic, True, rates, draws)}
    print("the avatar's voice, as a browser hears it:")
    own = [(i, clip) for i, clip in enumerate(clips) if clip[0] == "piper"]
    voice_clips = [clip for _, clip in own]
    voice = {name: [encoded(said[i], make()) for i, _ in own] for name, make in VOICE.items()}
    results["voice"] = {
        "rates": hear_all(asr, voice_clips, voice, False, rates, draws),
        "kbps": {name: kbps(packets) for name, packets in {**mic, **voice}.items()},
    }
    results["us_per_packet_p50"] = cost_us(mic["fec"][0], said[0], VOICE)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 sentences, 2 rates (a smoke run)")
    parser.add_argument("--draws", type=int, default=3, help="loss patterns per rate")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/audio_loss.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    sentences, rates, draws = (
        (SENTENCES[:4], (0.0, 0.1), 1) if args.quick else (SENTENCES, RATES, args.draws)
    )
    results = run(sentences, rates, draws)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2) + "\n")
    print(f"kbit/s: {results['voice']['kbps']}")
    print(f"µs per packet p50: {results['us_per_packet_p50']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
