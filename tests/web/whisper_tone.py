"""The browser tests' reply pipeline: real transcripts (Whisper tiny.en), tone replies.

The page must show what the user said, so the transcript comes from the real speech recogniser;
the replies are the tone pipeline's (known length, deterministic, no LLM start-up), so a test
knows when the avatar speaks and for how long. Selected with ``--set pipeline.factory=
tests.web.whisper_tone:create``; ``TONE_PIPELINE_MS`` / ``TONE_PIPELINE_SENTENCES`` as for the
tone pipeline.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import numpy.typing as npt

from models.asr import WhisperAsr
from server.config import Config
from server.pipeline.cpuplan import this_process_plan
from server.scheduling.engine_queue import JobTag
from tests.support.tone_pipeline import TonePipeline

MIN_UTTERANCE_SAMPLES = 1600  # 100 ms at 16 kHz: shorter is not a word


class WhisperTonePipeline(TonePipeline):
    """Tone replies; ``transcribe`` runs Whisper in a worker thread."""

    def __init__(self, asr: WhisperAsr, sentence_ms: float, sentences: int) -> None:
        super().__init__(sentence_ms, sentences)
        self._asr = asr

    async def transcribe(
        self, utterance: npt.NDArray[np.int16], tag: JobTag, prefix: str = ""
    ) -> str:
        if len(utterance) < MIN_UTTERANCE_SAMPLES:
            return ""
        return await asyncio.to_thread(self._asr.transcribe, utterance, prefix)


def create(config: Config) -> WhisperTonePipeline:
    return WhisperTonePipeline(
        WhisperAsr(cpu_threads=this_process_plan(config.pipeline.asr_threads).asr_threads),
        float(os.environ.get("TONE_PIPELINE_MS", "1500")),
        int(os.environ.get("TONE_PIPELINE_SENTENCES", "2")),
    )
