"""The sessions of this process: creation within capacity (the server's, and each client's
share of it), lookup, resume after a lost connection, closing.

A session is a :class:`Conversation` and the peer connection that carries it. When the
connection is lost (it fails, or its audio stops) the conversation waits
``session.resume_window_s`` for its client to come back with its resume token; a new peer
then carries it on. Capacity counts live work: a conversation that a peer carries is live, one
waiting for a resume uses no media or model time and is counted apart, within a bound of its
own (server/http/detached.py: the oldest ends first). A full server lets go of a connected
peer whose audio stopped ``transport.stale_peer_s`` ago (a client that left without a word)
before it refuses a new session; a resume is live work too and is refused while full."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from aiortc import RTCPeerConnection, RTCSessionDescription

from server.avatar.seam import AvatarRenderer
from server.clock import Clock
from server.config import Config
from server.conversation.conversation import Conversation
from server.conversation.resume import Resumed, Resumption, split_token
from server.errors import (
    BadRequest,
    Draining,
    NotFound,
    ResumeExpired,
    ResumeRefused,
    ServerFull,
)
from server.http.auth import check_owner, is_loopback
from server.http.detached import DetachedBound, Waiting, evictions
from server.http.shares import check_share, client_limit
from server.http.whip import CandidateBudget
from server.metrics import Metrics
from server.owner import NO_OWNER
from server.pipeline.seams import TurnPipeline
from server.pipeline.turn_detector import TurnDetector
from server.procstats import trim_heap
from server.rtc.peer import Gone, PeerSession, PeerState
from server.tasks import cancel
from server.vision.sampling import VisionModel

log = logging.getLogger(__name__)

SESSION_ID_BYTES = 24  # 192 random bits, URL-safe
REAP_INTERVAL_S = 1.0  # longest pause between two dead-peer checks
MAX_ENDED = 4096  # ids of ended sessions remembered, to answer a late resume with 410


@dataclass(frozen=True)
class Admission:
    """What a session was admitted as: its client's key (server/http/ratelimit.py ``client_key``;
    '' when unknown) and its remote ICE candidates so far."""

    client: str
    candidates: CandidateBudget


class Carrier(Protocol):
    """A connection other than a peer that carries a conversation (the WebSocket of
    ``GET /v1/realtime``): attached when made; ``close`` stops it, idempotent."""

    async def close(self) -> None: ...


def receives_audio(pc: RTCPeerConnection) -> bool:
    """Whether the peer sends us audio (its liveness signal for the reaper)."""
    return any(
        t.kind == "audio" and t.currentDirection in ("sendrecv", "recvonly")
        for t in pc.getTransceivers()
    )


class SessionRegistry:
    """Owns every Conversation and PeerSession, and every task that closes one."""

    def __init__(
        self,
        config: Config,
        detector_factory: Callable[[], TurnDetector],
        pipeline: TurnPipeline | None,
        metrics: Metrics,
        renderer: AvatarRenderer | None = None,
        vision: VisionModel | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: the conversations' time (turn deadlines, resume windows)."""
        self.config = config
        self._clock = clock
        self._detector_factory = detector_factory
        self._pipeline = pipeline
        self._metrics = metrics
        self._renderer = renderer
        self._vision = vision
        self.conversations: dict[str, Conversation] = {}
        self.peers: dict[str, PeerSession] = {}  # the peer carrying each conversation, if any
        self.carriers: dict[str, Carrier] = {}  # or the other connection carrying it
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._admitted: dict[str, Admission] = {}  # by session id, as long as it is in sessions
        self._closing: set[asyncio.Task[None]] = set()
        # one at a time per session: a resume and a hang-up (or two resumes) never interleave
        self._turns: dict[str, asyncio.Lock] = {}
        self._accepting = True
        self.draining = False  # new sessions refused while the live ones finish
        self.finished: deque[tuple[str, dict[str, Any]]] = deque(maxlen=256)  # (owner, describe())
        self._reaper: asyncio.Task[None] | None = None
        self._peer_objects: weakref.WeakSet[PeerSession] = weakref.WeakSet()
        self.closed_total = 0
        self.reaped_total = 0

    def __len__(self) -> int:
        """Every conversation: live and detached."""
        return len(self.conversations)

    @property
    def live(self) -> int:
        """Conversations a peer (or a carrier) carries or connects: what counts against
        capacity."""
        return len(self.peers) + len(self.carriers)

    @property
    def detached(self) -> int:
        """Conversations waiting for a resume, with no peer."""
        return len(self.conversations) - self.live

    def _carried(self, session_id: str) -> bool:
        return session_id in self.peers or session_id in self.carriers

    def _report(self) -> None:
        self._metrics.sessions_active.set(self.live)
        self._metrics.sessions_detached.set(self.detached)

    def client_limit(self) -> int:
        return client_limit(self.config.transport)

    def _check_client(self, client: str, owner: str) -> None:
        owners = [c.owner for c in self.conversations.values()]
        clients = [a.client for a in self._admitted.values()]
        check_share(self.config, clients, owners, client, owner)

    async def create(
        self,
        offer_sdp: str,
        owner: str = NO_OWNER,
        client: str = "",
        candidates: CandidateBudget | None = None,
        prepare: Callable[[Conversation], None] | None = None,
    ) -> tuple[str, RTCSessionDescription]:
        """A new session for ``offer_sdp``, owned by ``owner`` (the digest of the token that
        created it), for ``client`` (its address key), with the offer's remote ``candidates``
        counted; ``prepare`` sets the conversation up before its peer exists (a validated
        session configuration). Raises ServerFull, TooManySessions or BadRequest, leaving
        nothing."""
        await self._room_for(client, owner)
        if candidates is None:
            candidates = CandidateBudget(self.config.transport.max_remote_candidates)
        conversation = self._conversation(owner)
        session_id = conversation.session_id
        if prepare is not None:
            prepare(conversation)
        self.conversations[session_id] = conversation  # counts while we negotiate
        self._admitted[session_id] = Admission(client, candidates)
        try:
            answer = await self._connect(conversation, offer_sdp, resumed=None)
        except BadRequest:
            self.conversations.pop(session_id, None)
            self._admitted.pop(session_id, None)
            await conversation.close()
            raise
        conversation.start()
        self._metrics.sessions_total.inc()
        self._report()
        log.info("session %s created (%d live, %d detached)", session_id[:8], *self._counts())
        return session_id, answer

    async def carry(
        self,
        make: Callable[[Conversation], Carrier],
        owner: str = NO_OWNER,
        client: str = "",
        prepare: Callable[[Conversation], None] | None = None,
    ) -> Conversation:
        """A new conversation carried by what ``make`` builds for it (attached to it), within
        capacity and the client's share as :meth:`create`; Draining, ServerFull or
        TooManySessions leave nothing. ``prepare`` sets the conversation up before its
        carrier exists (a client secret's session). The carrier is closed with the
        conversation."""
        await self._room_for(client, owner)
        conversation = self._conversation(owner)
        if prepare is not None:
            prepare(conversation)
        session_id = conversation.session_id
        self.conversations[session_id] = conversation
        self._admitted[session_id] = Admission(client, CandidateBudget(0))
        self.carriers[session_id] = make(conversation)
        conversation.start()
        self._metrics.sessions_total.inc()
        self._report()
        log.info("session %s created (%d live, %d detached)", session_id[:8], *self._counts())
        return conversation

    async def _room_for(self, client: str, owner: str) -> None:
        """Room for a new session of ``client``: Draining, TooManySessions, ServerFull."""
        if self.draining:
            self._metrics.sessions_rejected.inc()
            raise Draining(self.config.transport.retry_after_s)
        if self._accepting:
            self._check_client(client, owner)  # its own share first: waiting will not help it
        await self._admit()

    def _conversation(self, owner: str) -> Conversation:
        """A new conversation with a new session id (not yet registered)."""
        session_id = self.config.server.session_id_prefix + secrets.token_urlsafe(SESSION_ID_BYTES)
        return Conversation(
            session_id,
            self.config,
            self._detector_factory(),
            self._pipeline,
            self._metrics,
            self._renderer,
            self._vision,
            owner,
            self._clock,
        )

    def _counts(self) -> tuple[int, int]:
        return self.live, self.detached

    async def _admit(self) -> None:
        """Room for one more live session, or ServerFull. A full server first lets go of
        connected peers whose audio stopped ``transport.stale_peer_s`` ago (their
        conversations wait for a resume, or end where none can come)."""
        full = self.config.transport.max_sessions
        if self._accepting and self.live >= full:
            for peer in self.dead_peers(self.config.transport.stale_peer_s):
                log.info("session %s: server full, its peer's audio stopped", peer.session_id[:8])
                self._metrics.sessions_let_go.labels("stale_peer").inc()
                if self._let_go(peer, Gone.LOST):
                    await self._close_quietly(peer.session_id)
        if not self._accepting or self.live >= full:
            self._metrics.sessions_rejected.inc()
            raise ServerFull("server is at its session limit", self.config.transport.retry_after_s)

    async def _connect(
        self, conversation: Conversation, offer_sdp: str, resumed: Resumed
    ) -> RTCSessionDescription:
        """A new peer for ``conversation``, attached to it; BadRequest (nothing attached) if
        the offer cannot be used."""
        session_id = conversation.session_id
        peer = PeerSession(conversation, self.config, self._peer_gone, resumed)
        self.peers[session_id] = peer
        self._peer_objects.add(peer)
        conversation.attach(peer)
        try:
            return await peer.answer(offer_sdp)
        except Exception as exc:
            if self.peers.get(session_id) is peer:
                del self.peers[session_id]
            try:
                await peer.close()
            except Exception:  # aiortc cannot always close after a refused offer
                log.warning("session %s: close after a refused offer failed", session_id[:8])
            raise BadRequest(f"cannot use this SDP offer: {exc}") from exc

    async def resume(
        self,
        token: str,
        offer_sdp: str,
        owner: str = NO_OWNER,
        candidates: CandidateBudget | None = None,
        last_event: int | None = None,
    ) -> tuple[str, RTCSessionDescription]:
        """A new peer for the conversation ``token`` names (its resume token, used up here;
        the new connection's ``session.created`` carries the next). A peer still attached is
        replaced. ``last_event``: the number of the last event the client received (what the
        lost connection took after it is sent again). BadRequest (malformed token or offer),
        ResumeExpired (the conversation has ended), NotFound, Forbidden (another bearer
        token's), ResumeRefused (not its current token); none of them changes anything."""
        session_id, secret = split_token(token)
        if session_id not in self.conversations:
            self._unknown(session_id)
        async with self._turn(session_id):  # a hang-up meanwhile waits, then ends it whole
            return await self._resume(session_id, secret, offer_sdp, owner, candidates, last_event)

    @contextlib.asynccontextmanager
    async def _turn(self, session_id: str) -> AsyncIterator[None]:
        """Hold the session's turn: resumes and hang-ups of one session run one at a time."""
        lock = self._turns.setdefault(session_id, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if session_id not in self.conversations and not lock.locked():
                self._turns.pop(session_id, None)

    def _unknown(self, session_id: str) -> NoReturn:
        """ResumeExpired for a conversation that has ended, NotFound for any other id."""
        if session_id in self._ended:
            raise ResumeExpired("this conversation has ended; start a new session")
        raise NotFound("no such session")

    async def _resume(
        self,
        session_id: str,
        secret: str,
        offer_sdp: str,
        owner: str,
        candidates: CandidateBudget | None,
        last_event: int | None,
    ) -> tuple[str, RTCSessionDescription]:
        """``resume`` with the session's turn held."""
        conversation = self.conversations.get(session_id)
        if conversation is None:
            self._unknown(session_id)
        check_owner(conversation.owner, owner)
        if session_id in self.carriers:
            raise ResumeRefused("this conversation is carried by a WebSocket: it cannot move")
        if not conversation.ticket.valid(secret):
            raise ResumeRefused("this resume token is not valid (used already, or not issued)")
        # the session's turn is held: no close (a hang-up, an eviction the admission asks
        # for) and no other resume of it runs until this one has ended
        if session_id not in self.peers:
            await self._admit()  # a detached conversation becomes live work again
        if not conversation.ticket.redeem(secret):
            raise ResumeRefused("this resume token is not valid (used already, or not issued)")
        old = self.peers.pop(session_id, None)
        if old is not None:
            await old.close()
        try:
            answer = await self._connect(conversation, offer_sdp, Resumption(last_event))
        except BadRequest:
            conversation.ticket.reinstate(secret)
            raise
        if candidates is not None:  # the new connection's own (the old one's went with it)
            admitted = self._admitted[session_id]
            self._admitted[session_id] = Admission(admitted.client, candidates)
        self._metrics.resumes.inc()
        log.info("session %s resumed by a new connection", session_id[:8])
        return session_id, answer

    def get(self, session_id: str) -> PeerSession:
        """The peer carrying the session; NotFound if unknown or while it has none."""
        try:
            return self.peers[session_id]
        except KeyError:
            raise NotFound("no such session") from None

    def owner_of(self, session_id: str) -> str:
        """The owner (token digest) of a live session, with or without a peer; NotFound."""
        try:
            return self.conversations[session_id].owner
        except KeyError:
            raise NotFound("no such session") from None

    def describe(self, session_id: str) -> dict[str, Any]:
        peer = self.peers.get(session_id)
        described = self.conversations[session_id].describe()
        state = "detached" if peer is None else peer.state.value
        return {**described, "state": "websocket" if session_id in self.carriers else state}

    def candidates(self, session_id: str) -> CandidateBudget:
        """The remote ICE candidates the session has been given so far; NotFound if unknown."""
        try:
            return self._admitted[session_id].candidates
        except KeyError:
            raise NotFound("no such session") from None

    async def close(self, session_id: str) -> None:
        """End one session and free everything it holds (after a resume in progress, which
        it waits for); NotFound if unknown."""
        if session_id not in self.conversations:
            raise NotFound("no such session")
        async with self._turn(session_id):
            await self._close(session_id)

    async def _close(self, session_id: str) -> None:
        """``close`` with the session's turn held."""
        conversation = self.conversations.get(session_id)
        if conversation is None:
            raise NotFound("no such session")
        described = self.describe(session_id)
        del self.conversations[session_id]
        peer = self.peers.pop(session_id, None)
        carrier = self.carriers.pop(session_id, None)
        self._admitted.pop(session_id, None)
        self._ended[session_id] = None
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)
        if peer is not None:
            await peer.close()
        if carrier is not None:
            await carrier.close()
        described["state"] = PeerState.CLOSED.value  # ended, whether a peer carried it or not
        await conversation.close()
        self.closed_total += 1
        self.finished.append((conversation.owner, described))
        self._report()
        log.info("session %s closed (%d live, %d detached)", session_id[:8], *self._counts())

    def _own(self, coro: Any) -> None:
        """Run ``coro`` (a close) in a task owned here."""
        task = asyncio.get_running_loop().create_task(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def request_close(self, session_id: str) -> None:
        """Close from a callback; the task is owned here."""
        if session_id in self.conversations:
            self._own(self._close_quietly(session_id))

    def _peer_gone(self, peer: PeerSession, why: Gone) -> None:
        """A peer's connection was lost, never made, or overflowed. Its conversation waits
        for a resume if the client holds a token and the window allows; else it ends."""
        if self._let_go(peer, why):
            self.request_close(peer.session_id)

    def _let_go(self, peer: PeerSession, why: Gone) -> bool:
        """Detach ``peer`` from its conversation (which then waits for a resume, within the
        detached bound) and close it; True where the conversation must end instead (the
        caller ends it)."""
        session_id = peer.session_id
        if self.peers.get(session_id) is not peer:  # replaced by a resume already
            self._own(peer.close())
            return False
        conversation = self.conversations[session_id]
        waits = self.config.session.resume_window_s > 0 and conversation.ticket.issued > 0
        fresh = why is Gone.NEVER_CONNECTED and not peer.resumed
        if why is Gone.OVERFLOWED or fresh or not waits:
            return True
        del self.peers[session_id]
        conversation.detach(peer)  # now, not when the close task runs: it waits from here
        log.info("session %s: connection %s, kept for a resume", session_id[:8], why.value)
        self._own(peer.close())
        self._bound_detached()
        self._report()
        return False

    def _detached_client(self, session_id: str) -> str:
        """The client a detached conversation counts against ('' : none; loopback clients
        are one behind an untrusted proxy, so they have no share of their own)."""
        admitted = self._admitted.get(session_id)
        client = admitted.client if admitted is not None else ""
        return "" if not client or is_loopback(client) else client

    def _bound_detached(self) -> None:
        """End the oldest detached conversations past ``session.max_detached*``."""
        sc = self.config.session
        bound = DetachedBound(
            sc.max_detached, sc.max_detached_per_client, int(sc.max_detached_mb * 1e6)
        )
        waiting = [
            Waiting(
                session_id,
                self._detached_client(session_id),
                conversation.clock.now_ms()
                if conversation.detached_since_ms is None
                else conversation.detached_since_ms,
                conversation.held_bytes(),
            )
            for session_id, conversation in self.conversations.items()
            if not self._carried(session_id)
        ]
        for session_id in evictions(waiting, bound):
            log.info("session %s: the detached conversations' bound ends it", session_id[:8])
            self._metrics.sessions_let_go.labels("detached_bound").inc()
            self.request_close(session_id)

    async def _close_quietly(self, session_id: str) -> None:
        with contextlib.suppress(NotFound):
            await self.close(session_id)

    def drain(self) -> None:
        """Refuse new sessions from now on; the live ones (and those kept for a resume) go on."""
        if not self.draining:
            self.draining = True
            log.info("draining: no new sessions; %d live, %d detached", *self._counts())

    async def close_all(self) -> None:
        """Graceful shutdown: refuse new sessions, close every peer, await every close task."""
        self._accepting = False
        await self.stop_reaper()
        ids = list(self.conversations)
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
        await cancel(task)

    def dead_peers(self, after_s: float | None = None) -> list[PeerSession]:
        """Connected sessions whose inbound audio stopped ``after_s`` ago (default:
        ``transport.dead_peer_timeout_s``).

        aiortc notices a vanished client only after ~30 s of failed consent checks; inbound
        audio flows every 20 ms (silence too), so its absence is the quicker sign. Peers that
        send no audio at all are left to ICE consent and the connect watchdog.
        """
        timeout_ms = 1000 * (
            self.config.transport.dead_peer_timeout_s if after_s is None else after_s
        )
        dead: list[PeerSession] = []
        for peer in self.peers.values():
            if peer.state is not PeerState.CONNECTED or not receives_audio(peer.pc):
                continue
            if peer.clock.now_ms() - peer.last_media_ms > timeout_ms:
                dead.append(peer)
        return dead

    def expired(self) -> list[str]:
        """Conversations that waited ``session.resume_window_s`` for a resume in vain."""
        window_ms = self.config.session.resume_window_s * 1000
        return [
            session_id
            for session_id, conversation in self.conversations.items()
            if conversation.detached_since_ms is not None
            and not self._carried(session_id)
            and conversation.clock.now_ms() - conversation.detached_since_ms >= window_ms
        ]

    def _reap_dead_peers(self) -> None:
        for peer in self.dead_peers():
            log.warning(
                "session %s: no audio for %.1f s (peer gone)",
                peer.session_id[:8],
                self.config.transport.dead_peer_timeout_s,
            )
            self._peer_gone(peer, Gone.LOST)
            self.reaped_total += 1

    async def _reap_loop(self) -> None:
        interval = min(REAP_INTERVAL_S, self.config.transport.dead_peer_timeout_s / 4)
        trimmed_at = self.closed_total
        while True:
            await asyncio.sleep(interval)
            self._reap_dead_peers()  # a method: no peer stays referenced by this loop
            expired = self.expired()
            for session_id in expired:
                log.info("session %s: no resume within the window, closing", session_id[:8])
            results = await asyncio.gather(
                *(self._close_quietly(i) for i in expired), return_exceptions=True
            )
            for session_id, result in zip(expired, results, strict=True):
                if isinstance(result, Exception):
                    log.error("session %s: close failed", session_id[:8], exc_info=result)
            if self.closed_total != trimmed_at:  # return closed sessions' memory to the OS
                trimmed_at = self.closed_total
                await asyncio.to_thread(trim_heap)

    def live_peer_objects(self) -> int:
        """PeerSession objects still in memory (after a collection): a leak check."""
        gc.collect()
        return len(self._peer_objects)
