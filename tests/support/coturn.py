"""Start coturn (Debian's ``turnserver``) on loopback as a subprocess, for TURN relay tests.

Long-term credentials (one static user, or with ``auth_secret`` the TURN REST API's issued
ones), UDP only (no TLS/DTLS listeners), relay ports in a small range, loopback peers allowed
(by default coturn refuses to relay to 127.x), no CLI.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.server_process import free_port, terminate

STUN_BINDING_REQUEST = bytes.fromhex("0001 0000 2112a442") + os.urandom(12)


def stun_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a STUN Binding request to ``host:port`` (UDP) gets a success response."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(STUN_BINDING_REQUEST, (host, port))
            data = sock.recv(2048)
        except OSError:
            return False
    return data[:2] == b"\x01\x01"  # Binding Success Response


class Coturn:
    """``turnserver`` on ``host`` with user ``username``/``password`` and realm ``realm``, or
    (``auth_secret``) accepting any credential issued with that shared secret.

    ``also_listening``: more addresses it listens on; ``relay_ip``: the address its relayed
    candidates get (``host`` if None); ``wrapper``: a command to run it under (``nsenter`` into
    a network namespace); ``port``: its listening port (a free one on loopback if None)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        username: str = "avatar",
        password: str = "relay-secret",
        realm: str = "test",
        relay_ports: tuple[int, int] = (49160, 49200),
        auth_secret: str | None = None,
        also_listening: tuple[str, ...] = (),
        relay_ip: str | None = None,
        wrapper: tuple[str, ...] = (),
        port: int | None = None,
    ) -> None:
        self.host = host
        self.also_listening = also_listening
        self.relay_ip = relay_ip or host
        self.wrapper = wrapper
        self.port = port or free_port()
        self.username = username
        self.password = password
        self.realm = realm
        self.relay_ports = relay_ports
        self.auth_secret = auth_secret
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"coturn-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"turn:{self.host}:{self.port}?transport=udp"

    def command(self) -> list[str]:
        binary = shutil.which("turnserver")
        if binary is None:
            raise RuntimeError("turnserver not found (apt-get install coturn)")
        low, high = self.relay_ports
        listening = [arg for ip in (self.host, *self.also_listening) for arg in ("-L", ip)]
        return [
            *self.wrapper,
            binary,
            "-n",  # no configuration file
            *listening,
            "--relay-ip", self.relay_ip,
            "--listening-port", str(self.port),
            "--min-port", str(low),
            "--max-port", str(high),
            *(
                ["--use-auth-secret", "--static-auth-secret", self.auth_secret]
                if self.auth_secret
                else ["--lt-cred-mech", "--user", f"{self.username}:{self.password}"]
            ),
            "--realm", self.realm,
            "--fingerprint",
            "--no-tls",
            "--no-dtls",
            "--no-cli",
            "--allow-loopback-peers",
            "--no-software-attribute",
            "--log-file", str(self.log_path),
            "--simple-log",
            "--no-stdout-log",
            "--verbose",
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> Coturn:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"turnserver exited with {self.proc.returncode}:\n{self.log()}")
            if stun_answers(self.host, self.port):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"turnserver did not answer STUN within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process this object started, then SIGKILL if it lingers."""
        if self.proc is not None:
            terminate(self.proc, timeout)
