"""coturn, run with docker-compose.yml's own command, relays to the public internet and nowhere
else: not into the private networks around the TURN host (a Docker network, the cluster, the
LAN), and not over TCP.

The lab is two network namespaces joined by one link: coturn's (its listening and relay address
is 198.51.100.1 and 2001:db8:1::1, TEST-NET) and the test's, which is both the client and every
peer: a private address of each denied range and a public-looking control address (203.0.113.7,
2001:db8:2::7), each with a UDP socket listening, and a web server on port 8000 (vLLM's) at
10.9.8.7. Credentials are issued as the compose server issues them. A datagram the client asks
coturn to relay arrives at the control; at a private peer coturn refuses the permission
(403 Forbidden IP) and nothing arrives; a TCP allocation (RFC 6062) is refused outright.
"""

from __future__ import annotations

import ipaddress
import os
import select
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from server.config import load_config
from server.rtc.ice import ice_servers
from tests.deploy.test_compose import COMPOSE, OPERATOR_ENV, interpolate
from tests.support.netns import Netns, interfaces, ip, require_isolated
from tests.support.server_process import ROOT, terminate
from tests.support.turn_probe import TCP, TurnClient, TurnError, stun_binding_answers

K8S_COTURN = ROOT / "deploy" / "k8s" / "coturn.yaml"

COTURN = {4: "198.51.100.1", 6: "2001:db8:1::1"}  # coturn's listening and relay address
CLIENT = {4: "198.51.100.2", 6: "2001:db8:1::2"}
PUBLIC = {4: "203.0.113.7", 6: "2001:db8:2::7"}  # the control: no deny rule covers it
# a peer in each range coturn must not relay to; those marked listening have a UDP socket
# in the lab (a datagram relayed there would arrive), the others are coturn's own loopback or
# addresses nothing can listen at (the permission is all there is to refuse)
DENIED: dict[int, dict[str, tuple[str, bool]]] = {
    4: {
        "0.0.0.0/8": ("0.1.2.3", False),
        "10.0.0.0/8": ("10.9.8.7", True),
        "100.64.0.0/10": ("100.64.3.7", True),
        "127.0.0.0/8": ("127.0.0.1", False),
        "169.254.0.0/16": ("169.254.9.7", True),
        "172.16.0.0/12": ("172.16.5.7", True),
        "192.0.0.0/24": ("192.0.0.7", True),
        "192.168.0.0/16": ("192.168.77.7", True),
        "198.18.0.0/15": ("198.18.0.7", True),
        "240.0.0.0/4": ("240.0.0.7", False),
    },
    6: {
        "::/128": ("::", False),  # coturn's own rule: the list cannot name it (see below)
        "::1/128": ("::1", False),
        "::ffff:0:0/96": ("::ffff:10.9.8.7", False),  # the mapped form of a private IPv4
        "64:ff9b::/96": ("64:ff9b::a09:807", False),  # NAT64 to 10.9.8.7
        "64:ff9b:1::/48": ("64:ff9b:1::a09:807", False),  # local-use NAT64
        "fc00::/7": ("fd00::7", True),
        "fe80::/10": ("fe80::7", False),
    },
}
IPV6_ANY = ipaddress.ip_address("::")
BUILT_IN = {"::/128"}  # refused by coturn itself, not by the list
UDP_PORT = 5000  # where every peer listens
WEB = ("10.9.8.7", 8000)  # an internal web server on vLLM's port
WAIT_S = 5.0  # longest wait for a relayed datagram


# --------------------------------------------------------------------------- the flags


def compose_coturn() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"]["coturn"])


