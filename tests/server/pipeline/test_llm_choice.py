"""Which in-process LLM engine the server starts: the setting, the model's kind, the machine."""

from __future__ import annotations

import pytest

from server.pipeline.wiring import llm_engine_name


@pytest.mark.parametrize(
    ("setting", "model", "gpu_vllm", "engine"),
    [
        ("auto", "", False, "llamacpp"),  # the embedded default on a CPU machine
        ("auto", "", True, "vllm"),  # ... and where vLLM's GPU build is installed
        ("auto", "/models/qwen.gguf", True, "llamacpp"),  # a GGUF file runs on llama.cpp
        ("auto", "/models/qwen-hf", False, "vllm"),  # a Hugging Face folder on vLLM
        ("auto", "smollm2-135m", True, "llamacpp"),  # an embedded model by its name
        ("vllm", "", False, "vllm"),  # the operator's choice wins
        ("llamacpp", "", True, "llamacpp"),
    ],
)
def test_the_llm_engine_follows_the_setting_the_model_and_the_machine(
    setting: str, model: str, gpu_vllm: bool, engine: str
) -> None:
    assert llm_engine_name(setting, model, gpu_vllm) == engine


def test_vllm_on_a_cpu_with_amx_runs_float32() -> None:
    from models.llm_vllm import cpu_dtype

    assert cpu_dtype("bfloat16", "fpu avx2 avx512f amx_bf16 amx_tile") == "float32"
    assert cpu_dtype("bfloat16", "fpu avx2 avx512f avx512_bf16") == "bfloat16"
    assert cpu_dtype("auto", "amx_bf16") == "auto"  # only bfloat16 is replaced
