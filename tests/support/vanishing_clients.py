"""Clients that vanish without a goodbye, for soak and reaper tests.

    python -m tests.support.vanishing_clients URL COUNT [--video-every N]

connects COUNT aiortc peers to the server at URL at once (host candidates pinned to 127.0.0.1),
waits until each has its events channel open and has heard the server's audio, prints one
``connected <session id>`` line per peer, then ``ready``, and then waits to be killed. Killed with
SIGKILL, its sockets simply disappear: no WHIP DELETE, no DTLS close, no SCTP abort, no more
ICE consent answers. The server sees nothing but silence on the wire.

``VanishingClients.launch`` starts such a subprocess and waits for its ``ready``; ``kill``
makes its peers vanish.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

from client.cli import ClientPeer
from server.rtc.settings import pin_host_addresses
from tests.support.peers import Peer
from tests.support.server_process import ROOT

HEARD_TIMEOUT_S = 15.0


class VanishingClients:
    """A subprocess holding ``count`` connected peers until it is killed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.session_ids: list[str] = []

    @classmethod
    async def launch(
        cls, url: str, count: int, video_every: int, ready_timeout_s: float
    ) -> VanishingClients:
        """A subprocess with ``count`` peers connected to the server at ``url`` (every
        ``video_every``-th takes video; 0: none), once it says ``ready`` (killed and
        TimeoutError after ``ready_timeout_s``)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.vanishing_clients",
            url,
            str(count),
            "--video-every",
            str(video_every),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        clients = cls(proc)
        try:
            await asyncio.wait_for(clients._ready(), ready_timeout_s)
        except BaseException:
            await clients.kill()
            raise
        return clients

    async def _ready(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = (await self.proc.stdout.readline()).decode().strip()
            if not line:
                raise RuntimeError(f"vanishing clients exited ({self.proc.returncode})")
            if line == "ready":
                return
            kind, _, session_id = line.partition(" ")
            if kind == "connected":
                self.session_ids.append(session_id)

    async def kill(self) -> None:
        """SIGKILL: the peers vanish without a word."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


async def heard(peer: ClientPeer) -> None:
    """Until the peer has received at least one audio frame from the server."""
    deadline = time.monotonic() + HEARD_TIMEOUT_S
    while not peer.audio:
        if time.monotonic() > deadline:
            raise TimeoutError("no audio from the server")
        await asyncio.sleep(0.02)


async def connect_one(url: str, video: bool) -> ClientPeer:
    peer = Peer(url, video=video)
    await peer.connect()
    await heard(peer)
    print(f"connected {peer.session_id}", flush=True)
    return peer


async def run(url: str, count: int, video_every: int) -> None:
    peers = await asyncio.gather(
        *(connect_one(url, video_every > 0 and i % video_every == 0) for i in range(count))
    )
    print("ready", flush=True)
    await asyncio.Event().wait()  # keep every peer referenced until killed
    del peers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("count", type=int)
    parser.add_argument("--video-every", type=int, default=0, help="every Nth peer takes video")
    args = parser.parse_args()
    pin_host_addresses(["127.0.0.1"])
    asyncio.run(run(args.url, args.count, args.video_every))
    return 0


if __name__ == "__main__":
    sys.exit(main())
