"""The seam between the session runtime and the engines that answer the user.

A :class:`TurnPipeline` is shared by all sessions. The runtime asks it for the final transcript
of an utterance, then for the reply's sentences (the LLM stage), then for each sentence's audio
(the TTS stage) under the conditions in force at that chunk boundary.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from server.chunk import WordTiming
from server.conditions import Conditions
from server.config import Config
from server.errors import ConfigError
from server.history import ContextEntry


@dataclass(frozen=True)
class ReplyRequest:
    """What the LLM stage needs to write a reply."""

    session_id: str
    epoch: int
    context: tuple[ContextEntry, ...]
    conditions: Conditions


@dataclass(frozen=True)
class SpeechAudio:
    """A sentence's audio: int16 mono at 48 kHz, with word timings (samples) if known."""

    pcm: npt.NDArray[np.int16]
    words: tuple[WordTiming, ...] = ()


class TurnPipeline(Protocol):
    """Engines behind the runtime (ASR, LLM, TTS); shared by every session."""

    async def transcribe(self, utterance: npt.NDArray[np.int16]) -> str:
        """Final transcript of a 16 kHz mono utterance ("" when nothing was said)."""
        ...

    def reply(self, request: ReplyRequest) -> AsyncIterator[str]:
        """The reply, one sentence (chunk text) at a time."""
        ...

    async def synthesize(self, text: str, conditions: Conditions) -> SpeechAudio:
        """Speech for one sentence in the voice of ``conditions``."""
        ...

    async def close(self) -> None:
        """Release engines at shutdown."""
        ...


PipelineFactory = Callable[[Config], TurnPipeline]


def load_pipeline(config: Config) -> TurnPipeline | None:
    """Build the pipeline named by ``pipeline.factory`` (``module:function``); None if unset."""
    spec = config.pipeline.factory
    if not spec:
        return None
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(f"pipeline.factory: expected 'module:function', got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"pipeline.factory: cannot load {spec!r}: {exc}") from None
    return cast(PipelineFactory, factory)(config)
