"""The live sessions of this process: creation within capacity (the server's, and each
client's share of it), lookup, closing."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription

from server.avatar.seam import AvatarRenderer
from server.config import Config
from server.errors import BadRequest, NotFound, ServerFull, TooManyRequests
from server.http.auth import is_loopback
from server.http.whip import CandidateBudget
from server.metrics import Metrics
from server.owner import NO_OWNER
from server.pipeline.seams import TurnPipeline
from server.pipeline.turn_detector import TurnDetector
from server.procstats import trim_heap
from server.rtc.peer import PeerSession, PeerState
from server.vision.sampling import VisionModel

log = logging.getLogger(__name__)

SESSION_ID_BYTES = 24  # 192 random bits, URL-safe
REAP_INTERVAL_S = 1.0  # longest pause between two dead-peer checks


class TooManySessions(TooManyRequests):
    """The client (address or token) already holds its share of the sessions."""

    code = "too_many_sessions"


@dataclass(frozen=True)
class Admission:
    """What a session was admitted as: its client's key (server/http/ratelimit.py ``client_key``;
    '' when unknown) and its remote ICE candidates so far."""

    client: str
    candidates: CandidateBudget


def receives_audio(pc: RTCPeerConnection) -> bool:
    """Whether the peer sends us audio (its liveness signal for the reaper)."""
    return any(
        t.kind == "audio" and t.currentDirection in ("sendrecv", "recvonly")
        for t in pc.getTransceivers()
    )


class SessionRegistry:
    """Owns every PeerSession and every task that closes one."""

    def __init__(
        self,
        config: Config,
        detector_factory: Callable[[], TurnDetector],
        pipeline: TurnPipeline | None,
        metrics: Metrics,
        renderer: AvatarRenderer | None = None,
        vision: VisionModel | None = None,
    ) -> None:
        self.config = config
        self._detector_factory = detector_factory
        self._pipeline = pipeline
        self._metrics = metrics
        self._renderer = renderer
        self._vision = vision
        self.sessions: dict[str, PeerSession] = {}
        self._admitted: dict[str, Admission] = {}  # by session id, as long as it is in sessions
        self._closing: set[asyncio.Task[None]] = set()
        self._accepting = True
        self.finished: deque[tuple[str, dict[str, Any]]] = deque(maxlen=256)  # (owner, describe())
        self._reaper: asyncio.Task[None] | None = None
        self._peer_objects: weakref.WeakSet[PeerSession] = weakref.WeakSet()
        self.closed_total = 0
        self.reaped_total = 0

    def __len__(self) -> int:
        return len(self.sessions)

    def client_limit(self) -> int:
        """Live sessions one client may hold (``transport.max_sessions_per_client``; 0: half of
        ``max_sessions``, at least 1)."""
        transport = self.config.transport
        return transport.max_sessions_per_client or max(1, transport.max_sessions // 2)

    def _check_client(self, client: str, owner: str) -> None:
        """TooManySessions when ``client`` (an address key) or ``owner`` (a token digest)
        already holds its share. The automatic limit leaves loopback clients alone: on this
        machine, or behind a proxy not in ``server.trusted_proxies``, every client is one.
        Tokens count when there are several (with one, every client shares it)."""
        transport = self.config.transport
        limit = self.client_limit()
        by_address = bool(client) and (
            transport.max_sessions_per_client > 0 or not is_loopback(client)
        )
        if by_address and sum(a.client == client for a in self._admitted.values()) >= limit:
            raise TooManySessions(
                f"this client address already has {limit} live sessions (its share of the "
                "server); end one first",
                transport.retry_after_s,
            )
        by_token = owner != NO_OWNER and len(self.config.server.auth_tokens) > 1
        if by_token and sum(p.owner == owner for p in self.sessions.values()) >= limit:
            raise TooManySessions(
                f"this token already has {limit} live sessions (its share of the server); "
                "end one first",
                transport.retry_after_s,
            )

    async def create(
        self,
        offer_sdp: str,
        owner: str = NO_OWNER,
        client: str = "",
        candidates: CandidateBudget | None = None,
    ) -> tuple[str, RTCSessionDescription]:
        """A new session for ``offer_sdp``, owned by ``owner`` (the digest of the token that
        created it), for ``client`` (its address key), with the offer's remote ``candidates``
        counted; raises ServerFull, TooManySessions or BadRequest, leaving nothing."""
        if self._accepting:
            self._check_client(client, owner)  # its own share first: waiting will not help it
        if not self._accepting or len(self.sessions) >= self.config.transport.max_sessions:
            self._metrics.sessions_rejected.inc()
            raise ServerFull("server is at its session limit", self.config.transport.retry_after_s)
        if candidates is None:
            candidates = CandidateBudget(self.config.transport.max_remote_candidates)
        session_id = self.config.server.session_id_prefix + secrets.token_urlsafe(SESSION_ID_BYTES)
        peer = PeerSession(
            session_id,
            self.config,
            self._detector_factory(),
            self._pipeline,
            self._metrics,
            self.request_close,
            self._renderer,
            self._vision,
            owner,
        )
        self.sessions[session_id] = peer  # counts against capacity while we negotiate
        self._admitted[session_id] = Admission(client, candidates)
        self._peer_objects.add(peer)
        try:
            answer = await peer.answer(offer_sdp)
        except Exception as exc:
            self.sessions.pop(session_id, None)
            self._admitted.pop(session_id, None)
            try:
                await peer.close()
            except Exception:  # aiortc cannot always close after a refused offer
                log.warning("session %s: close after a refused offer failed", session_id[:8])
            raise BadRequest(f"cannot use this SDP offer: {exc}") from exc
        self._metrics.sessions_total.inc()
        self._metrics.sessions_active.set(len(self.sessions))
        log.info("session %s created (%d active)", session_id[:8], len(self.sessions))
        return session_id, answer

    def get(self, session_id: str) -> PeerSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFound("no such session") from None

    def candidates(self, session_id: str) -> CandidateBudget:
        """The remote ICE candidates the session has been given so far; NotFound if unknown."""
        try:
            return self._admitted[session_id].candidates
        except KeyError:
            raise NotFound("no such session") from None

    async def close(self, session_id: str) -> None:
        """End one session and free everything it holds; NotFound if unknown."""
        peer = self.sessions.pop(session_id, None)
        self._admitted.pop(session_id, None)
        if peer is None:
            raise NotFound("no such session")
        await peer.close()
        self.closed_total += 1
        self.finished.append((peer.owner, peer.describe()))
        self._metrics.sessions_active.set(len(self.sessions))
        log.info("session %s closed (%d active)", session_id[:8], len(self.sessions))

    def request_close(self, session_id: str) -> None:
        """Close from a callback (peer gone, watchdog); the task is owned here."""
        if session_id not in self.sessions:
            return
        task = asyncio.get_running_loop().create_task(self._close_quietly(session_id))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, session_id: str) -> None:
        with contextlib.suppress(NotFound):
            await self.close(session_id)

    async def close_all(self) -> None:
        """Graceful shutdown: refuse new sessions, close every peer, await every close task."""
        self._accepting = False
        await self.stop_reaper()
        ids = list(self.sessions)
        log.info("closing %d sessions", len(ids))
        await asyncio.gather(*(self._close_quietly(i) for i in ids))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # --- the dead-peer reaper -------------------------------------------------------------
    def start_reaper(self) -> None:
        """Start the task that closes peers gone silent; the app starts it once at start-up."""
        if self._reaper is None:
            loop = asyncio.get_running_loop()
            self._reaper = loop.create_task(self._reap_loop(), name="dead-peer-reaper")

    async def stop_reaper(self) -> None:
        """Stop the reaper and wait until it has ended; idempotent."""
        task, self._reaper = self._reaper, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def dead_peers(self) -> list[str]:
        """Connected sessions whose inbound audio stopped ``transport.dead_peer_timeout_s`` ago.

        aiortc notices a vanished client only after ~30 s of failed consent checks; inbound
        audio flows every 20 ms (silence too), so its absence is the quicker sign. Peers that
        send no audio at all are left to ICE consent and the connect watchdog.
        """
        timeout_ms = self.config.transport.dead_peer_timeout_s * 1000
        dead: list[str] = []
        for session_id, peer in self.sessions.items():
            if peer.state is not PeerState.CONNECTED or not receives_audio(peer.pc):
                continue
            if peer.clock.now_ms() - peer.last_media_ms > timeout_ms:
                dead.append(session_id)
        return dead

    async def _reap_loop(self) -> None:
        interval = min(REAP_INTERVAL_S, self.config.transport.dead_peer_timeout_s / 4)
        trimmed_at = self.closed_total
        while True:
            await asyncio.sleep(interval)
            dead = self.dead_peers()
            for session_id in dead:
                log.warning(
                    "session %s: no audio for %.1f s, closing (peer gone)",
                    session_id[:8],
                    self.config.transport.dead_peer_timeout_s,
                )
            results = await asyncio.gather(
                *(self._close_quietly(i) for i in dead), return_exceptions=True
            )
            for session_id, result in zip(dead, results, strict=True):
                if isinstance(result, Exception):
                    log.error("session %s: close failed", session_id[:8], exc_info=result)
            self.reaped_total += len(dead)
            if self.closed_total != trimmed_at:  # return closed sessions' memory to the OS
                trimmed_at = self.closed_total
                await asyncio.to_thread(trim_heap)

    def live_peer_objects(self) -> int:
        """PeerSession objects still in memory (after a collection): a leak check."""
        gc.collect()
        return len(self._peer_objects)
