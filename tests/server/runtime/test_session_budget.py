"""A session's budgets for events and inbound audio, decided on a clock the test moves
(server/runtime/budget.py), and carried out by their owners: the inbox (events) and the audio
jitter buffer (packets, timestamp jumps). The end-to-end attacks are in
tests/server/rtc/test_session_budget_e2e.py."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from aiortc.rtp import RtpPacket

from server.clock import FakeClock
from server.config import load_config
from server.errors import ConfigError
from server.rtc.jitter import ArrivalBuffer, MediaGuard, PayloadClock
from server.rtc.opus import libopus, packet_samples
from server.runtime.budget import (
    FLOOD_FACTOR,
    HEARD_BACKLOG_MS,
    HEARD_SPEEDUP,
    Admission,
    Bucket,
    FloodWatch,
    Heard,
    MediaBudget,
    Rate,
    Throttle,
)
from server.wire.inbox import Inbox

OPUS_20MS = bytes([0x78]) + bytes(40)  # TOC: CELT 20 ms, one frame
TICKS_20MS = 960
NO_MEDIA_LIMIT = Rate(0.0, 1.0)


# --- the bucket and the flood watch ---------------------------------------------------------
def test_a_bucket_starts_full_refills_at_its_rate_and_never_past_its_burst() -> None:
    bucket: Bucket | None = Bucket.full(Rate(per_s=2.0, burst=3.0))
    for _ in range(3):
        assert bucket is not None
        bucket = bucket.take(0.0)
    assert bucket is not None and bucket.take(0.0) is None
    assert bucket.take(499.0) is None  # 0.998 of a token back
    half = bucket.take(500.0)
    assert half is not None and half.tokens == 0.0
    assert bucket.at(60_000.0).tokens == 3.0  # capped at the burst
    assert bucket.at(-1.0).tokens == 0.0  # a clock that went back refills nothing


def test_the_flood_watch_needs_whole_seconds_in_a_row_over_ten_times_the_rate() -> None:
    watch = FloodWatch(per_s=2.0, seconds=2)
    limit = int(FLOOD_FACTOR * 2)
    flags = [watch.offered(ms * 1000 / (limit + 1)) for ms in range(limit + 1)]  # second 0
    assert not any(flags)  # one second over the limit is not enough
    flags = [watch.offered(1000 + ms * 1000 / (limit + 1)) for ms in range(limit + 1)]
    assert flags[:-1] == [False] * limit and flags[-1]  # the second one, as it goes over


def test_a_quiet_second_breaks_a_flood_and_a_zero_rate_or_time_never_floods() -> None:
    watch = FloodWatch(per_s=1.0, seconds=2)
    for ms in range(11):
        assert not watch.offered(ms * 10.0)  # second 0: over the limit
    assert not watch.offered(2500.0)  # second 1 passed empty: the run is broken
    assert not any(watch.offered(2600 + ms) for ms in range(10))  # second 2 alone
    for never in (FloodWatch(0.0, 5), FloodWatch(5.0, 0)):
        assert not any(never.offered(0.0) for _ in range(10_000))


# --- events -----------------------------------------------------------------------------------
def test_events_past_the_burst_are_refused_once_then_dropped_until_the_bucket_is_full() -> None:
    throttle = Throttle(Rate(per_s=10.0, burst=5.0), flood_s=0)
    admitted = [throttle.admit(0.0) for _ in range(8)]
    assert admitted == [Admission.TAKE] * 5 + [Admission.REFUSE] + [Admission.DROP] * 2
    assert throttle.admit(100.0) is Admission.TAKE  # a token back: a legitimate event is taken
    assert throttle.admit(100.0) is Admission.DROP  # still the same episode: no second answer
    assert throttle.admit(600.0) is Admission.TAKE  # full again (5 tokens): the episode is over
    assert [throttle.admit(600.0) for _ in range(5)][-1] is Admission.REFUSE  # a new one


def test_events_far_past_the_budget_for_flood_s_end_once() -> None:
    throttle = Throttle(Rate(per_s=2.0, burst=4.0), flood_s=2)
    per_window = int(FLOOD_FACTOR * 2) + 1
    seen = [throttle.admit(s * 1000 + i) for s in range(2) for i in range(per_window)]
    assert seen[-1] is Admission.END and Admission.END not in seen[:-1]
    assert throttle.admit(2500.0) is Admission.DROP  # said once; the owner ends the session


def test_no_event_limit_takes_everything() -> None:
    throttle = Throttle(Rate(per_s=0.0, burst=1.0), flood_s=5)
    assert {throttle.admit(0.0) for _ in range(10_000)} == {Admission.TAKE}


class Emitted(list[dict[str, Any]]):
    def __call__(self, event: dict[str, Any]) -> None:
        self.append(event)


async def test_the_inbox_answers_a_flood_of_bad_events_once_and_counts_the_rest() -> None:
    clock, emitted, limited = FakeClock(), Emitted(), []
    inbox = Inbox("s" * 32, 16_384, emitted, Rate(5.0, 10.0), 0, clock, lambda: limited.append(1))
    bad = json.dumps({"type": "no.such.event"})
    assert all(inbox.receive(bad) for _ in range(1000))
    codes = [e["error"]["code"] for e in emitted]
    assert codes == ["unknown_event"] * 10 + ["rate_limited"]
    assert emitted[-1]["error"]["type"] == "invalid_request_error"  # the protocol's shape
    assert len(limited) == 990
    clock.advance(200)  # one token back: a legitimate event is taken and queued
    assert inbox.receive(json.dumps({"type": "response.cancel", "event_id": "ok"}))
    assert not inbox.idle and len(emitted) == 11


async def test_the_inbox_says_when_its_sender_floods_far_past_the_budget() -> None:
    clock, emitted = FakeClock(), Emitted()
    inbox = Inbox("s" * 32, 16_384, emitted, Rate(1.0, 2.0), 1, clock)
    verdicts = [inbox.receive("{}") for _ in range(int(FLOOD_FACTOR) + 1)]
    assert verdicts == [True] * int(FLOOD_FACTOR) + [False]


# --- inbound audio: decisions -----------------------------------------------------------------
def test_media_packets_past_the_rate_are_dropped_and_a_sustained_flood_ends() -> None:
    budget = MediaBudget(Rate(per_s=50.0, burst=10.0), max_gap_ms=1000, flood_s=2)
    seen = [budget.packet(0.0) for _ in range(12)]
    assert seen == [Admission.TAKE] * 10 + [Admission.DROP] * 2
    assert budget.packet(20.0) is Admission.TAKE  # 50 a second: one back every 20 ms
    per_window = int(FLOOD_FACTOR * 50) + 1
    flood = [budget.packet(1000 + s * 1000 + i) for s in range(2) for i in range(per_window)]
    assert flood[-1] is Admission.END and Admission.END not in flood[:-1]
    assert budget.packet(4000.0) is Admission.DROP


def test_gaps_within_the_cap_are_filled_while_the_audio_budget_lasts() -> None:
    budget = MediaBudget(Rate(per_s=100.0, burst=100.0), max_gap_ms=1000, flood_s=0)
    burst_ms = 1000 + HEARD_BACKLOG_MS
    assert budget.audio(0.0, 20, 0) is Heard.PLAY
    assert budget.audio(0.0, 20, 980) is Heard.PLAY  # a lost second, filled
    assert budget.audio(0.0, 20, 980) is Heard.PLAY
    assert burst_ms - 3 * 20 - 2 * 980 < 1000  # the budget has no room for a third
    assert budget.audio(0.0, 20, 980) is Heard.JOIN_LIMITED  # joined, the packet played
    per_s = 1000 * HEARD_SPEEDUP
    assert budget.audio(1000 / per_s * 1000, 20, 980) is Heard.PLAY  # 1 s of room is back


def test_a_gap_over_the_cap_or_back_in_time_is_a_discontinuity_filled_never() -> None:
    budget = MediaBudget(Rate(per_s=100.0, burst=100.0), max_gap_ms=300, flood_s=0)
    assert budget.audio(0.0, 20, 301) is Heard.JOIN
    assert budget.audio(0.0, 20, -40) is Heard.JOIN
    unlimited = MediaBudget(NO_MEDIA_LIMIT, max_gap_ms=300, flood_s=5)
    assert unlimited.audio(0.0, 20, 5000) is Heard.JOIN  # the cap holds without a rate too
    assert unlimited.audio(0.0, 20, 200) is Heard.PLAY


def test_audio_past_the_heard_budget_is_dropped() -> None:
    budget = MediaBudget(Rate(per_s=1000.0, burst=1000.0), max_gap_ms=1000, flood_s=0)
    heard = [budget.audio(0.0, 120, 0) for _ in range(30)]  # 120 ms packets: 3.6 s at once
    room = int((1000 + HEARD_BACKLOG_MS) // 120)
    assert heard == [Heard.PLAY] * room + [Heard.DROP] * (30 - room)


# --- inbound audio: the jitter buffer carries it out --------------------------------------------
class Guarded:
    """An ArrivalBuffer with a budget on a clock the test moves."""

    def __init__(self, packets: Rate, max_gap_ms: float = 1000, flood_s: float = 0) -> None:
        self.clock = FakeClock()
        self.limited: list[str] = []
        self.floods = 0
        budget = MediaBudget(packets, max_gap_ms, flood_s)
        guard = MediaGuard(budget, self.clock, self.limited.append, self._flooded)
        self.buffer = ArrivalBuffer(guard=guard, clocks={111: PayloadClock(48_000, True)})

    def _flooded(self) -> None:
        self.floods += 1

    def add(self, seq: int, timestamp: int, data: bytes = OPUS_20MS) -> int | None:
        """The timestamp handed on for the packet (None: none handed on)."""
        packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=timestamp)
        packet._data = data  # type: ignore[attr-defined]  # as the receiver sets it
        _, frame = self.buffer.add(packet)
        return None if frame is None else frame.timestamp


def test_the_buffer_drops_a_packet_flood_before_decoding_and_counts_it() -> None:
    rig = Guarded(Rate(per_s=50.0, burst=10.0))
    out = [rig.add(n, n * TICKS_20MS) for n in range(40)]  # 40 packets at one instant
    assert out[:10] == [n * TICKS_20MS for n in range(10)] and out[10:] == [None] * 30
    assert (rig.buffer.released, rig.buffer.limited) == (10, 30)
    assert rig.limited == ["media"] * 30
    rig.clock.advance(20)
    assert rig.add(40, 40 * TICKS_20MS) == 40 * TICKS_20MS  # the lost time before it: a gap
    assert rig.buffer.joined == 0


def test_the_buffer_joins_jumps_the_budget_cannot_fill_so_nothing_is_synthesised() -> None:
    rig = Guarded(Rate(per_s=100.0, burst=100.0))
    jump = 47_040  # 980 ms
    out = []
    for n in range(10):  # every packet 980 ms after the last one's end, all at once
        out.append(rig.add(n, n * (TICKS_20MS + jump)))
        rig.clock.advance(20)
    assert None not in out
    handed = [t for t in out if t is not None]
    filled = [b - a - TICKS_20MS for a, b in pairwise(handed)]
    assert sum(filled) <= 48 * (1000 + HEARD_BACKLOG_MS + 200 * HEARD_SPEEDUP)
    assert set(filled) == {0, jump}  # each gap either filled whole or joined
    assert rig.buffer.joined == filled.count(0) > 0
    assert rig.limited == ["jump"] * rig.buffer.joined
    assert rig.buffer.released == 10  # every packet still played


def test_the_buffer_joins_a_discontinuity_without_counting_it_and_keeps_the_wrap() -> None:
    rig = Guarded(Rate(per_s=100.0, burst=100.0), max_gap_ms=300)
    start = (1 << 32) - 2 * TICKS_20MS  # the sender's timestamps wrap in a moment
    assert rig.add(1, start) == start
    assert rig.add(2, start + TICKS_20MS) == start + TICKS_20MS
    after_mute = (start + 2 * TICKS_20MS + 48_000 * 5) % (1 << 32)  # 5 s on: unmuted
    assert rig.add(3, after_mute) == 0  # joined: continues from where the last one ended
    assert rig.add(4, (after_mute + TICKS_20MS) % (1 << 32)) == TICKS_20MS
    assert rig.add(5, 12345) == 2 * TICKS_20MS  # back in time: joined too
    assert rig.buffer.joined == 2 and rig.limited == []


def test_the_buffer_ends_a_sustained_packet_flood_once() -> None:
    rig = Guarded(Rate(per_s=10.0, burst=10.0), flood_s=1)
    for n in range(int(FLOOD_FACTOR * 10) + 50):
        rig.add(n, n * TICKS_20MS)
    assert rig.floods == 1


@pytest.mark.parametrize("code", [0, 1, 2, 3])
def test_opus_packet_lengths_read_from_the_toc_match_libopus(code: int) -> None:
    lib = libopus()
    for config in range(32):
        for count in (1, 2, 3, 6, 48):
            packet = bytes([config << 3 | code, count]) + bytes(60)
            expected = lib.opus_packet_get_nb_samples(packet, len(packet), 48_000)
            if expected > 0:
                assert packet_samples(packet) == expected, (config, code, count)
    assert packet_samples(b"") == 0


def test_the_budgets_settings_and_their_bounds() -> None:
    config = load_config()
    session, transport = config.session, config.transport
    assert (session.max_events_per_s, session.events_burst, session.flood_s) == (20.0, 50, 3.0)
    assert (transport.max_media_packets_per_s, transport.media_packets_burst) == (100.0, 100)
    assert transport.max_media_gap_ms == 1000
    env = {"AVATAR_SESSION_MAX_EVENTS_PER_S": "0", "AVATAR_TRANSPORT_MAX_MEDIA_GAP_MS": "300"}
    changed = load_config(env=env)
    assert changed.session.max_events_per_s == 0 and changed.transport.max_media_gap_ms == 300
    for bad in (
        {"AVATAR_SESSION_EVENTS_BURST": "0"},
        {"AVATAR_SESSION_MAX_EVENTS_PER_S": "-1"},
        {"AVATAR_TRANSPORT_MAX_MEDIA_GAP_MS": "1001"},  # the inbound path fills 1 s at most
        {"AVATAR_TRANSPORT_MEDIA_PACKETS_BURST": "0"},
    ):
        with pytest.raises(ConfigError):
            load_config(env=bad)
