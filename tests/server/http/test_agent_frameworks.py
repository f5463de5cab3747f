"""An agent framework with OpenAI Realtime as its model holds a conversation through
``GET /v1/realtime``: Pipecat's ``OpenAIRealtimeLLMService`` (pipecat-ai, which
scripts/setup.sh installs without its dependencies; the dev extra adds the few the service
imports), its ``base_url`` this server's socket and its ``api_key`` a server token.

The pipeline has no transport: the test queues the frames a transport would (an
``LLMContextFrame`` with a typed question, then ``InputAudioRawFrame``s of a spoken one at
16 kHz, Pipecat's default input rate, which the service resamples to 24 kHz itself) and reads
what the service pushes (``TTSAudioRawFrame``, ``TTSTextFrame``, ``TranscriptionFrame``, its
turn frames); a last processor stands for the output transport, which says when the bot has
stopped speaking. The assertions are on those frames alone. The server runs in this process
with the real turn detector and the deterministic tone pipeline (tests/support).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
from pipecat.frames.frames import (
    BotStoppedSpeakingFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from server.config import Config
from server.http.signaling import REGISTRY_KEY
from server.pipeline.resample import resample
from tests.support.in_process import running
from tests.support.pace import within
from tests.support.speech import rms, silence, speak
from tests.support.tone_pipeline import InstructedTonePipeline

TOKEN = "token-agents-0123456789abcdef"
SENTENCE_MS = 1200.0
SENTENCES = 3  # the instructed first sentence and two tones
INPUT_RATE = 16_000  # Pipecat's default audio_in_sample_rate; the service sends 24 kHz
PIECE_MS = 20  # a transport's input frame
INSTRUCTIONS = "You guide the harbour museum."


def pipeline(config: Config) -> InstructedTonePipeline:
    return InstructedTonePipeline(SENTENCE_MS, SENTENCES - 1)


class Tap(FrameProcessor):
    """Records every frame that passes, in order, each with its direction; any ErrorFrame
    fails the next wait. ``speaker``: it stands for the output transport, which tells the
    pipeline the bot stopped speaking once the reply has played (upstream, as transports do)."""

    def __init__(self, name: str, speaker: bool = False) -> None:
        super().__init__(name=name)
        self.speaker = speaker
        self.seen: list[tuple[Frame, FrameDirection]] = []
        self._new = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.seen.append((frame, direction))
        self._new.set()
        await self.push_frame(frame, direction)
        if self.speaker and isinstance(frame, TTSStoppedFrame):
            await self.push_frame(BotStoppedSpeakingFrame(), FrameDirection.UPSTREAM)

    def frames(self, after: int = 0) -> list[Frame]:
        return [frame for frame, _ in self.seen[after:]]

    async def wait(self, kind: type[Frame], seconds: float = 30, after: int = 0) -> int:
        """The index of the first ``kind`` frame at or after ``after``."""
        deadline = time.monotonic() + within(seconds)
        while True:
            for i, frame in enumerate(self.frames(after), after):
                assert not isinstance(frame, ErrorFrame), frame.error
                if isinstance(frame, kind):
                    return i
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [type(f).__name__ for f in self.frames(after)]
                raise AssertionError(f"no {kind.__name__} within {seconds} s; got {kinds}")
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), left)


class Reply:
    """One reply as the service pushed it: between its TTSStartedFrame and TTSStoppedFrame."""

    def __init__(self, frames: list[Frame]) -> None:
        started = next(i for i, f in enumerate(frames) if isinstance(f, TTSStartedFrame))
        stopped = next(i for i, f in enumerate(frames) if isinstance(f, TTSStoppedFrame))
        audio = [f for f in frames[started:stopped] if isinstance(f, TTSAudioRawFrame)]
        assert audio and {(f.sample_rate, f.num_channels) for f in audio} == {(24_000, 1)}
        self.pcm = np.frombuffer(b"".join(f.audio for f in audio), "<i2").astype(np.int16)
        self.text = "".join(f.text for f in frames[:stopped] if isinstance(f, TTSTextFrame))

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 24_000


def assert_whole(reply: Reply) -> None:
    """The tone pipeline's reply: every sentence's audio, its words as the transcript."""
    assert SENTENCES * SENTENCE_MS / 1000 - 0.1 < reply.seconds < SENTENCES * SENTENCE_MS / 1000 + 1
    assert rms(reply.pcm) > 1000  # the tones, not silence
    assert reply.text.startswith("As told: " + INSTRUCTIONS), reply.text  # the instructions
    assert reply.text.endswith("Tone number 2 for epoch 0."), reply.text


def mic_frames(pcm48: npt.NDArray[np.int16]) -> list[InputAudioRawFrame]:
    pcm = resample(pcm48, 48_000, INPUT_RATE)
    step = INPUT_RATE * PIECE_MS // 1000
    return [
        InputAudioRawFrame(
            audio=pcm[i : i + step].astype("<i2").tobytes(), sample_rate=INPUT_RATE, num_channels=1
        )
        for i in range(0, len(pcm), step)
    ]


async def say(worker: PipelineWorker, pcm48: npt.NDArray[np.int16]) -> None:
    """``pcm48`` as a transport's microphone frames, at real time."""
    started = time.monotonic()
    for i, frame in enumerate(mic_frames(pcm48)):
        await worker.queue_frame(frame)
        await asyncio.sleep(max(0.0, started + (i + 1) * PIECE_MS / 1000 - time.monotonic()))


