"""Prometheus metrics of the server (one registry per application)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)


class Metrics:
    """The server's metric families."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge("avatar_sessions_active", "Connected sessions.", registry=r)
        self.sessions_total = Counter("avatar_sessions", "Sessions created.", registry=r)
        self.sessions_rejected = Counter(
            "avatar_sessions_rejected", "Session requests refused (full).", registry=r
        )
        self.barge_in_reaction = Histogram(
            "avatar_barge_in_reaction_seconds",
            "First voiced input frame arrival to first silent outbound frame.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.barge_ins = Counter("avatar_barge_ins", "Barge-ins (epoch bumps).", registry=r)
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

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
