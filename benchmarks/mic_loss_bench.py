"""What the recogniser hears of the user's words when microphone packets are lost.

The asr_bench set (24 questions, each in two voices: the avatar's own and espeak-ng) is
encoded as browsers send a microphone (tests/support/browser_mic.py: Opus mono speech, 32
kbps, 20 ms packets), with in-band FEC (``fec``: Chrome's and the mobile SDKs' way once the
receiver asks, which the server does) and without (``plain``). Packets are lost at random
(seeded, the same packets for every way of hearing; ``--draws`` patterns per rate, their WER
pooled), and the rest are decoded in two ways:

- ``silence``: aiortc's decoder, the lost frames heard as silence (the inbound path's gap
  filling: the server before server/rtc/opus.py);
- ``decoder``: the server's decoder (server/rtc/opus.py), which recovers a lost frame from
  the copy in the next packet, or extrapolates it.

The server's recogniser (Whisper tiny.en on the utterance's audio) then transcribes each clip.
Reported per loss rate: each way's word error rate, the lost frames recovered from a copy, and
what decoding costs (µs per 20 ms packet, the server's decoder against aiortc's).

Run: ``.venv/bin/python -m benchmarks.mic_loss_bench`` (``--quick``: 4 sentences, 2 rates).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame

from benchmarks import stamped
from benchmarks.asr_bench import SENTENCES, score, voices
from server.machine import this_machine
from server.rtc.opus import Concealed, ConcealingOpusDecoder
from server.runtime.media import resample
from tests.support.browser_mic import MicEncoder

RATE_HZ = 48_000
ASR_RATE_HZ = 16_000
FRAME = 960  # samples per packet
RATES = (0.0, 0.02, 0.05, 0.10, 0.20)
PCM = npt.NDArray[np.int16]
Packets = list[tuple[bytes, int]]


def encode(pcm: PCM, fec: bool) -> Packets:
    """``pcm`` (48 kHz) as the sender's RTP payloads and timestamps."""
    encoder = MicEncoder(fec=fec)
    packets: Packets = []
    for start in range(0, len(pcm) - FRAME + 1, FRAME):
        frame = av.AudioFrame.from_ndarray(
            pcm[start : start + FRAME].reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = RATE_HZ
        frame.pts = start
        payloads, timestamp = encoder.encode(frame)
        packets += [(payload, timestamp) for payload in payloads]
    return packets


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


def decode_cost_us(packets: Packets) -> dict[str, float]:
    """Median µs per packet: the server's decoder and aiortc's, taking turns by packet."""
    ours, theirs = ConcealingOpusDecoder(), OpusDecoder()
    times: dict[str, list[float]] = {"decoder": [], "aiortc": []}
    for payload, timestamp in packets:
        for name, decoder in (("decoder", ours), ("aiortc", theirs)):
            started = time.perf_counter()
            decoder.decode(JitterFrame(payload, timestamp))
            times[name].append((time.perf_counter() - started) * 1e6)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def run(sentences: list[str], rates: tuple[float, ...], draws: int) -> dict[str, Any]:
    from models.asr import WhisperAsr

    clips = voices(sentences)
    asr = WhisperAsr(cpu_threads=2, window="audio")
    said = [resample(pcm, ASR_RATE_HZ, RATE_HZ) for _, _, pcm in clips]
    encoded = {
        sender: [encode(pcm, sender == "fec") for pcm in said] for sender in ("fec", "plain")
    }
    results: dict[str, Any] = {"clips": len(clips), "draws": draws, "rates": {}}
    for rate in rates:
        row: dict[str, Any] = {}
        for sender, all_packets in encoded.items():
            for conceal in (False, True):
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
            shown = (f"{w.split('/')[1]} WER {row[w]['wer']:.1%}" for w in row if sender in w)
            print(f"loss {rate:.0%} {sender}: " + ", ".join(shown), flush=True)
        results["rates"][f"{rate:.2f}"] = row
    results["decode_us_per_packet_p50"] = decode_cost_us([p for ps in encoded["fec"] for p in ps])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 sentences, 2 rates (a smoke run)")
    parser.add_argument("--draws", type=int, default=3, help="loss patterns per rate")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mic_loss.json"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"machine: {this_machine().describe()}")
    sentences, rates, draws = (
        (SENTENCES[:4], (0.0, 0.1), 1) if args.quick else (SENTENCES, RATES, args.draws)
    )
    results = run(sentences, rates, draws)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamped(results), indent=2) + "\n")
    print(f"decoding, µs per packet p50: {results['decode_us_per_packet_p50']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