@contextlib.asynccontextmanager
async def pipecat(url: str) -> AsyncIterator[tuple[PipelineWorker, Tap, Tap]]:
    """A running Pipecat pipeline (mic tap, the Realtime service, speaker tap) on ``url``;
    ended with an EndFrame on the way out."""
    llm = OpenAIRealtimeLLMService(
        api_key=TOKEN,
        base_url=url.replace("http://", "ws://") + "/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(system_instruction=INSTRUCTIONS),
    )
    mic, speaker = Tap("mic"), Tap("speaker", speaker=True)
    worker = PipelineWorker(
        Pipeline([mic, llm, speaker]),
        params=PipelineParams(audio_in_sample_rate=INPUT_RATE, audio_out_sample_rate=24_000),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running_task = asyncio.create_task(runner.run())
    try:
        yield worker, mic, speaker
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(running_task, within(10))
        finally:
            running_task.cancel()


async def test_pipecat_holds_a_typed_and_a_spoken_turn() -> None:
    async with running({"server.auth_tokens": TOKEN}, pipeline=pipeline) as (url, app):
        async with pipecat(url) as (worker, mic, speaker):
            # typed: the context's user message, answered aloud
            context = LLMContext(
                messages=[{"role": "user", "content": "When does the museum open?"}]
            )
            await worker.queue_frame(LLMContextFrame(context))
            end = await speaker.wait(LLMFullResponseEndFrame)
            typed = Reply(speaker.frames()[: end + 1])
            assert_whole(typed)
            # spoken: microphone frames; the server's VAD ends the turn, Pipecat hears it
            n, m = len(speaker.seen), len(mic.seen)
            question = speak("What time does the museum open?")
            await say(worker, np.concatenate([silence(300), question, silence(1500)]))
            heard = await mic.wait(TranscriptionFrame, after=m)  # upstream, from the service
            said = mic.frames()[heard]
            assert isinstance(said, TranscriptionFrame)
            assert said.text.startswith("utterance of"), said.text  # the tone pipeline's ASR
            spoken_ms = float(said.text.split()[2])
            assert 0.6 * len(question) / 48 < spoken_ms < len(question) / 48 + 1200
            first = await speaker.wait(ProposedUserStartedSpeakingFrame, after=n)
            last = await speaker.wait(ProposedUserStoppedSpeakingFrame, after=n)
            end = await speaker.wait(LLMFullResponseEndFrame, after=last)
            assert first < last
            spoken = Reply(speaker.frames(last)[: end + 1 - last])
            assert_whole(spoken)
            errors = [f for f in mic.frames() + speaker.frames() if isinstance(f, ErrorFrame)]
            assert not errors, errors
            print(
                f"\nPipecat: typed reply {typed.seconds:.1f} s {typed.text!r}; "
                f"heard {said.text!r}; spoken reply {spoken.seconds:.1f} s"
            )
        await asyncio.sleep(0.3)
        assert len(app[REGISTRY_KEY]) == 0  # the pipeline ended: its socket closed the session
