"""The model ladder: the largest model whose predicted reply meets the budget, climbing down
past models that are too slow or fail to load; a named model is not climbed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from server.__main__ import calibrate_server
from server.config import Config, load_config
from server.errors import ConfigError
from server.pipeline.ladder import Climb, NoRungLoaded, RungOutcome, load_next
from server.pipeline.wiring import llm_rungs

LADDER = ("small", "medium", "large")


def climb_with(
    budget_ms: float, predicted: Mapping[str, float], broken: frozenset[str] = frozenset()
) -> Climb:
    """A climb of LADDER where each rung predicts ``predicted[name]`` ms (capacity 2) and
    those in ``broken`` fail to load."""
    climb = Climb(LADDER, budget_ms)
    while (name := climb.next_rung()) is not None:
        if name in broken:
            climb.failed(name, "FileNotFoundError: no such file")
            continue
        climb.loaded(name)
        climb.measured(name, predicted[name], capacity=2)
    return climb


TIMES = {"small": 400.0, "medium": 800.0, "large": 1400.0}


def test_the_largest_that_meets_the_budget_is_picked_and_no_smaller_one_is_tried() -> None:
    climb = climb_with(1000, TIMES)
    choice = climb.choice()
    assert choice.model == "medium"
    assert [(t.name, t.outcome) for t in choice.trials] == [
        ("large", RungOutcome.TOO_SLOW),
        ("medium", RungOutcome.FITS),
    ]
    assert "meets the budget of 1000 ms" in choice.reason and not choice.explicit


def test_on_a_fast_machine_the_largest_is_picked_at_once() -> None:
    choice = climb_with(2000, TIMES).choice()
    assert choice.model == "large" and len(choice.trials) == 1
    assert choice.reason.startswith("the largest")


def test_a_lower_budget_picks_a_smaller_model() -> None:
    assert climb_with(600, TIMES).choice().model == "small"


def test_where_none_fits_the_smallest_that_loaded_is_picked_and_the_miss_is_said() -> None:
    choice = climb_with(300, TIMES).choice()
    assert choice.model == "small"
    assert "none meets the budget of 300 ms" in choice.reason
    assert all(t.outcome is RungOutcome.TOO_SLOW for t in choice.trials)


def test_a_model_that_fails_to_load_is_passed_over() -> None:
    choice = climb_with(2000, TIMES, broken=frozenset({"large"})).choice()
    assert choice.model == "medium"
    first = choice.trials[0]
    assert first.outcome is RungOutcome.FAILED and "no such file" in (first.error or "")


def test_the_smallest_that_loaded_is_kept_when_a_smaller_one_fails() -> None:
    choice = climb_with(300, TIMES, broken=frozenset({"small"})).choice()
    assert choice.model == "medium"  # the engine still holds it


def test_no_model_loading_is_an_error_naming_each_failure() -> None:
    climb = climb_with(1000, TIMES, broken=frozenset(LADDER))
    with pytest.raises(NoRungLoaded, match=r"large: failed .*medium: failed .*small: failed"):
        climb.choice()


def test_a_model_that_admits_no_session_does_not_fit() -> None:
    climb = Climb(("only",), 1000)
    assert climb.next_rung() == "only"
    climb.loaded("only")
    climb.measured("only", 500, capacity=0)
    assert climb.trials[0].outcome is RungOutcome.TOO_SLOW


def test_a_named_model_is_not_climbed_and_says_so() -> None:
    climb = Climb(("mine.gguf",), 1000, explicit=True)
    assert climb.next_rung() == "mine.gguf"
    climb.loaded("mine.gguf")
    assert climb.pending == "mine.gguf"
    climb.measured("mine.gguf", 1500, capacity=1)
    assert climb.pending is None and climb.next_rung() is None
    choice = climb.choice()
    assert choice.model == "mine.gguf" and choice.explicit
    assert "misses the budget" in choice.reason


def test_a_ladder_refuses_repeats_and_an_empty_list() -> None:
    with pytest.raises(ValueError):
        Climb((), 1000)
    with pytest.raises(ValueError):
        Climb(("a", "a"), 1000)


def test_load_next_reports_what_failed_and_returns_the_first_that_loads() -> None:
    climb = Climb(LADDER, 1000)

    async def load(name: str) -> str:
        if name == "large":
            raise ConfigError("pipeline.llm_ladder: 22 GGUF piece(s) missing")
        return f"engine of {name}"

    assert asyncio.run(load_next(climb, load)) == "engine of medium"
    assert climb.pending == "medium"
    assert climb.trials[0].outcome is RungOutcome.FAILED
    assert "ConfigError: pipeline.llm_ladder: 22 GGUF" in (climb.trials[0].error or "")


@pytest.mark.parametrize(
    ("settings", "rungs", "named"),
    [
        ({}, ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"), False),
        ({"pipeline.llm_model": "qwen2.5-coder-0.5b"}, ("qwen2.5-coder-0.5b",), True),
        ({"pipeline.llm_ladder": "a.gguf,b.gguf"}, ("a.gguf", "b.gguf"), False),
        (
            {"pipeline.llm_remote_urls": "http://10.0.0.2:8000", "pipeline.llm_remote_model": "m"},
            ("m",),
            True,
        ),
    ],
)
def test_the_rungs_follow_the_settings(
    settings: dict[str, str], rungs: tuple[str, ...], named: bool
) -> None:
    config = load_config(None, {}, settings)
    assert llm_rungs(config, gpu_vllm=False) == (rungs, named)


def test_where_gpu_vllm_serves_its_default_folder_is_named_unless_a_ladder_is_set() -> None:
    (folder,), named = llm_rungs(Config(), gpu_vllm=True)
    assert named and folder.endswith("smollm2-135m-instruct")
    config = load_config(None, {}, {"pipeline.llm_ladder": "a.gguf,b.gguf"})
    assert llm_rungs(config, gpu_vllm=True) == (("a.gguf", "b.gguf"), False)


def test_a_ladder_naming_a_model_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="twice"):
        load_config(None, {}, {"pipeline.llm_ladder": "a.gguf,a.gguf"})


class LadderPipeline:
    """A pipeline of LADDER whose LLM warm-up gives each rung's (fake) first token and speed;
    the models in ``broken`` fail to load."""

    def __init__(
        self, budget_ms: float, first_token_ms: Mapping[str, float | None], broken: set[str]
    ):
        self.climb: Climb | None = Climb(LADDER, budget_ms)
        self.first_token_ms = first_token_ms
        self.broken = broken
        self.held: str | None = None
        self.tuned = False

    async def load(self, name: str) -> str:
        if name in self.broken:
            raise FileNotFoundError(name)
        return name

    async def start(self) -> None:
        assert self.climb is not None
        self.held = await load_next(self.climb, self.load)

    async def warm_up_llm(self) -> dict[str, float | None]:
        assert self.held is not None
        first = self.first_token_ms[self.held]
        if first is None:  # it wrote nothing: the warm-up reports a failed stage
            return {"llm_first_token_ms": None, "llm_tokens_per_s": None}
        return {"llm_first_token_ms": first, "llm_tokens_per_s": 40.0}

    async def load_next_rung(self) -> bool:
        assert self.climb is not None
        engine = await load_next(self.climb, self.load)
        if engine is None:
            return False
        self.held = engine
        return True

    def tune(self, settings: object, stage_share: float = 1.0) -> None:
        self.tuned = True


# the engines' other warm-up figures: a fast machine's
SPEECH_TIMES: dict[str, float | None] = {
    "asr_again_ms": 90.0,
    "asr_audio_ms": 2300.0,
    "asr_partial_ms": 60.0,
    "tts_ms": 150.0,
    "tts_audio_ms": 2000.0,
}
# far apart, so that the pick is the same on any machine the tests run on
FIRST_TOKENS = {"small": 40.0, "medium": 100.0, "large": 5000.0}


def start(
    budget_ms: float,
    broken: set[str] | None = None,
    first_tokens: Mapping[str, float | None] = FIRST_TOKENS,
) -> tuple[LadderPipeline, dict[str, Any]]:
    """The server's calibration on LadderPipeline: the pipeline and /healthz's calibration."""
    config = load_config(None, {}, {"transport.video": "false"})
    pipeline = LadderPipeline(budget_ms, first_tokens, broken or set())

    async def run() -> dict[str, Any]:
        await pipeline.start()
        times = {**SPEECH_TIMES, **await pipeline.warm_up_llm()}
        _, _, calibration = await calibrate_server(config, pipeline, None, times)  # type: ignore[arg-type]
        return calibration.to_dict()

    return pipeline, asyncio.run(run())


def test_the_server_start_loads_the_pick_and_healthz_shows_why() -> None:
    pipeline, shown = start(2000)
    assert pipeline.held == "medium" and pipeline.tuned
    llm = shown["llm"]
    assert isinstance(llm, dict) and llm["model"] == "medium"
    assert [t["name"] for t in llm["trials"]] == ["large", "medium"]
    assert llm["trials"][0]["outcome"] == "too slow"
    # the figures shown are the pick's
    assert shown["llm_first_token_ms"] == 100.0
    assert shown["predicted_heard_ms"] == pytest.approx(llm["trials"][1]["predicted_ms"], abs=0.1)


def test_the_server_start_passes_over_a_model_that_fails_and_keeps_the_last_that_loaded() -> None:
    pipeline, shown = start(100, broken={"small"})
    assert pipeline.held == "medium"
    llm = shown["llm"]
    assert llm["model"] == "medium" and "none meets" in llm["reason"]
    assert [t["outcome"] for t in llm["trials"]] == ["too slow", "too slow", "failed"]


def test_a_model_that_writes_nothing_in_its_warm_up_is_passed_over() -> None:
    pipeline, shown = start(2000, first_tokens={**FIRST_TOKENS, "large": None})
    assert pipeline.held == "medium"
    first = shown["llm"]["trials"][0]
    assert first["outcome"] == "too slow" and first["predicted_ms"] is None
    json.dumps(shown)  # /healthz's body: no infinity in it


def test_the_default_ladder_is_the_embedded_models_setup_prepares() -> None:
    from models.gguf_models import LADDER

    assert Config().pipeline.llm_ladder == LADDER
