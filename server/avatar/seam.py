"""The avatar seam: what a face renderer is given (a :class:`FaceState`) and what it returns.

The server decides *what* the face does at media time t (viseme of the audio playing at t,
blink, head motion, expression); a renderer in ``models/`` only draws it. A neural talking head
on a GPU machine implements the same :class:`AvatarRenderer` Protocol.

Visemes are the 15 of the Oculus/MPEG-4 set (``sil PP FF TH DD kk CH SS nn RR aa E I O U``);
their ids are part of the ``avatar.viseme`` event contract.
"""

# ruff: noqa: RUF001  (IPA symbols look like Latin letters on purpose)
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt


class Viseme(IntEnum):
    """Mouth shapes; the integer is the wire id of ``avatar.viseme``."""

    SIL = 0  # closed, at rest
    PP = 1  # p b m: lips pressed
    FF = 2  # f v: lower lip under the teeth
    TH = 3  # th: tongue between the teeth
    DD = 4  # t d: slightly open
    KK = 5  # k g: open, tongue back
    CH = 6  # ch j sh: lips forward, teeth close
    SS = 7  # s z: teeth together, wide
    NN = 8  # n l: slightly open
    RR = 9  # r: rounded, small
    AA = 10  # a: wide open
    E = 11  # e: mid open, wide
    I = 12  # noqa: E741 (i: narrow open, wide spread)
    O = 13  # noqa: E741 (o: round open)
    U = 14  # u: round, small


class Expression(Enum):
    """What the face conveys; eyebrows and eyes follow it."""

    IDLE = "idle"  # nobody talks
    LISTENING = "listening"  # the user speaks: attentive, raised brows, nods
    THINKING = "thinking"  # the reply is being prepared: eyes aside, brows knit
    SPEAKING = "speaking"  # the avatar talks
    SMILING = "smile"  # a momentary cue (a gesture): a grin, narrowed eyes
    SURPRISED = "surprise"  # a momentary cue: wide eyes, brows high, an open "oh"


@dataclass(frozen=True)
class FaceState:
    """Everything that decides one frame. Renderers must be a pure function of it.

    Angles are degrees, gaze and weights are unitless.
    """

    appearance: str
    viseme: Viseme = Viseme.SIL
    viseme_weight: float = 0.0  # 0 = mouth at rest .. 1 = the viseme's full shape
    expression: Expression = Expression.IDLE
    blink: float = 0.0  # 0 = eyes open .. 1 = closed
    head_yaw: float = 0.0  # turn, + = the avatar's left (viewer's right), |x| <= 8
    head_pitch: float = 0.0  # nod, + = down, |x| <= 8
    head_roll: float = 0.0  # tilt, |x| <= 6
    gaze_x: float = 0.0  # -1 (viewer's left) .. 1 (viewer's right)
    gaze_y: float = 0.0  # -1 (up) .. 1 (down)


class AvatarRenderer(Protocol):
    """Draws faces. Called off the event loop; must be deterministic and thread-safe."""

    @property
    def appearances(self) -> tuple[str, ...]:
        """Names of the selectable looks; the first is the default."""
        ...

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of every frame, pixels."""
        ...

    def render(self, state: FaceState) -> npt.NDArray[np.uint8]:
        """The frame for ``state``: an (height, width, 3) uint8 RGB array (do not mutate it)."""
        ...

    def warm(
        self,
        appearance: str,
        stop: threading.Event | None = None,
        pace: Callable[[], None] | None = None,
    ) -> None:
        """Prepare everything a look needs ahead of the first frames (seconds of CPU); returns
        early once ``stop`` is set. ``pace`` is called between two pieces of the work (a few
        ms each) and may block: the warm-up waits there while live sessions go first."""
        ...


# IPA phonemes (espeak-ng, as piper emits them) -> viseme. Stress/length marks are stripped.
_PHONEME_VISEMES: dict[str, Viseme] = {
    **dict.fromkeys(["p", "b", "m"], Viseme.PP),
    **dict.fromkeys(["f", "v"], Viseme.FF),
    **dict.fromkeys(["θ", "ð"], Viseme.TH),
    **dict.fromkeys(["t", "d", "ɾ", "ʔ"], Viseme.DD),
    **dict.fromkeys(["k", "g", "ɡ", "ŋ", "h", "x"], Viseme.KK),
    **dict.fromkeys(["ʃ", "ʒ", "tʃ", "dʒ", "ʧ", "ʤ", "j"], Viseme.CH),
    **dict.fromkeys(["s", "z"], Viseme.SS),
    **dict.fromkeys(["n", "l", "ɫ"], Viseme.NN),
    **dict.fromkeys(["ɹ", "r", "ɚ", "ɝ", "ɐ˞", "ɜ˞"], Viseme.RR),
    **dict.fromkeys(["a", "ɑ", "æ", "ʌ", "ɐ", "aɪ", "aʊ", "ɒ"], Viseme.AA),
    **dict.fromkeys(["e", "ɛ", "eɪ", "ə", "ɜ", "ɛɹ"], Viseme.E),
    **dict.fromkeys(["i", "ɪ", "ᵻ", "ɨ"], Viseme.I),
    **dict.fromkeys(["o", "ɔ", "oʊ", "ɔɪ", "ɔɹ"], Viseme.O),
    **dict.fromkeys(["u", "ʊ", "w", "ʊɹ"], Viseme.U),
}
_MARKS = "ˈˌːˑ̩"


def viseme_of(phoneme: str) -> Viseme:
    """The mouth shape of one IPA phoneme; pauses, punctuation and unknown symbols are SIL."""
    bare = "".join(ch for ch in phoneme if ch not in _MARKS).strip()
    if not bare:
        return Viseme.SIL
    if bare in _PHONEME_VISEMES:
        return _PHONEME_VISEMES[bare]
    return _PHONEME_VISEMES.get(bare[0], Viseme.SIL)


# How far each viseme opens the jaw (0..1): a renderer's and a game engine's hint.
VISEME_OPENING: dict[Viseme, float] = {
    Viseme.SIL: 0.0,
    Viseme.PP: 0.0,
    Viseme.FF: 0.15,
    Viseme.TH: 0.25,
    Viseme.DD: 0.3,
    Viseme.KK: 0.45,
    Viseme.CH: 0.3,
    Viseme.SS: 0.15,
    Viseme.NN: 0.25,
    Viseme.RR: 0.3,
    Viseme.AA: 1.0,
    Viseme.E: 0.6,
    Viseme.I: 0.4,
    Viseme.O: 0.75,
    Viseme.U: 0.35,
}
