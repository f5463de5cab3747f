"""Prometheus metrics of the server (one registry per application)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0)
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
V2V_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


def quantile(values: Iterable[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` by nearest rank; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Metrics:
    """The server's metric families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(
            "avatar_sessions_active",
            "Live sessions: those a connection carries (what counts against max_sessions).",
            registry=r,
        )
        self.sessions_detached = Gauge(
            "avatar_sessions_detached",
            "Conversations whose connection was lost, waiting for a resume.",
            registry=r,
        )
        self.sessions_let_go = Counter(
            "avatar_sessions_let_go",
            "Sessions ended or detached to keep a bound, by reason: stale_peer (a full server "
            "let go a peer whose audio had stopped), detached_bound (the oldest waiting "
            "conversation ended), flooded (a session far past its events or media budget for "
            "session.flood_s was ended).",
            ["reason"],
            registry=r,
        )
        self.session_rate_limited = Counter(
            "avatar_session_rate_limited",
            "What sessions sent past their budgets, by kind: events (client events dropped, "
            "unanswered but for one rate_limited error an episode), media (inbound audio packets "
            "dropped before decoding), jump (gaps in the audio's timestamps joined, not filled).",
            ["kind"],
            registry=r,
        )
        self.loop_cpu = Gauge(
            "avatar_event_loop_cpu_seconds",
            "CPU time (s) the event loop's thread has used since start, read at each scrape "
            "(its rate: the loop's share of a core).",
            registry=r,
        )
        self.process_cpu = Gauge(
            "avatar_process_cpu_seconds",
            "CPU time (s) the whole process has used since start, read at each scrape.",
            registry=r,
        )
        self.sessions_total = Counter("avatar_sessions", "Sessions created.", registry=r)
        self.sessions_rejected = Counter(
            "avatar_sessions_rejected", "Session requests refused (full).", registry=r
        )
        self.asr_fallbacks = Counter(
            "avatar_asr_fallbacks",
            "Clips a recogniser failed on (label: which) that the other one heard instead.",
            ["failed"],
            registry=r,
        )
        self.client_secrets = Counter(
            "avatar_client_secrets",
            "Client secrets (ek_ keys of /v1/realtime/client_secrets) by event: minted, used (a "
            "session was created with one), expired (dropped unused).",
            ["event"],
            registry=r,
        )
        self.resumes = Counter(
            "avatar_session_resumes", "Conversations resumed by a new connection.", registry=r
        )
        self.barge_in_reaction = Histogram(
            "avatar_barge_in_reaction_seconds",
            "First voiced input frame arrival to first silent outbound frame.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "avatar_event_loop_lag_seconds",
            "How late the event loop woke a 50 ms timer (anything holding the loop delays it).",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.work_shed = Counter(
            "avatar_work_shed",
            "Optional work dropped so that required work went first (partial, prefill, frame: "
            "an idle picture repeated, late_frame: a picture of a time the video track woke "
            "past).",
            ["kind"],
            registry=r,
        )
        self.barge_ins = Counter("avatar_barge_ins", "Barge-ins (epoch bumps).", registry=r)
        self.turn_timeouts = Counter(
            "avatar_turn_timeouts",
            "Turns that passed their deadline, by the stage that was late (speech: the user's "
            "turn was ended for them).",
            ["stage"],
            registry=r,
        )
        self.underruns = Counter(
            "avatar_playback_underruns", "Replies that ran dry while playing.", registry=r
        )
        self.frame_lateness = Histogram(
            "avatar_audio_frame_lateness_seconds",
            "How late each outbound audio frame left against its 20 ms grid slot.",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.stale_dropped = Counter(
            "avatar_stale_dropped",
            "Stage messages dropped for an older epoch.",
            ["stage"],
            registry=r,
        )
        self.speech_starts = Counter("avatar_speech_starts", "Speech starts detected.", registry=r)
        self.inbound_lost = Counter(
            "avatar_inbound_audio_lost_seconds",
            "The users' microphone audio lost on the way (packets lost, or dropped for coming "
            "after newer ones), by what was heard in its place: recovered (from the copy the "
            "next packet carried, in-band FEC), extrapolated (Opus's concealment) or silence.",
            ["heard_as"],
            registry=r,
        )
        self.early_replies = Counter(
            "avatar_early_replies",
            "Replies begun at a pause before the turn ended, by outcome: adopted or dropped.",
            ["outcome"],
            registry=r,
        )
        self.interjections = Counter(
            "avatar_interjections",
            "Voice over a reply that paused it, by verdict: resume (no interruption) or interrupt.",
            ["verdict"],
            registry=r,
        )
        self.voice_to_voice = Histogram(
            "avatar_voice_to_voice_seconds",
            "End-of-turn decision to the reply's first non-silent outbound frame.",
            buckets=V2V_BUCKETS,
            registry=r,
        )
        self.stage_latency = Histogram(
            "avatar_stage_latency_seconds",
            "Time after the end-of-turn decision at which a stage finished.",
            ["stage"],
            buckets=V2V_BUCKETS,
            registry=r,
        )
        self.cached_tokens = Counter(
            "avatar_prefix_cache_tokens_reused",
            "Prompt tokens served from the prefix cache.",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "avatar_prompt_tokens", "Prompt tokens of replies.", registry=r
        )
        self.lookahead = Histogram(
            "avatar_lookahead_seconds",
            "Output buffered ahead of the playback cursor while a reply plays (sampled).",
            buckets=(0.0, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0),
            registry=r,
        )
        self.discarded_output = Histogram(
            "avatar_discarded_output_seconds",
            "Generated but never heard output thrown away at a barge-in (heard-vs-generated gap).",
            buckets=(0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=r,
        )
        self.queue_wait = Histogram(
            "avatar_engine_queue_wait_seconds",
            "Time a job waited for a shared engine (ASR, TTS) before it ran.",
            ["engine"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.deadline_misses = Counter(
            "avatar_deadline_misses",
            "Engine jobs (ASR, TTS) that started after their latest start time.",
            ["engine"],
            registry=r,
        )

    def observe_engine_job(self, engine: str, wait_ms: float, late: bool) -> None:
        """A shared engine took a job: how long it waited, and whether it started too late."""
        self.queue_wait.labels(engine).observe(wait_ms / 1000)
        if late:
            self.deadline_misses.labels(engine).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition. Call it on the event loop's thread: the loop's
        CPU time is this thread's."""
        self.loop_cpu.set(time.thread_time())
        self.process_cpu.set(time.process_time())
        return generate_latest(self.registry)