def k8s_coturn_script() -> str:
    daemonset = yaml.safe_load(K8S_COTURN.read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return str(container["args"][0])


def turnserver_words(script: str) -> list[str]:
    """The words of the ``exec turnserver ...`` script (its variables left as written)."""
    words = shlex.split(script.replace("$$", "$"))
    assert words[:2] == ["exec", "turnserver"], words[:2]
    return words[2:]


def denied_ranges(words: list[str]) -> list[str]:
    return [w.split("=", 1)[1] for w in words if w.startswith("--denied-peer-ip=")]


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def denied_blocks(ranges: list[str]) -> list[Network]:
    """coturn's ``A-B`` (or single address) ranges as the fewest CIDR blocks that cover them
    exactly: a network wholly denied lies inside one of them."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for text in ranges:
        low, _, high = text.partition("-")
        first, last = ipaddress.ip_address(low), ipaddress.ip_address(high or low)
        for network in ipaddress.summarize_address_range(first, last):
            if isinstance(network, ipaddress.IPv4Network):
                v4.append(network)
            else:
                v6.append(network)
    return [*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)]


def inside(network: Network, block: Network) -> bool:
    return network.version == block.version and (
        int(block.network_address) <= int(network.network_address)
        and int(network.broadcast_address) <= int(block.broadcast_address)
    )


def test_compose_and_kubernetes_deny_the_same_peers() -> None:
    compose = turnserver_words(compose_coturn()["command"][0])
    k8s = turnserver_words(k8s_coturn_script())
    assert denied_ranges(compose) == denied_ranges(k8s)
    for words in (compose, k8s):
        assert "--no-tcp-relay" in words and "--no-multicast-peers" in words
        assert "--allow-loopback-peers" not in words and "--allowed-peer-ip" not in " ".join(words)


def test_the_deny_list_covers_every_private_range() -> None:
    ranges = denied_ranges(turnserver_words(compose_coturn()["command"][0]))
    # coturn 4.6 reads a range from "::" as open below, and an IPv4 peer as below any IPv6
    # address: "::-::1" would deny every IPv4 peer (the relay test saw it); :: itself coturn
    # refuses on its own (unspecified addresses are loopback to it)
    assert not [r for r in ranges if ipaddress.ip_address(r.partition("-")[0]) == IPV6_ANY]
    blocks = denied_blocks(ranges)
    for family in (4, 6):
        for text in DENIED[family]:
            if text in BUILT_IN:
                continue
            network = ipaddress.ip_network(text)
            assert any(inside(network, block) for block in blocks), f"{text} is not denied whole"
        public = ipaddress.ip_network(PUBLIC[family])
        assert not any(inside(public, block) for block in blocks), PUBLIC[family]


# --------------------------------------------------------------------------- the lab


class Lab:
    """coturn's namespace and the test's, one link between them; every peer listens here."""

    LINK = "trlab"

    def __init__(self) -> None:
        self.ns: Netns | None = None
        self.sockets: dict[str, socket.socket] = {}
        self.web: socket.socket | None = None
        self.stop = threading.Event()
        self.web_hits: list[str] = []

    def start(self) -> Lab:
        require_isolated()
        self.ns = Netns("coturn")
        ip("link", "add", self.LINK, "type", "veth", "peer", "name", "trcot")
        self.ns.attach("trcot", f"{COTURN[4]}/24")
        self.ns.ip("-6", "addr", "add", f"{COTURN[6]}/64", "dev", "eth0", "nodad")
        ip("addr", "add", f"{CLIENT[4]}/24", "dev", self.LINK)
        ip("-6", "addr", "add", f"{CLIENT[6]}/64", "dev", self.LINK, "nodad")
        for family in (4, 6):
            v6, nodad = (["-6"], ["nodad"]) if family == 6 else ([], [])
            bits = 128 if family == 6 else 32
            listening = [a for a, listens in DENIED[family].values() if listens]
            for address in (*listening, PUBLIC[family]):
                ip(*v6, "addr", "add", f"{address}/{bits}", "dev", self.LINK, *nodad)
                self.ns.ip(*v6, "route", "add", f"{address}/{bits}", "dev", "eth0")
        ip("link", "set", self.LINK, "up")
        for family in (4, 6):
            listening = [a for a, listens in DENIED[family].values() if listens]
            for address in (*listening, PUBLIC[family]):
                sock = socket.socket(
                    socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM
                )
                sock.bind((address, UDP_PORT))
                sock.setblocking(False)
                self.sockets[address] = sock
        self.web = socket.create_server(WEB)
        self.web.settimeout(0.2)
        threading.Thread(target=self._serve_web, daemon=True).start()
        return self

    def _serve_web(self) -> None:
        """An internal web server: whoever connects gets ``HTTP/1.0 200 OK``."""
        assert self.web is not None
        while not self.stop.is_set():
            try:
                conn, peer = self.web.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nmetrics\n")
                except OSError:
                    pass
            self.web_hits.append(peer[0])

    def arrivals(self, expect: str, timeout: float = WAIT_S) -> dict[str, list[bytes]]:
        """The datagrams each peer got, until ``expect`` got one (then 0.5 s more, for any
        other that coturn relayed) or ``timeout`` s."""
        got: dict[str, list[bytes]] = {}
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            ready, _, _ = select.select(list(self.sockets.values()), [], [], left)
            for sock in ready:
                data = sock.recv(65536)
                got.setdefault(sock.getsockname()[0], []).append(data)
            if expect in got:
                deadline = min(deadline, time.monotonic() + 0.5)

    def close(self) -> None:
        self.stop.set()
        for sock in self.sockets.values():
            sock.close()
        if self.web is not None:
            self.web.close()
        if self.LINK in interfaces():
            ip("link", "del", self.LINK)  # both ends: the test's namespace has lo alone again
        if self.ns is not None:
            self.ns.close()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if shutil.which("turnserver") is None:
        pytest.skip("turnserver (coturn) is not installed: apt-get install coturn")
    built = Lab()
    try:
        yield built.start()
    finally:
        built.close()


def server_environment() -> dict[str, str]:
    compose = interpolate(yaml.safe_load(COMPOSE.read_text()), OPERATOR_ENV)
    return {k: str(v) for k, v in compose["services"]["server"]["environment"].items()}


def issued_credential() -> tuple[str, str]:
    """A TURN credential for a client, as the compose server issues it (GET /ice-servers)."""
    transport = load_config(env=server_environment()).transport
    (server,) = [s for s in ice_servers(transport, time.time(), "client") if s.turn]
    assert server.username is not None and server.credential is not None
    return server.username, server.credential


@contextmanager
def coturn_as_composed(
    lab: Lab, family: int, tmp: Path, **operator: str
) -> Iterator[tuple[str, int]]:
    """docker-compose.yml's coturn (its entrypoint, command and environment, the operator's
    .env values and ``operator``'s) in coturn's namespace, listening and relaying on its lab
    address."""
    assert lab.ns is not None
    listening = {"TURN_LISTENING_IP": COTURN[family], "TURN_RELAY_IP": COTURN[family]}
    service = interpolate(compose_coturn(), {**OPERATOR_ENV, **listening, **operator})
    env = {**{k: str(v) for k, v in service["environment"].items()}, "PATH": os.environ["PATH"]}
    port = int(env["TURN_PORT"])
    log = tmp / f"coturn-{family}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*lab.ns.wrapper, *service["entrypoint"], *service["command"]],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 15
        while not stun_binding_answers(COTURN[family], port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"coturn did not answer STUN:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        yield COTURN[family], port
    finally:
        terminate(proc, 10)


# --------------------------------------------------------------------------- relaying


@pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])
def test_udp_relay_reaches_a_public_peer_and_no_private_one(
    lab: Lab, family: int, tmp_path: Path
) -> None:
    username, credential = issued_credential()
    public = PUBLIC[family]
    denied = {address: network for network, (address, _) in DENIED[family].items()}
    with (
        coturn_as_composed(lab, family, tmp_path) as server,
        TurnClient(server, username, credential, family=family) as client,
    ):
        relayed, _ = client.allocate()
        assert relayed == COTURN[family]
        refused: dict[str, int] = {}
        for peer in (*denied, public):
            try:
                client.create_permission(peer)
            except TurnError as exc:
                refused[peer] = exc.code
        # the peers that listen first: a send that fails (no route) may end the allocation
        listening = [address for address, listens in DENIED[family].values() if listens]
        for peer in dict.fromkeys((public, *listening, *denied)):
            if peer not in refused:
                client.send((peer, UDP_PORT), f"relayed to {peer}".encode())
        arrived = lab.arrivals(expect=public)
    # the relay works: the control peer got the datagram, and only it
    assert arrived == {public: [f"relayed to {public}".encode()]}, (
        f"relayed into private networks: {sorted(set(arrived) - {public})}"
    )
    # and the deny list is what stopped the others: each permission refused, 403 Forbidden IP
    assert refused == dict.fromkeys(denied, 403), {
        f"{peer} ({denied[peer]})": refused.get(peer, "permitted") for peer in denied
    }


def fetch_through_tcp_relay(
    server: tuple[str, int], username: str, password: str, peer: tuple[str, int]
) -> str:
    """An HTTP request to ``peer`` through a TCP allocation (RFC 6062): the response's first
    line, or the TURN server's refusal."""
    with TurnClient(server, username, password, transport=TCP) as client:
        try:
            client.allocate()
            connection_id = client.connect(peer)
            with client.bind_data_connection(connection_id) as data:
                data.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                return data.recv(4096).split(b"\r\n")[0].decode(errors="replace")
        except TurnError as exc:
            return f"refused: {exc}"


def test_tcp_relay_is_refused(lab: Lab, tmp_path: Path) -> None:
    username, credential = issued_credential()
    with coturn_as_composed(lab, 4, tmp_path) as server:
        outcome = fetch_through_tcp_relay(server, username, credential, WEB)
    assert outcome.startswith("refused: ALLOCATE: 442"), f"TCP relay to {WEB}: {outcome}"
    assert lab.web_hits == []


def test_relaying_between_two_allocations_behind_nat_still_works(lab: Lab, tmp_path: Path) -> None:
    """On a cloud VM coturn relays from a private address behind 1:1 NAT (TURN_EXTERNAL_IP
    public/private, as deploy/.env.example says). A client and the server, each on a relayed
    candidate, then send to the other's public relayed address: coturn maps it to its private
    one, past the deny list."""
    assert lab.ns is not None
    private, public = "10.20.0.1", "203.0.113.50"
    lab.ns.ip("addr", "add", f"{private}/24", "dev", "eth0")
    username, credential = issued_credential()
    nat = {"TURN_RELAY_IP": private, "TURN_EXTERNAL_IP": f"{public}/{private}"}
    with (
        coturn_as_composed(lab, 4, tmp_path, **nat) as server,
        TurnClient(server, username, credential) as client,
        TurnClient(server, username, credential) as avatar,
    ):
        to_client, to_avatar = client.allocate(), avatar.allocate()
        assert to_client[0] == to_avatar[0] == public
        client.create_permission(public)
        avatar.create_permission(public)
        client.send(to_avatar, b"relay to relay")
        got = avatar.receive_data()
    assert got == (to_client, b"relay to relay")
