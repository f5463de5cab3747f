"""Optimised ONNX graphs kept between starts (models/onnx_cache.py): the next session loads the
kept graph without optimising or even reading the model, says exactly what a session optimised
in memory says, and a kept graph that is broken, stale or cannot be written costs only time."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from models.onnx_cache import cache_path, open_cached_session
from models.tts import OnnxVoiceTts


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A model file of one node: Z = X + Y (floats, 3 wide)."""
    path = tmp_path / "adder.onnx"
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])
    z = helper.make_tensor_value_info("Z", TensorProto.FLOAT, [3])
    graph = helper.make_graph([helper.make_node("Add", ["X", "Y"], ["Z"])], "adder", [x, y], [z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class Opener:
    """Opens ``source`` through the cache, counting how often the model had to be read."""

    def __init__(self, source: Path, cache_dir: Path | None) -> None:
        self.source, self.cache_dir, self.builds = source, cache_dir, 0

    def build(self) -> bytes:
        self.builds += 1
        return self.source.read_bytes()

    def open(self, variant: str = "") -> Any:
        return open_cached_session(
            self.source,
            self.build,
            onnxruntime.SessionOptions,
            cache_dir=self.cache_dir,
            variant=variant,
        )


def adds(session: Any) -> bool:
    x, y = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.float32)
    (z,) = session.run(None, {"X": x, "Y": y})
    return bool(np.array_equal(z, x + y))


def test_the_second_session_loads_the_kept_graph_without_reading_the_model(
    source: Path, tmp_path: Path
) -> None:
    opener = Opener(source, tmp_path / "kept")
    assert adds(opener.open()) and opener.builds == 1
    kept = cache_path(tmp_path / "kept", source, "")
    assert kept.is_file()
    assert adds(opener.open()) and opener.builds == 1  # loaded as kept
    assert [p.name for p in (tmp_path / "kept").iterdir()] == [kept.name]  # no temporary left


def test_a_changed_model_or_change_gets_a_graph_of_its_own_and_the_old_one_goes(
    source: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "kept"
    opener = Opener(source, cache)
    opener.open()
    first = cache_path(cache, source, "")
    assert cache_path(cache, source, "output /Ceil_output_0") != first
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new version
    assert cache_path(cache, source, "") != first
    assert adds(opener.open()) and opener.builds == 2
    assert sorted(cache.iterdir()) == [cache_path(cache, source, "")]


def test_a_kept_graph_that_will_not_load_is_built_again(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "kept"
    cache.mkdir()
    kept = cache_path(cache, source, "")
    kept.write_bytes(b"not a model")
    opener = Opener(source, cache)
    with caplog.at_level(logging.WARNING):
        assert adds(opener.open())
    assert "will not load" in caplog.text and opener.builds == 1
    assert adds(opener.open()) and opener.builds == 1  # the new one loads


def test_a_folder_that_cannot_be_written_costs_only_the_saving(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would be")
    opener = Opener(source, blocker / "kept")
    with caplog.at_level(logging.WARNING):
        assert adds(opener.open())
    assert "cannot keep" in caplog.text
    assert adds(Opener(source, None).open())  # no cache asked for: optimised in memory


def test_a_voice_from_its_kept_graph_says_a_seeded_text_the_same_way_each_time(
    tmp_path: Path,
) -> None:
    """The first session builds and keeps the graph, then runs on it as kept, as the later ones
    do: a seeded voice's random kernels draw the same seeds in all of them. The kept graph's
    speech is the voice's, as one optimised in memory: the same length within 1 %."""
    text = "Hello there, how are you today?"
    said = [OnnxVoiceTts(threads=1, seed=5, cache_dir=tmp_path).synthesize(text) for _ in range(3)]
    kept = sorted(path.name.split(".")[1] for path in tmp_path.glob("*.onnx"))
    assert kept == ["decoder", "front"]  # one graph per part: neither removes the other
    for speech in said[1:]:
        assert np.array_equal(speech.pcm, said[0].pcm)
        assert speech.words == said[0].words and speech.phonemes == said[0].phonemes
    in_memory = OnnxVoiceTts(threads=1, seed=5, cache_dir=None).synthesize(text)
    assert [w.word for w in in_memory.words] == [w.word for w in said[0].words]
    assert abs(len(in_memory.pcm) - len(said[0].pcm)) < 0.01 * len(in_memory.pcm)
