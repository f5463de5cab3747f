"""The Kubernetes manifests (deploy/k8s/): every object is valid against Kubernetes' own
schema (kubernetes-validate, strict: an unknown field fails), and they are wired together:
the server's environment is loaded by the real configuration loader, its probes and scrape
annotations point at what it serves, its grace period covers the drain, the Services, the
disruption budget and the autoscaler select its pods, and the server, vLLM and coturn read the
same Secret keys and names. No cluster runs here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from server.config import Config, load_config
from tests.support.server_process import ROOT

K8S = ROOT / "deploy" / "k8s"
KUBERNETES = "1.33.0"  # the oldest release still supported upstream when these were written
SECRETS = {"auth-tokens": "a-token-of-sixteen-chars", "turn-secret": "t", "vllm-api-key": "k"}


def documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def find(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == name]
    return found


def environment(c: dict[str, Any], pod: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it: Secret keys (SECRETS), the pod's
    name, and ``$(VAR)`` references to variables defined before."""
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            assert source["secretKeyRef"]["name"] == "avatar-secrets"
            env[var["name"]] = SECRETS[source["secretKeyRef"]["key"]]
        else:
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            env[var["name"]] = pod
    return env


def server_config(env: dict[str, str]) -> Config:
    """The server's configuration from its container's environment (its AVATAR_ settings)."""
    return load_config(env={k: v for k, v in env.items() if k.startswith("AVATAR_")})


def described(path: Path, doc: dict[str, Any]) -> Any:
    return pytest.param(path, doc, id=f"{path.name}:{doc['kind']}/{doc['metadata']['name']}")


@pytest.mark.parametrize(("path", "doc"), [described(p, d) for p, d in documents()])
def test_every_object_is_valid_kubernetes(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on any error


def test_the_manifests_hold_the_server_vllm_and_coturn() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _, d in documents()}
    assert kinds == {
        ("StatefulSet", "avatar-server"),
        ("Service", "avatar-server"),
        ("Service", "avatar-server-pods"),
        ("PodDisruptionBudget", "avatar-server"),
        ("HorizontalPodAutoscaler", "avatar-server"),
        ("Deployment", "vllm"),
        ("Service", "vllm"),
        ("DaemonSet", "coturn"),
    }


def test_the_server_environment_is_a_valid_configuration_that_drains() -> None:
    server = find("StatefulSet", "avatar-server")
    env = environment(container(server, "server"), "avatar-server-3")
    config = server_config(env)
    # each pod's session ids start with its own name: the proxy's routing key
    assert config.server.session_id_prefix == "avatar-server-3."
    assert server["spec"]["serviceName"] == "avatar-server-pods"
    # SIGTERM drains, within the grace period (plus the preStop's 5 s)
    pod = server["spec"]["template"]["spec"]
    assert config.server.drain_timeout_s > 0
    grace = config.server.drain_timeout_s + config.server.shutdown_timeout_s + 5
    assert pod["terminationGracePeriodSeconds"] >= grace
    # it listens where its probes, its Services and Prometheus look
    port = container(server, "server")["ports"][0]
    assert port["containerPort"] == config.server.port and config.server.host == "0.0.0.0"
    probes = container(server, "server")
    assert probes["readinessProbe"]["httpGet"]["path"] == "/healthz"  # 503 while draining
    assert "httpGet" not in probes["livenessProbe"]  # a draining pod must not be restarted
    annotations = server["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.server.port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_services_budget_and_autoscaler_select_the_server_pods() -> None:
    server = find("StatefulSet", "avatar-server")
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert server["spec"]["selector"]["matchLabels"] == labels
    for name in ("avatar-server", "avatar-server-pods"):
        service = find("Service", name)
        assert service["spec"]["selector"].items() <= labels.items()
        assert service["spec"]["ports"][0]["targetPort"] == "http"
    # session-scoped requests reach a draining pod (not ready) by its name
    assert find("Service", "avatar-server-pods")["spec"]["publishNotReadyAddresses"] is True
    assert find("Service", "avatar-server-pods")["spec"]["clusterIP"] == "None"
    budget = find("PodDisruptionBudget", "avatar-server")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = find("HorizontalPodAutoscaler", "avatar-server")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "avatar-server",
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "avatar_sessions_active"  # server/metrics.py
    env = environment(container(server, "server"), "avatar-server-0")
    config = server_config(env)
    target = float(metric["pods"]["target"]["averageValue"])
    assert 0 < target < config.transport.max_sessions  # scales out before pods are full


def test_the_server_reaches_vllm_and_shares_coturns_secret() -> None:
    server = find("StatefulSet", "avatar-server")
    env = environment(container(server, "server"), "avatar-server-0")
    config = server_config(env)
    vllm = find("Deployment", "vllm")
    args = container(vllm, "vllm")["args"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)
    assert config.pipeline.llm_remote_model == flags["served-model-name"]
    service = find("Service", "vllm")
    assert config.pipeline.llm_remote_urls == (
        f"http://vllm:{service['spec']['ports'][0]['port']}",
    )
    assert container(vllm, "vllm")["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # the server's key for vLLM and vLLM's own come from the same Secret key
    vllm_env = environment(container(vllm, "vllm"), "vllm-0")
    assert vllm_env["VLLM_API_KEY"] == config.pipeline.llm_remote_api_key
    # TURN: coturn and the server read one secret; the server's ICE URL is coturn's port
    coturn = find("DaemonSet", "coturn")
    turn_env = environment(container(coturn, "coturn"), "coturn-x")
    assert turn_env["TURN_SECRET"] == config.transport.ice_auth_secret
    assert config.transport.ice_anonymous_turn == "deny"  # credentials for token holders only
    (url,) = config.transport.ice_urls
    assert url.startswith("turn:") and f":{turn_env['TURN_PORT']}?" in url
    script = container(coturn, "coturn")["args"][0]
    words = shlex.split(script)
    assert "--use-auth-secret" in words and "--static-auth-secret=$TURN_SECRET" in words
    assert coturn["spec"]["template"]["spec"]["hostNetwork"] is True
