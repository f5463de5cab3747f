"""Shared test helpers: a fake clock, small runtime configs, tones of known length, and the
client side of loopback calls (ICE pinned to 127.0.0.1, client peers closed after the test).

Every test's time limit (pytest-timeout: its marker, else the ini default) is stretched by the
slowness the suite measures at start (tests/support/pace.py); the run's output starts with
which CPU this is and how slow. A run of unit tests alone measures nothing (see below).

End-to-end tests are marked ``e2e`` here, so that ``pytest -m "not e2e"`` runs the unit tests
alone (pure logic on a fake clock, in seconds): those under tests/web, tests/models and
tests/deploy, those using a ``server_process`` fixture, real client peers (``peers``,
``client_ice``), and the modules and tests listed in ``E2E_MODULES`` and ``E2E_TESTS``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import numpy as np
import pytest

from server.clock import FakeClock
from server.config import RuntimeConfig
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from server.runtime.media import ms_to_samples
from server.runtime.playback import PCM
from server.runtime.session import Session
from tests.support import pace
from tests.support.peers import Peer
from tests.support.server_process import is_server_fixture

# the servers the tests start answer with the 0.5B whatever this machine affords (the model
# ladder would pick the 1.5B on a fast one): their replies are the ones the tests were written
# against. tests/models/test_ladder_e2e.py climbs the ladder itself (it sets pipeline.llm_model
# empty on the command line, which wins over the environment).
TESTS_LLM_ENV = "AVATAR_PIPELINE_LLM_MODEL"
os.environ.setdefault(TESTS_LLM_ENV, "qwen2.5-coder-0.5b")

E2E_DIRS = ("tests/web/", "tests/models/", "tests/deploy/")  # Chromium, real models, docker
E2E_FIXTURES = {"peers", "client_ice"}  # real aiortc client peers over loopback
E2E_MODULES = {  # modules whose tests (nearly all) start a server, real peers or a model
    "tests/server/http/test_app.py": "the server process",
    "tests/server/http/test_auth.py": "the server in process (tests.support.in_process), aiortc",
    "tests/server/http/test_guards.py": "the server in process, aiortc",
    "tests/server/http/test_whip.py": "the server in process, aiortc peers",
    "tests/server/http/test_remote_candidates.py": "the server in process, aiortc",
    "tests/server/http/test_session_caps.py": "the server in process, aiortc peers",
    "tests/server/http/test_realtime_ws.py": "the server in process, espeak-ng, Silero",
    "tests/server/http/test_agent_frameworks.py": "the server in process, Pipecat, Silero",
    "tests/server/conversation/test_resume.py": "the server in process, aiortc peers, Whisper",
    "tests/server/pipeline/test_turn_detector.py": "the Silero VAD model, espeak-ng",
    "tests/server/rtc/test_turn_relay.py": "coturn",
    "tests/benchmarks/test_talk_over_bench.py": "the joe voice, AEC3, the Silero VAD model",
    "tests/server/rtc/test_opus.py": "the joe voice",
    "tests/benchmarks/test_audio_loss_bench.py": "Whisper, the joe voice, espeak-ng",
}
E2E_TESTS = {  # single tests of otherwise unit modules
    "tests/server/test_config.py": (
        "test_cli_rejects_invalid_value_with_its_name",  # python -m server
        "test_cli_help_lists_settings",
        "test_a_port_in_use_is_one_line_before_any_model_loads",
        "test_an_agent_port_in_use_is_one_line_too",
    ),
    "tests/server/pipeline/test_voice.py": (
        "test_synthesized_chunks_carry_word_and_phoneme_timings",
    ),
    "tests/server/rtc/test_rtc.py": (
        "test_server_peer_releases_inbound_audio_packets_as_they_arrive",
        "test_a_lost_packet_leaves_the_inbound_audio_as_late_as_before",
        "test_lost_packets_are_recovered_from_fec_and_counted",
    ),
    "tests/benchmarks/test_whip_connect.py": (
        "test_one_connect_per_pair_succeeds_and_writes_json",
    ),
    "tests/benchmarks/test_jitter_bench.py": (
        "test_a_quick_run_writes_each_buffer_and_the_loss_holds_only_aiortcs",
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    """``-m "not e2e"``: no test waits on work, so the pace is not measured. Some modules
    compute constants with it at import (tests/web, test_soak.py), which would load Whisper
    while collecting tests that do not run; they get a pace of 1 instead."""
    if config.getoption("markexpr", "").split() == ["not", "e2e"]:
        os.environ.setdefault(pace.ENV, "1")


def is_e2e(item: pytest.Item) -> bool:
    """Whether ``item`` starts a server (a process or in process), real peers, a browser,
    docker or a real model (the rules above)."""
    root = item.config.rootpath
    path = (item.path.relative_to(root) if item.path.is_relative_to(root) else item.path).as_posix()
    if path.startswith(E2E_DIRS) or path in E2E_MODULES:
        return True
    if path in E2E_TESTS:
        module = getattr(item, "module", None)
        missing = [name for name in E2E_TESTS[path] if not hasattr(module, name)]
        if missing:
            raise pytest.UsageError(f"tests/conftest.py E2E_TESTS: {path} has no {missing}")
        if getattr(item, "originalname", item.name) in E2E_TESTS[path]:
            return True
    if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(is_server_fixture(fixturedef.func) for chain in defs for fixturedef in chain)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the end-to-end tests ``e2e``, before ``-m`` selects by it."""
    for path in [*E2E_MODULES, *E2E_TESTS]:
        if not (config.rootpath / path).is_file():
            raise pytest.UsageError(f"tests/conftest.py lists {path}, which does not exist")
    for item in items:
        if is_e2e(item):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Stretch the time limit of every selected test by the measured pace (waits on work grow
    with it). Unit tests do not wait on work: when no ``e2e`` test is selected, the pace is
    not measured (that would load Whisper) and the limits stay as written."""
    items = session.items
    if not items:
        return
    if not any(item.get_closest_marker("e2e") for item in items):
        print(f"\nmachine: {this_machine().describe()}\npace: not measured (no e2e test)")
        return
    factor = pace.factor()
    print(f"\nmachine: {this_machine().describe()}\npace: x{factor:.2f} ({pace.describe()})")
    default = float(session.config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = default
        if marker is not None:
            base = float(marker.args[0] if marker.args else marker.kwargs.get("timeout", default))
        if base > 0:
            item.add_marker(pytest.mark.timeout(base * factor), append=False)


def tone(ms: float, amplitude: int = 8000, hz: float = 220.0) -> PCM:
    """A sine tone of ``ms`` milliseconds at 48 kHz, int16 (never exactly zero inside)."""
    n = ms_to_samples(ms)
    t = np.arange(n) / 48_000
    pcm = (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    pcm[pcm == 0] = 1
    return pcm


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def runtime_config() -> RuntimeConfig:
    return RuntimeConfig(lookahead_budget_ms=2000, fade_ms=5.0)


@pytest.fixture
def session(clock: FakeClock, runtime_config: RuntimeConfig) -> Session:
    return Session("s" * 32, runtime_config, clock)


@pytest.fixture
def client_ice() -> None:
    """Client peers of this process offer 127.0.0.1 as their host candidate (aioice skips it)."""
    pin_host_addresses(["127.0.0.1"])


@pytest.fixture
async def peers(client_ice: None) -> AsyncIterator[list[Peer]]:
    """Client peers a test opens; closed when it ends."""
    opened: list[Peer] = []
    yield opened
    for peer in opened:
        await peer.close()
