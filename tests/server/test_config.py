from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.__main__ import port_problem
from server.config import Config, describe, load_config
from server.errors import ConfigError
from tests.support.pace import within


def test_defaults_are_valid_and_frozen() -> None:
    config = load_config()
    assert config == Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.port = 1  # type: ignore[misc]


def test_precedence_toml_then_env_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[runtime]\nfade_ms = 2\n')
    config = load_config(path, {"AVATAR_SERVER_PORT": "9100"}, {"server.host": "127.0.0.2"})
    assert config.server.port == 9100  # env beats file
    assert config.server.host == "127.0.0.2"  # CLI beats file
    assert config.runtime.fade_ms == 2.0  # int in TOML accepted for a float field
    assert config.runtime.lookahead_budget_ms == 2000  # untouched default


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"AVATAR_SERVER_PORT": "70000"}, "server.port"),
        ({"AVATAR_SERVER_PORT": "eighty"}, "server.port"),
        ({"AVATAR_RUNTIME_LOOKAHEAD_BUDGET_MS": "10"}, "runtime.lookahead_budget_ms"),
        ({"AVATAR_SCHEDULER_POLICY": "fifo"}, "scheduler.policy"),
        ({"AVATAR_SERVER_LOG_LEVEL": "LOUD"}, "server.log_level"),
        ({"AVATAR_RUNTIME_PERSONA": "   "}, "runtime.persona"),
        ({"AVATAR_RUNTIME_NOPE": "1"}, "AVATAR_RUNTIME_NOPE"),
        # every worker would bind the agent's port
        ({"AVATAR_SERVER_AGENT_PORT": "9000", "AVATAR_SERVER_WORKERS": "2"}, "server.agent_port"),
        # the agent and the HTTP server on one port: the second bind would fail
        ({"AVATAR_SERVER_AGENT_PORT": "8080"}, "server.agent_port"),
    ],
)
def test_invalid_values_name_the_setting(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(env=env)


def test_invalid_toml_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nport=1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)
    typed = tmp_path / "typed.toml"
    typed.write_text('[server]\nport = "80"\n')
    with pytest.raises(ConfigError, match=r"server\.port: expected int"):
        load_config(typed)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[gpu]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[gpu\]"):
        load_config(unknown)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_unrelated_environment_is_ignored() -> None:
    assert load_config(env={"HOME": "/root", "PORT": "1"}) == Config()


def test_describe_lists_every_setting_with_env_name() -> None:
    rows = {dotted: env for dotted, env, _, _ in describe()}
    assert rows["server.port"] == "AVATAR_SERVER_PORT"
    assert rows["runtime.lookahead_budget_ms"] == "AVATAR_RUNTIME_LOOKAHEAD_BUDGET_MS"
    config = Config()
    expected = sum(
        len(dataclasses.fields(getattr(config, f.name)))
        for f in dataclasses.fields(config)
        if f.name != "explicit"
    )
    assert len(rows) == expected


def test_admission_and_candidate_settings() -> None:
    transport = load_config().transport
    assert transport.max_sessions_per_client == 0  # automatic: half of max_sessions
    assert transport.ice_connect_timeout_s == 8.0
    assert transport.max_remote_candidates == 32
    assert (transport.patch_rate_per_min, transport.patch_burst) == (60.0, 30)
    assert transport.private_candidates == "auto"
    env = {
        "AVATAR_TRANSPORT_PRIVATE_CANDIDATES": "drop",
        "AVATAR_TRANSPORT_MAX_SESSIONS_PER_CLIENT": "3",
    }
    assert load_config(env=env).transport.private_candidates == "drop"
    for bad in (
        {"AVATAR_TRANSPORT_PRIVATE_CANDIDATES": "sometimes"},
        {"AVATAR_TRANSPORT_MAX_REMOTE_CANDIDATES": "0"},
        {"AVATAR_TRANSPORT_ICE_CONNECT_TIMEOUT_S": "0.1"},
        {"AVATAR_TRANSPORT_PATCH_BURST": "0"},
        {"AVATAR_TRANSPORT_MAX_SESSIONS_PER_CLIENT": "-1"},
    ):
        (name,) = bad
        setting = name.removeprefix("AVATAR_TRANSPORT_").lower()
        with pytest.raises(ConfigError, match=rf"transport\.{setting}"):
            load_config(env=bad)


def test_config_knows_what_the_operator_set(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[transport]\nvideo_fps = 15\n")
    config = load_config(
        path, env={"AVATAR_VAD_END_OF_TURN_MS": "500"}, overrides={"server.port": 9000}
    )
    assert config.explicit == {"transport.video_fps", "vad.end_of_turn_ms", "server.port"}
    assert Config().explicit == frozenset()


def test_cli_rejects_invalid_value_with_its_name() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server", "--set", "runtime.fade_ms=50"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "runtime.fade_ms: must be <= 20.0" in proc.stderr


def test_cli_help_lists_settings() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "server", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    for needle in ("--host", "--port", "--config", "AVATAR_RUNTIME_LOOKAHEAD_BUDGET_MS"):
        assert needle in proc.stdout


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another program listens on, for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def run_server(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "server", "--host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=within(60),
    )
    return proc, time.monotonic() - started


def test_a_port_in_use_is_one_line_before_any_model_loads(held_port: int) -> None:
    proc, took_s = run_server("--port", str(held_port))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: 127.0.0.1:{held_port} is in use; pass --port another port (server.port)\n"
    )
    assert "Traceback" not in proc.stderr and not proc.stdout
    # the models load in tens of seconds: the port is looked at before them
    assert took_s < within(10), f"{took_s:.1f} s"


def test_an_agent_port_in_use_is_one_line_too(held_port: int) -> None:
    proc, _ = run_server("--port", "0", "--set", f"server.agent_port={held_port}")
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: 127.0.0.1:{held_port} is in use; set server.agent_port to another port\n"
    )


def test_a_worker_does_not_look_at_the_public_port(held_port: int) -> None:
    """The supervisor's router holds the public port while it restarts a worker: the worker
    serves on its inherited socket (--listen-fd) and must start all the same."""
    config = load_config(overrides={"server.host": "127.0.0.1", "server.port": held_port})
    assert port_problem(config, listen_fd=None) is not None
    assert port_problem(config, listen_fd=3) is None
    assert port_problem(load_config(overrides={"server.port": 0}), listen_fd=None) is None
