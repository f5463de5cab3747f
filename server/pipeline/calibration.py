"""Calibration at start: what this machine's stages cost, what a reply will take, how many
sessions fit, and the settings the operator left unset chosen to match.

Inputs are the engines' warm-up figures (``VoicePipeline.warm_up``: ASR, LLM first token and
speed, TTS real-time factor) and one avatar frame rendered and encoded. Everything here is a
pure function of them, so a stage that failed (None) falls back to the reference machine's
figure and says so.

The prediction, in ms after the end-of-turn decision:

    final transcript left   (with partials: what the last partial has not finished when the
                             end-of-turn wait is over; without: one whole call)
  + LLM first token        (a reply's: its prompt cached but for the turn's last words, as
                             after the warm-up at the pause)
  + the first chunk's other tokens at the measured speed
  + speech for the first chunk (its duration x the TTS real-time factor; where the TTS gives
                             speech in pieces, the warm-up's time to its first piece if less)
  + one 20 ms audio frame

What the user hears (``predicted_heard_ms``, the figure ``pipeline.latency_budget_ms`` and the
model ladder are about) runs from the end of the user's speech to that audio at the client:
the end-of-turn wait before (the silence the detector waits for, or the LLM's verdict on the
words at the pause where that comes later), the way to the client and its jitter buffer after.

Each stage was timed alone at start. In a conversation an engine thread shares the CPU with
the session's own media path and video (``busy`` cores) and, while the first chunk is being
said, with the LLM writing on: ``k`` engine threads at once each get ``(usable - busy) / k``
cores (at most one), ``usable`` being the cores, or under a CFS quota the share of it the
threads together get to spend (``quota_use``: all of it on as many cores as the quota needs,
``QUOTA_USE`` spread over more). A stage takes its time alone over that share of
what it had alone (``min(1, cpus)``): the transcript, the first token and the first chunk's
tokens with one engine thread at work, the speech with two.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from server.config import Config
from server.pipeline.ladder import LadderChoice
from server.pipeline.turn_detector import PAUSE_MS

log = logging.getLogger(__name__)

# the reference machine (2-core AMD EPYC with AVX-512), used where a stage failed to measure
REFERENCE = {
    "asr_ms": 90.0,  # a 2.3 s utterance
    "asr_audio_ms": 2300.0,
    "llm_first_token_ms": 60.0,
    "llm_tokens_per_s": 60.0,
    "tts_rtf": 0.07,
    "frame_ms": 1.4,  # frame_cost_ms: the least of 8 drawn, converted and coded (1.3-1.4)
}
UTTERANCE_S = 3.0  # a typical question
REPLY_TOKENS = 40  # a typical reply (llm_max_tokens caps it)
TOKENS_PER_WORD = 1.3
SPEECH_S_PER_WORD = 0.33  # the joe voice speaks ~3 words a second
FRAME_MS = 20.0  # one outbound audio frame
UTILISATION = 0.7  # the share of the cores sessions may plan on (the rest: loop, spikes)
VIDEO_SHARE = 0.25  # at most this share of one core (or of less CPU) per session for video
MIN_FPS = 10
SMALLER_VIDEO = 384  # px, when even MIN_FPS does not fit VIDEO_SHARE
MAX_PARTIAL_INTERVAL_MS = 2000
PARTIAL_ASR_SHARE = 0.4  # of the recogniser's time that regular partials may take
# a final transcript heard by both recognisers (pipeline.asr_cross_check) that takes longer
# than this for a UTTERANCE_S question would show in the turn's end: the check is left off
CROSS_CHECK_BUDGET_MS = 250.0
FIRST_CHUNK_MS = 120.0  # the LLM's time for the first chunk's words
MIN_FIRST_CHUNK_WORDS = 3  # fewer breaks the first sentence's prosody
# a turn: the user speaks UTTERANCE_S, the avatar answers REPLY_TOKENS; a session also waits
IDLE_S = 5.0
# a session's media path besides its video frames (Opus, RTP/SRTP, events, its share of the
# event loop): avatar_sync measured 11.6 % of a core for a session with audio and events
# only, realtime_bench the event loop's CPU at 10-19 % (median 13 %) of a core in a
# conversation, in either profile, whatever the avatar frame's cost at start (1.4-2.7 ms: a
# busy host's moment, which scaled by it made the prediction 1.5x too slow)
MEDIA_CORES = 0.13
# a session's whole video path (drawing, conversion, coding, packets, SRTP, the hand-offs
# between threads) over one frame drawn and coded alone (avatar_sync: 17.4 % of a core for a
# speaking avatar at 25 fps, about 1.7 x its frames)
VIDEO_PATH = 1.7
# the share of a CFS quota that the server's threads together spend when they run on more
# cores than it needs: a quota runs out in the middle of a period while some of them wait
# (realtime_bench in the slow profile: 0.45 of 0.5 CPUs spent while replies waited, 82 % of
# the periods throttled). On ceil(quota) cores (the CPU plan confines them so) one runqueue
# draws the pool: predicted / measured was 0.94-1.35 in 6 slow runs with this share there,
# 0.99-1.24 in 5 with all of it (BENCHMARKS.md, "One core for a quota")
QUOTA_USE = 0.9
# the least share of the speed it had alone that an engine thread is predicted to keep beside
# one session's media path, video and the other engines (where those would take more, the
# prediction says slow, not infinite)
MIN_STAGE_SHARE = 0.25
# the end of speech to the end-of-turn event at the client, besides the silence the detector
# waits for, or the LLM's verdict on the words at the pause where that comes later (the VAD's
# frames, the packets' ways in and out): at an aiortc client on an Intel Xeon, 253 ms with
# SmolLM2 (a wait of 160 ms; its verdict by 139 ms) and 327 ms with the 0.5B (its verdict by
# 239 ms): 93 and 88 ms besides (benchmarks/reported/ladder_fast_*.json)
ENDPOINT_EXTRA_MS = 90.0
# the reply's first audio sent -> heard at the client, after its jitter buffer (aiortc's: 4
# packets): 126-135 ms measured (the same table)
CLIENT_WAY_MS = 130.0


@dataclass(frozen=True)
class StageCosts:
    """Measured costs (ms unless named); None where the stage failed or was not measured."""

    asr_ms: float | None = None
    asr_audio_ms: float | None = None
    asr_partial_ms: float | None = None  # a partial transcript of the same audio
    llm_first_token_ms: float | None = None
    llm_tokens_per_s: float | None = None
    tts_ms: float | None = None
    tts_audio_ms: float | None = None
    tts_first_ms: float | None = None  # the first piece of the same speech (None: whole)
    frame_ms: float | None = None  # render and VP8-encode one avatar frame
    frame_pixels: int | None = None  # that frame's width x height (None: the config's)

    @classmethod
    def from_warm_up(
        cls,
        times: Mapping[str, float | None],
        frame_ms: float | None,
        frame_pixels: int | None = None,
    ) -> StageCosts:
        return cls(
            asr_ms=times.get("asr_again_ms"),
            asr_audio_ms=times.get("asr_audio_ms"),
            asr_partial_ms=times.get("asr_partial_ms"),
            llm_first_token_ms=times.get("llm_first_token_ms"),
            llm_tokens_per_s=times.get("llm_tokens_per_s"),
            tts_ms=times.get("tts_ms"),
            tts_audio_ms=times.get("tts_audio_ms"),
            tts_first_ms=times.get("tts_first_ms"),
            frame_ms=frame_ms,
            frame_pixels=frame_pixels,
        )


@dataclass(frozen=True)
class Calibration:
    """What the machine can do, as measured at start."""

    cpus: float  # CPU time the process may use (cores, or its cgroup quota)
    asr_call_ms: float  # a final transcript of a UTTERANCE_S question
    llm_first_token_ms: float
    llm_tokens_per_s: float
    tts_rtf: float
    frame_ms: float
    predicted_voice_to_voice_ms: float
    capacity: int  # sessions in conversation at once
    session_cores: float  # CPU (cores) one session in conversation needs on average
    fallbacks: tuple[str, ...]  # stages that failed to measure (reference figures used)
    tts_first_ms: float | None = None  # the warm-up speech's first piece (None: said whole)
    # the share of its speed alone that one engine thread keeps in a conversation, beside the
    # session's own media path and video: what the engines did alone at start takes 1 / this
    # as long
    stage_share: float = 1.0
    # the same for speech made while the LLM writes on (two engine threads at once)
    speech_share: float = 1.0
    # a partial transcript of a UTTERANCE_S question (one recogniser; the final may be two)
    asr_partial_ms: float | None = None
    # the end of the user's speech -> the first reply audio at the client (ms)
    predicted_heard_ms: float = 0.0
    # the language model the ladder picked, and why (None: not climbed)
    llm: LadderChoice | None = None

    def to_dict(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["fallbacks"] = list(self.fallbacks)
        out["llm"] = None if self.llm is None else self.llm.to_dict()
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}

    def describe(self) -> str:
        line = (
            f"expected reply at the client {self.predicted_heard_ms:.0f} ms after the end of"
            f" speech; voice-to-voice {self.predicted_voice_to_voice_ms:.0f} ms"
            f" (ASR {self.asr_call_ms:.0f} ms a question, LLM first token"
            f" {self.llm_first_token_ms:.0f} ms and {self.llm_tokens_per_s:.0f} tokens/s,"
            f" TTS real-time factor {self.tts_rtf:.2f}{self._first_piece()},"
            f" a video frame {self.frame_ms:.1f} ms);"
            f" capacity {self.capacity} sessions"
        )
        if self.fallbacks:
            line += f"; not measured, reference figures used: {', '.join(self.fallbacks)}"
        return line

    def _first_piece(self) -> str:
        first = self.tts_first_ms
        return "" if first is None else f" (its first piece in {first:.0f} ms)"


def _window_s(audio_s: float) -> float:
    """The ASR's encoder window (s) for ``audio_s`` of speech (models/asr.py: the audio and
    1 s of silence, at least 3 s)."""
    return max(3.0, audio_s + 1.0)


def quota_use(quota: float | None, cores: int) -> float:
    """The share (0-1) of its CPU time that the server's threads spend together on ``cores``
    cores under a CFS quota of ``quota`` CPUs (None: none): all of it without a quota that
    binds, or on no more cores than the quota needs; ``QUOTA_USE`` spread over more."""
    if quota is None or quota >= cores or cores <= math.ceil(quota):
        return 1.0
    return QUOTA_USE


def engine_share(cpus: float, busy: float, threads: int, use: float = 1.0) -> float:
    """The share of its speed alone that one engine thread keeps while ``threads`` engine
    threads work at once beside ``busy`` cores of media path and video, with ``cpus`` of CPU
    time of which the threads together spend ``use`` (:func:`quota_use`); at least
    ``MIN_STAGE_SHARE``. Alone it had ``min(1, cpus)`` of a core."""
    each = min(1.0, (cpus * use - busy) / threads)
    return max(MIN_STAGE_SHARE, each / min(1.0, cpus))


def calibrate(costs: StageCosts, config: Config, cpus: float, use: float = 1.0) -> Calibration:
    """The prediction and capacity from measured ``costs`` with ``cpus`` of CPU time (the
    cores, or the cgroup's quota when smaller), of which the threads spend ``use``
    (:func:`quota_use`)."""
    if not 0 < use <= 1:
        raise ValueError(f"use must be in (0, 1], got {use}")
    fallbacks: list[str] = []

    def pick(name: str, value: float | None) -> float:
        if value is None or not math.isfinite(value) or value <= 0:
            fallbacks.append(name)
            return REFERENCE[name]
        return value

    asr_ms = pick("asr_ms", costs.asr_ms)
    asr_audio_ms = costs.asr_audio_ms or REFERENCE["asr_audio_ms"]
    # a call costs about in proportion to its window
    asr_call = asr_ms * _window_s(UTTERANCE_S) / _window_s(asr_audio_ms / 1000)
    partial_ms = costs.asr_partial_ms
    if partial_ms is None or not math.isfinite(partial_ms) or partial_ms <= 0:
        partial_ms = asr_ms  # not measured apart: a partial costs what a final does
    partial_call = partial_ms * _window_s(UTTERANCE_S) / _window_s(asr_audio_ms / 1000)
    ttft = pick("llm_first_token_ms", costs.llm_first_token_ms)
    tps = pick("llm_tokens_per_s", costs.llm_tokens_per_s)
    rtf_measured = (
        costs.tts_ms / costs.tts_audio_ms if costs.tts_ms and costs.tts_audio_ms else None
    )
    rtf = pick("tts_rtf", rtf_measured)
    frame_ms = pick("frame_ms", costs.frame_ms)

    pc, vad = config.pipeline, config.vad
    # with partials, the decode that hears the end of speech starts at the pause (PAUSE_MS
    # after it), and the end of turn is declared end_of_turn_ms after it
    with_partials = max(0.0, PAUSE_MS + asr_call - vad.end_of_turn_ms)
    asr_left = with_partials if pc.incremental else asr_call
    words = pc.first_chunk_words
    # the first token is the first chunk's first: the others follow at the measured speed
    first_chunk = max(0.0, words * TOKENS_PER_WORD - 1) / tps * 1000
    speech = words * SPEECH_S_PER_WORD * 1000 * rtf
    first_piece = costs.tts_first_ms
    if first_piece is None or not math.isfinite(first_piece) or first_piece <= 0:
        first_piece = None
    else:
        speech = min(speech, first_piece)  # the first chunk's first piece plays first

    # CPU (cores) the session's media path and video take all the time: the stages were
    # timed alone, and in a conversation they have what is left of the CPU
    tc = config.transport
    fps = tc.video_fps if tc.video else 0
    pixels = tc.video_width * tc.video_height
    size = pixels / (costs.frame_pixels or pixels)  # the frame was timed at frame_pixels
    video = VIDEO_PATH * frame_ms * size * fps / 1000
    busy = MEDIA_CORES + video
    alone = engine_share(cpus, busy, 1, use)
    beside_llm = engine_share(cpus, busy, 2, use)  # the LLM writes on meanwhile
    predicted = (asr_left + ttft + first_chunk) / alone + speech / beside_llm + FRAME_MS
    wait = float(vad.complete_silence_ms if vad.semantic else vad.end_of_turn_ms)
    if vad.semantic and vad.unfinished_words and vad.sentence_end:
        # the turn also waits for the LLM's verdict on the words at the pause: one token
        # after them, their prompt warmed while the user spoke, as the reply's first
        wait = max(wait, PAUSE_MS + ttft / alone)
    heard = wait + ENDPOINT_EXTRA_MS + predicted + CLIENT_WAY_MS

    # CPU (cores) one session needs on average: its media path and video all the time, plus
    # a turn's work spread over the turn (the user speaking, the reply, a pause)
    reply_s = REPLY_TOKENS * SPEECH_S_PER_WORD / TOKENS_PER_WORD
    partials = UTTERANCE_S * 1000 / pc.partial_interval_ms * partial_call if pc.incremental else 0
    turn_cpu_ms = partials + asr_call + REPLY_TOKENS / tps * 1000 + reply_s * 1000 * rtf
    turn_s = UTTERANCE_S + predicted / 1000 + reply_s + IDLE_S
    per_session = busy + turn_cpu_ms / 1000 / turn_s
    capacity = max(1, math.floor(cpus * UTILISATION / per_session))
    return Calibration(
        cpus=cpus,
        asr_call_ms=asr_call,
        asr_partial_ms=partial_call,
        llm_first_token_ms=ttft,
        llm_tokens_per_s=tps,
        tts_rtf=rtf,
        frame_ms=frame_ms,
        predicted_voice_to_voice_ms=predicted,
        capacity=capacity,
        session_cores=per_session,
        fallbacks=tuple(fallbacks),
        tts_first_ms=first_piece,
        stage_share=alone,
        speech_share=beside_llm,
        predicted_heard_ms=heard,
    )


def adapt(config: Config, calibration: Calibration) -> tuple[Config, dict[str, object]]:
    """``config`` with the settings it left unset (not in ``config.explicit``) chosen for
    this machine; returns it and what changed (dotted name -> new value). A setting follows
    only stages that were measured: one that leans on a reference figure stays as it is.

    The video's frame rate is cut until its frames fit ``VIDEO_SHARE`` of a core (of the
    quota when less), and its size too when even ``MIN_FPS`` does not fit. Where not even one
    session fits the CPU that sessions may plan on (``session_cores`` over ``cpus`` x
    ``UTILISATION``), the video goes to its least (``MIN_FPS``, ``SMALLER_VIDEO``): in 0.5
    CPUs that answered in 1.0 s against 1.6-2.3 s at 25 fps and 512x512 (BENCHMARKS.md)."""
    changed: dict[str, object] = {}
    explicit = config.explicit
    pc, tc = config.pipeline, config.transport
    guessed = set(calibration.fallbacks)

    def unset(name: str, *needs: str) -> bool:
        return name not in explicit and not guessed.intersection(needs)

    if unset("pipeline.partial_interval_ms", "asr_ms"):
        # partials keep the recogniser busy at most 40 % of the time: when the speaker pauses,
        # the decode that may become the final must not wait long behind one
        partial_ms = calibration.asr_partial_ms or calibration.asr_call_ms
        interval = min(
            MAX_PARTIAL_INTERVAL_MS, max(pc.partial_interval_ms, partial_ms / PARTIAL_ASR_SHARE)
        )
        if round(interval) != pc.partial_interval_ms:
            changed["pipeline.partial_interval_ms"] = round(interval)
    if (
        pc.asr_cross_check
        and unset("pipeline.asr_cross_check", "asr_ms")
        and calibration.asr_call_ms > CROSS_CHECK_BUDGET_MS
    ):
        changed["pipeline.asr_cross_check"] = False
    if unset("pipeline.first_chunk_words", "llm_tokens_per_s"):
        # the first chunk goes to speech after the words the LLM writes in FIRST_CHUNK_MS
        tokens = FIRST_CHUNK_MS / 1000 * calibration.llm_tokens_per_s
        words = max(MIN_FIRST_CHUNK_WORDS, min(pc.first_chunk_words, int(tokens / TOKENS_PER_WORD)))
        if words != pc.first_chunk_words:
            changed["pipeline.first_chunk_words"] = words

    def smallest_video() -> None:
        """The video at SMALLER_VIDEO at most, where the operator set neither side."""
        if unset("transport.video_width") and unset("transport.video_height"):
            changed["transport.video_width"] = min(tc.video_width, SMALLER_VIDEO)
            changed["transport.video_height"] = min(tc.video_height, SMALLER_VIDEO)

    if tc.video and unset("transport.video_fps", "frame_ms"):
        budget_ms = VIDEO_SHARE * min(1.0, calibration.cpus) * 1000  # ms of CPU a second
        if calibration.frame_ms * tc.video_fps > budget_ms:
            fps = max(MIN_FPS, math.floor(budget_ms / calibration.frame_ms))
            changed["transport.video_fps"] = fps
            if calibration.frame_ms * fps > budget_ms:  # not even MIN_FPS fits
                smallest_video()
    one_fits = calibration.session_cores <= calibration.cpus * UTILISATION
    if tc.video and not one_fits and unset("transport.video_fps", *REFERENCE):
        # not even one conversation fits the CPU that sessions may plan on: the video, the
        # part that can give, goes to its least, and the reply's stages get what it leaves
        if changed.get("transport.video_fps", tc.video_fps) != MIN_FPS:
            changed["transport.video_fps"] = MIN_FPS
        smallest_video()
    if unset("transport.max_sessions", *REFERENCE) and calibration.capacity != tc.max_sessions:
        changed["transport.max_sessions"] = calibration.capacity
    return with_settings(config, changed), changed


def with_settings(config: Config, settings: Mapping[str, object]) -> Config:
    """``config`` with dotted-name ``settings`` replaced (already valid values)."""
    sections: dict[str, dict[str, object]] = {}
    for dotted, value in settings.items():
        section, _, key = dotted.partition(".")
        sections.setdefault(section, {})[key] = value
    replaced = {
        name: dataclasses.replace(getattr(config, name), **values)
        for name, values in sections.items()
    }
    return dataclasses.replace(config, **replaced)
