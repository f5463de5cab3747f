"""The model ladder on the embedded models: the server climbs down past a model that is not
there and one whose predicted reply misses the budget, answers with the one it kept, and
/healthz says which and why. The ``openai`` package asks a typed question of the pick."""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.server.http.test_realtime_ws import Listener
from tests.support.server_process import ServerProcess, server_process

pytestmark = pytest.mark.timeout(600)

TOKEN = "token-ladder-models-0123456789"
MISSING = "/nonexistent/larger-model.gguf"

# a budget no model meets (the end-of-turn wait alone is longer): the climb goes to the bottom
server = server_process(
    {
        "server.auth_tokens": TOKEN,
        "transport.video": "false",
        "pipeline.llm_model": "",  # the ladder (tests/conftest.py names the 0.5B otherwise)
        "pipeline.llm_ladder": f"smollm2-135m,qwen2.5-coder-0.5b,{MISSING}",
        "pipeline.latency_budget_ms": "100",
    },
    timeout=400,
    log_tail=4000,
)


def test_the_ladder_passes_over_a_missing_model_and_keeps_the_smallest_when_none_fits(
    server: ServerProcess,
) -> None:
    llm: dict[str, Any] = server.health()["calibration"]["llm"]
    assert llm["model"] == "smollm2-135m" and not llm["explicit"]
    assert "none meets the budget of 100 ms" in llm["reason"]
    trials = llm["trials"]
    assert [t["name"] for t in trials] == [MISSING, "qwen2.5-coder-0.5b", "smollm2-135m"]
    assert trials[0]["outcome"] == "failed" and "no GGUF file" in trials[0]["error"]
    assert all(t["outcome"] == "too slow" and t["predicted_ms"] > 100 for t in trials[1:])
    log = server.log()
    assert "model ladder: smollm2-135m, none meets the budget" in log


async def test_the_model_kept_answers(server: ServerProcess) -> None:
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0)
    async with client.realtime.connect(model="gpt-realtime") as connection:
        listener = Listener(connection)
        try:
            await listener.wait("session.created", 30)
            await connection.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is the capital of France?"}],
                }
            )
            await connection.response.create()
            done = await listener.wait("response.done", 120)
            said = await listener.wait("response.output_audio_transcript.done", 5)
        finally:
            await listener.close()
    assert done["response"]["status"] == "completed"
    assert said["transcript"].strip(), "the kept model said nothing"
