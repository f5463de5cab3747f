"""Network namespaces made by a test: each is held by a ``sleep`` process the test started (and
ends by its PID), joined with ``nsenter``, and wired to the others with veth pairs and a bridge.

Every link lives inside the test's own namespace (scripts/test.sh runs pytest under ``unshare
--net`` with only ``lo`` up), so nothing the test builds touches the machine's real network;
``require_isolated`` refuses to build anything elsewhere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

HELD_S = 3600  # a namespace's holder sleeps at most this long (s), should the test leak it


def require_isolated() -> None:
    """Fail unless this process is in a network namespace with no interface but ``lo``: the
    bridge and links a test builds must not land on the machine's real network."""
    others = sorted(set(interfaces()) - {"lo"})
    if others:
        raise RuntimeError(
            f"needs a network namespace with only lo (scripts/test.sh runs pytest in one); "
            f"this one has {', '.join(others)}"
        )


def interfaces() -> list[str]:
    """The interfaces of this process's network namespace (/sys/class/net shows the one sysfs
    was mounted in, not necessarily ours)."""
    return [name for _, name in socket.if_nameindex()]


def ip(*args: str, wrapper: tuple[str, ...] = ()) -> None:
    """Run ``ip ARGS`` (in another namespace under ``wrapper``); its error is the exception."""
    done = subprocess.run([*wrapper, "ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Netns:
    """A new network namespace named ``name`` (for messages), held by a sleeping process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(["unshare", "--net", "sleep", str(HELD_S)])
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while not self._entered(ours):  # unshare switches namespace, then execs sleep
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"netns {name}: unshare --net did not start")
            time.sleep(0.01)
        self.ip("link", "set", "lo", "up")

    def _entered(self, ours: str) -> bool:
        try:
            comm = Path(f"/proc/{self.proc.pid}/comm").read_text().strip()
            return comm == "sleep" and os.readlink(f"/proc/{self.proc.pid}/ns/net") != ours
        except OSError:
            return False

    @property
    def wrapper(self) -> tuple[str, ...]:
        """A command prefix that runs a program inside this namespace."""
        return ("nsenter", f"--net=/proc/{self.proc.pid}/ns/net", "--")

    def ip(self, *args: str) -> None:
        ip(*args, wrapper=self.wrapper)

    def attach(self, device: str, address: str, rename: str = "eth0") -> None:
        """Move ``device`` (one end of a veth pair, in the test's namespace) into this one as
        ``rename`` with ``address`` (CIDR), up."""
        ip("link", "set", device, "netns", str(self.proc.pid))
        self.ip("link", "set", device, "name", rename)
        self.ip("addr", "add", address, "dev", rename)
        self.ip("link", "set", rename, "up")

    def close(self) -> None:
        """End the holder (its links go with the namespace)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def bridge(name: str, address: str | None = None) -> None:
    """A bridge ``name`` in the test's namespace, up, with ``address`` (CIDR) if given."""
    ip("link", "add", name, "type", "bridge")
    if address:
        ip("addr", "add", address, "dev", name)
    ip("link", "set", name, "up")


def plug(ns: Netns, bridge_name: str, address: str, link: str) -> None:
    """``ns`` on the bridge with ``address`` (CIDR) through a veth pair ``link``b/``link``n."""
    ip("link", "add", f"{link}b", "type", "veth", "peer", "name", f"{link}n")
    ip("link", "set", f"{link}b", "master", bridge_name)
    ip("link", "set", f"{link}b", "up")
    ns.attach(f"{link}n", address)


def cable(a: Netns, a_address: str, b: Netns, b_address: str, link: str) -> None:
    """A veth pair straight from ``a`` (as ``link``) to ``b`` (as ``link``), with addresses."""
    ip("link", "add", f"{link}a", "type", "veth", "peer", "name", f"{link}z")
    a.attach(f"{link}a", a_address, rename=link)
    b.attach(f"{link}z", b_address, rename=link)
