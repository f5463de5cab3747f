"""The procedural avatar (models/) fits the server's AvatarRenderer seam (server/avatar/seam.py)."""

from __future__ import annotations

import numpy as np

from models.avatar import EXPRESSIONS, VISEME_NAMES, VISEME_SHAPES, ProceduralAvatar
from server.avatar.seam import VISEME_OPENING, AvatarRenderer, Expression, FaceState, Viseme


def test_procedural_avatar_is_an_avatar_renderer() -> None:
    renderer: AvatarRenderer = ProceduralAvatar(192, 144)  # mypy checks the Protocol
    assert renderer.size == (192, 144)
    state = FaceState(
        appearance=renderer.appearances[0],
        viseme=Viseme.O,
        viseme_weight=1.0,
        expression=Expression.SPEAKING,
        blink=0.2,
        head_yaw=3.0,
        head_roll=-2.0,
        gaze_x=0.4,
    )
    frame = renderer.render(state)
    assert frame.shape == (144, 192, 3) and frame.dtype == np.uint8
    assert not np.array_equal(frame, renderer.render(FaceState(appearance="milo")))


def test_viseme_table_follows_the_wire_ids() -> None:
    assert [v.name.lower() for v in Viseme] == [n.lower() for n in VISEME_NAMES]
    for viseme in Viseme:
        drawn = VISEME_SHAPES[int(viseme)].opening
        assert abs(drawn - VISEME_OPENING[viseme]) <= 0.1, viseme.name


def test_every_expression_has_a_mood() -> None:
    assert {e.value for e in Expression} == set(EXPRESSIONS)
