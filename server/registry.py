"""The live sessions of this process: creation within capacity, lookup, closing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

from aiortc import RTCSessionDescription

from server.config import Config
from server.errors import BadRequest, NotFound, ServerFull
from server.metrics import Metrics
from server.peer import PeerSession
from server.pipeline import TurnPipeline
from server.vad import TurnDetector

log = logging.getLogger(__name__)

SESSION_ID_BYTES = 24  # 192 random bits, URL-safe


class SessionRegistry:
    """Owns every PeerSession and every task that closes one."""

    def __init__(
        self,
        config: Config,
        detector_factory: Callable[[], TurnDetector],
        pipeline: TurnPipeline | None,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self._detector_factory = detector_factory
        self._pipeline = pipeline
        self._metrics = metrics
        self.sessions: dict[str, PeerSession] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._accepting = True
        self.finished: deque[dict[str, Any]] = deque(maxlen=256)  # describe() of closed ones

    def __len__(self) -> int:
        return len(self.sessions)

    async def create(self, offer_sdp: str) -> tuple[str, RTCSessionDescription]:
        """A new session for ``offer_sdp``; raises ServerFull or BadRequest, leaving nothing."""
        if not self._accepting or len(self.sessions) >= self.config.transport.max_sessions:
            self._metrics.sessions_rejected.inc()
            retry = str(self.config.transport.retry_after_s)
            raise ServerFull("server is at its session limit", {"Retry-After": retry})
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        peer = PeerSession(
            session_id,
            self.config,
            self._detector_factory(),
            self._pipeline,
            self._metrics,
            self.request_close,
        )
        self.sessions[session_id] = peer  # counts against capacity while we negotiate
        try:
            answer = await peer.answer(offer_sdp)
        except Exception as exc:
            self.sessions.pop(session_id, None)
            await peer.close()
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

    async def close(self, session_id: str) -> None:
        """End one session and free everything it holds; NotFound if unknown."""
        peer = self.sessions.pop(session_id, None)
        if peer is None:
            raise NotFound("no such session")
        await peer.close()
        self.finished.append(peer.describe())
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
        ids = list(self.sessions)
        log.info("closing %d sessions", len(ids))
        await asyncio.gather(*(self._close_quietly(i) for i in ids))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
