"""A tone pipeline whose engines fail on cue, for fault-injection tests.

Selected with ``--set pipeline.factory=tests.support.fault_pipeline:create``. Typed text
``fault:<name>`` makes the reply it starts fail as :class:`Fault` ``<name>`` says; typed text
``arm:<name>`` (a transcription fault) is answered normally and makes the session's next final
transcription fail. Any other turn is answered like the tone pipeline (``TONE_PIPELINE_MS``,
``TONE_PIPELINE_SENTENCES``). Faults are kept per session, so other sessions never see them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from enum import Enum

import numpy as np
import numpy.typing as npt

from server.config import Config
from server.pipeline.seams import ReplyPiece, ReplyRequest, SpeechAudio, Transcript, TurnTrace
from server.runtime.conditions import Conditions
from server.runtime.history import Role
from server.scheduling.engine_queue import JobTag
from tests.support.tone_pipeline import TonePipeline

log = logging.getLogger(__name__)

FAULT_PREFIX = "fault:"
ARM_PREFIX = "arm:"


class Fault(Enum):
    """What goes wrong; ``raises``: an exception, ``hangs``: never returns, ``dies``: the engine
    process is gone (a connection reset) after the reply has started."""

    REPLY_RAISES = "reply_raises"  # the LLM fails before its first sentence
    REPLY_HANGS = "reply_hangs"  # the LLM never yields a sentence
    REPLY_DIES_MID = "reply_dies_mid"  # the LLM stream breaks after the first sentence
    SYNTH_DIES_SECOND = "synth_dies_second"  # TTS dies on the second sentence
    SYNTH_HANGS_SECOND = "synth_hangs_second"  # TTS never returns the second sentence
    TRANSCRIBE_RAISES = "transcribe_raises"  # ASR fails on the final transcript
    TRANSCRIBE_HANGS = "transcribe_hangs"  # ASR never returns the final transcript


TRANSCRIBE_FAULTS = (Fault.TRANSCRIBE_RAISES, Fault.TRANSCRIBE_HANGS)


class EngineFault(RuntimeError):
    """An injected engine failure."""


class EngineDied(ConnectionResetError):
    """An injected crash of an engine process in the middle of its work."""


async def hang() -> None:
    """Wait forever (until cancelled), like an engine that stopped answering."""
    await asyncio.Event().wait()


def _user_text(request: ReplyRequest) -> str:
    users = [entry.text for entry in request.context if entry.role is Role.USER]
    return users[-1] if users else ""


def _named(text: str, prefix: str) -> Fault | None:
    if not text.startswith(prefix):
        return None
    return Fault(text.removeprefix(prefix).strip())


class FaultPipeline(TonePipeline):
    """TonePipeline plus faults on cue; counts what it injected and logs it at shutdown."""

    def __init__(self, sentence_ms: float, sentences: int) -> None:
        super().__init__(sentence_ms, max(2, sentences))  # faults on the 2nd need a 2nd
        self._reply_fault: dict[str, Fault] = {}  # session id -> fault of its current reply
        self._armed: dict[str, Fault] = {}  # session id -> fault of its next transcription
        self.injected: dict[Fault, int] = dict.fromkeys(Fault, 0)

    def _inject(self, fault: Fault) -> None:
        self.injected[fault] += 1

    async def transcribe(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> str:
        fault = self._armed.pop(tag.session_id, None)
        if fault is Fault.TRANSCRIBE_RAISES:
            self._inject(fault)
            raise EngineFault("speech recogniser failed")
        if fault is Fault.TRANSCRIBE_HANGS:
            self._inject(fault)
            await hang()
        return await super().transcribe(utterance, tag)

    async def partial_transcript(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> Transcript:
        return Transcript(await super().transcribe(utterance, tag))

    async def reply(self, request: ReplyRequest, trace: TurnTrace) -> AsyncIterator[ReplyPiece]:
        text = _user_text(request)
        armed = _named(text, ARM_PREFIX)
        if armed is not None:
            if armed not in TRANSCRIBE_FAULTS:
                raise ValueError(f"only transcription faults can be armed, not {armed.value}")
            self._armed[request.session_id] = armed
        fault = _named(text, FAULT_PREFIX)
        self._reply_fault.pop(request.session_id, None)
        if fault is not None:
            self._reply_fault[request.session_id] = fault
        if fault is Fault.REPLY_RAISES:
            self._inject(fault)
            raise EngineFault("language model failed")
        if fault is Fault.REPLY_HANGS:
            self._inject(fault)
            await hang()
        count = 0
        async for sentence in super().reply(request, trace):
            if count == 1 and fault is Fault.REPLY_DIES_MID:
                self._inject(fault)
                raise EngineDied("language model process died")
            count += 1
            yield sentence

    async def synthesize(self, text: str, conditions: Conditions, tag: JobTag) -> SpeechAudio:
        fault = self._reply_fault.get(tag.session_id)
        second = text.startswith("Tone number 2")
        if second and fault is Fault.SYNTH_DIES_SECOND:
            self._inject(fault)
            raise EngineDied("speech engine process died")
        if second and fault is Fault.SYNTH_HANGS_SECOND:
            self._inject(fault)
            await hang()
        return await super().synthesize(text, conditions, tag)

    async def close(self) -> None:
        counts = ", ".join(f"{f.value} {n}" for f, n in self.injected.items() if n)
        log.info("faults injected: %s", counts or "none")
        await super().close()


def create(config: Config) -> FaultPipeline:
    return FaultPipeline(
        float(os.environ.get("TONE_PIPELINE_MS", "800")),
        int(os.environ.get("TONE_PIPELINE_SENTENCES", "2")),
    )
