from __future__ import annotations

from collections import Counter

import pytest

from server.config import SchedulerConfig
from server.runtime.session_view import SessionView
from server.runtime.stage import Stage
from server.scheduling.scheduler import (
    DeadlineScheduler,
    RoundRobinScheduler,
    WorkItem,
    make_scheduler,
)


def item(n: int, sid: str, epoch: int = 0, cost: float = 50.0, at: float = 0.0) -> WorkItem:
    return WorkItem(n, sid, Stage.TTS, epoch, cost, at)


def view(sid: str, slack: float, epoch: int = 0, waiting: float | None = None) -> SessionView:
    return SessionView(sid, epoch, slack, budget_ms=2000.0, waiting_since_ms=waiting)


@pytest.fixture
def edf() -> DeadlineScheduler:
    return DeadlineScheduler(SchedulerConfig(first_audio_target_ms=500.0, max_wait_ms=2000.0))


def test_earliest_deadline_first(edf: DeadlineScheduler) -> None:
    views = {"a": view("a", 900), "b": view("b", 100), "c": view("c", 400)}
    items = [item(1, "a"), item(2, "b"), item(3, "c")]
    plan = edf.schedule(0.0, items, views, max_items=3)
    assert [i.session_id for i in plan.run] == ["b", "c", "a"]


def test_cost_moves_the_deadline(edf: DeadlineScheduler) -> None:
    # b has more slack but its item takes longer: it must start earlier
    views = {"a": view("a", 300), "b": view("b", 400)}
    plan = edf.schedule(0.0, [item(1, "a", cost=10), item(2, "b", cost=200)], views, 2)
    assert [i.session_id for i in plan.run] == ["b", "a"]


def test_waiting_for_first_audio_uses_turn_end_deadline(edf: DeadlineScheduler) -> None:
    # "w" ended its turn at t=0 (deadline 500); "p" is playing with 800 ms buffered
    views = {"w": view("w", 0, waiting=0.0), "p": view("p", 800)}
    plan = edf.schedule(100.0, [item(1, "p"), item(2, "w")], views, 2)
    assert [i.session_id for i in plan.run] == ["w", "p"]
    # a playing session about to run dry beats a fresh reply
    views = {"w": view("w", 0, waiting=100.0), "p": view("p", 60)}
    plan = edf.schedule(100.0, [item(1, "w"), item(2, "p")], views, 2)
    assert [i.session_id for i in plan.run] == ["p", "w"]


def test_stale_epoch_work_is_never_scheduled(edf: DeadlineScheduler) -> None:
    views = {"a": view("a", 0, epoch=3), "b": view("b", 500)}
    items = [item(1, "a", epoch=2), item(2, "a", epoch=3), item(3, "b"), item(4, "gone")]
    plan = edf.schedule(0.0, items, views, max_items=10)
    assert {i.item_id for i in plan.stale} == {1, 4}
    assert {i.item_id for i in plan.run} == {2, 3}


def test_session_over_budget_is_not_scheduled(edf: DeadlineScheduler) -> None:
    views = {"full": view("full", 2000), "over": view("over", 2600), "low": view("low", 1999)}
    items = [item(1, "full", cost=1), item(2, "over", cost=1), item(3, "low")]
    plan = edf.schedule(0.0, items, views, max_items=10)
    assert [i.session_id for i in plan.run] == ["low"]
    assert {i.session_id for i in plan.deferred} == {"full", "over"}
    # once playback drains below the budget the session is runnable again
    views["full"] = view("full", 1980)
    assert edf.schedule(20.0, [item(1, "full")], views, 1).run[0].session_id == "full"


def test_recognition_of_a_session_over_budget_still_runs(edf: DeadlineScheduler) -> None:
    # a paused reply's buffer is full while the voice over it is judged: its words must be heard
    words = WorkItem(1, "paused", Stage.ASR, 0, 300.0, 0.0)
    speech = item(2, "paused")
    plan = edf.schedule(0.0, [words, speech], {"paused": view("paused", 2000.0, waiting=0.0)}, 2)
    assert plan.run == (words,) and plan.deferred == (speech,)


def test_a_paused_replys_speech_waits_while_the_voice_over_it_is_heard(
    edf: DeadlineScheduler,
) -> None:
    # little buffered (a slow machine): still, the hearing goes first and the speech waits
    paused = SessionView("paused", 0, 300.0, budget_ms=2000.0, waiting_since_ms=0.0, paused=True)
    words, speech = WorkItem(1, "paused", Stage.ASR, 0, 300.0, 0.0), item(2, "paused")
    other = item(3, "other")
    views = {"paused": paused, "other": view("other", 400.0)}
    for scheduler in (edf, RoundRobinScheduler(aware=True)):
        plan = scheduler.schedule(0.0, [words, speech, other], views, 3)
        assert set(plan.run) == {words, other} and plan.deferred == (speech,)
    # resumed: its speech runs again
    views["paused"] = view("paused", 300.0)
    assert edf.schedule(10.0, [speech], views, 1).run == (speech,)


def test_max_items_leaves_the_rest_waiting(edf: DeadlineScheduler) -> None:
    views = {s: view(s, 100 * i) for i, s in enumerate("abcd")}
    plan = edf.schedule(0.0, [item(i, s) for i, s in enumerate("abcd")], views, 2)
    assert len(plan.run) == 2 and len(plan.waiting) == 2


def test_no_starvation_under_constant_pressure(edf: DeadlineScheduler) -> None:
    """A relaxed session competing with always-urgent ones still runs within max_wait."""
    now = 0.0
    relaxed = item(0, "relaxed", at=now)
    next_id = 1
    served_at: float | None = None
    while now < 10_000 and served_at is None:
        urgent = [item(next_id + k, f"u{k}", at=now) for k in range(3)]
        next_id += 3
        views = {f"u{k}": view(f"u{k}", 50) for k in range(3)}
        views["relaxed"] = view("relaxed", 1400)
        plan = edf.schedule(now, [relaxed, *urgent], views, max_items=1)
        if plan.run[0] is relaxed:
            served_at = now
        now += 50.0  # one item costs 50 ms of engine time
    assert served_at is not None
    assert served_at <= 2000.0 + 50.0


def test_equal_deadlines_are_shared_fairly(edf: DeadlineScheduler) -> None:
    counts: Counter[str] = Counter()
    views = {s: view(s, 500) for s in "abc"}
    for step in range(300):
        items = [item(step * 3 + k, s, at=float(step)) for k, s in enumerate("abc")]
        plan = edf.schedule(float(step), items, views, max_items=1)
        counts[plan.run[0].session_id] += 1
    assert max(counts.values()) - min(counts.values()) <= 1


def test_round_robin_rotates_and_plain_ignores_epochs() -> None:
    rr = RoundRobinScheduler()
    views = {s: view(s, 0, epoch=1) for s in "abc"}
    order = []
    for step in range(6):
        items = [item(step * 3 + k, s, epoch=0) for k, s in enumerate("abc")]
        order.append(rr.schedule(0.0, items, views, 1).run[0].session_id)
    assert order == ["a", "b", "c", "a", "b", "c"]  # and it ran stale work: that is "plain"
    aware = RoundRobinScheduler(aware=True)
    plan = aware.schedule(0.0, [item(1, "a", epoch=0)], views, 1)
    assert plan.run == () and len(plan.stale) == 1


def test_forgotten_session_leaves_no_fairness_record(edf: DeadlineScheduler) -> None:
    views = {s: view(s, 500) for s in "abc"}
    for step in range(6):
        items = [item(step * 3 + k, s, at=float(step)) for k, s in enumerate("abc")]
        edf.schedule(float(step), items, views, max_items=1)
    assert set(edf.served) == {"a", "b", "c"}
    edf.forget("b")
    assert set(edf.served) == {"a", "c"}
    del views["b"]
    order = []
    for step in range(6, 10):
        items = [item(step * 2 + k, s, at=float(step)) for k, s in enumerate("ac")]
        order.append(edf.schedule(float(step), items, views, max_items=1).run[0].session_id)
    assert sorted(order) == ["a", "a", "c", "c"]  # the live sessions still share fairly


def test_round_robin_forgets_a_session_and_keeps_the_turn() -> None:
    rr = RoundRobinScheduler()
    views = {s: view(s, 0) for s in "abc"}
    order = []
    for step in range(2):
        items = [item(step * 3 + k, s) for k, s in enumerate("abc")]
        order.append(rr.schedule(0.0, items, views, 1).run[0].session_id)
    assert order == ["a", "b"]
    rr.forget("b")  # b just ran: its successor is next
    assert rr._ring == ["a", "c"]
    for step in range(2, 5):
        items = [item(step * 3 + k, s) for k, s in enumerate("ac")]
        order.append(rr.schedule(0.0, items, views, 1).run[0].session_id)
    assert order == ["a", "b", "c", "a", "c"]


def test_policy_from_config() -> None:
    assert isinstance(make_scheduler(SchedulerConfig()), DeadlineScheduler)
    assert isinstance(make_scheduler(SchedulerConfig(policy="round_robin")), RoundRobinScheduler)


def test_late_reply_waits_while_on_time_playback_needs_the_engine(edf: DeadlineScheduler) -> None:
    # "w" is past its first-audio target (late); "p" plays with little slack
    views = {"w": view("w", 0, waiting=0.0), "p": view("p", 120)}
    plan = edf.schedule(
        2000.0, [item(1, "w", cost=100, at=1900.0), item(2, "p", cost=100, at=1900.0)], views, 2
    )
    assert [i.session_id for i in plan.run] == ["p", "w"]  # running w first would gap p
    # with enough slack on the on-time side, the late reply goes first
    views["p"] = view("p", 1500)
    plan = edf.schedule(
        2000.0, [item(1, "w", cost=100, at=1900.0), item(2, "p", cost=100, at=1900.0)], views, 2
    )
    assert [i.session_id for i in plan.run] == ["w", "p"]


def test_aging_bound_runs_an_old_item_first(edf: DeadlineScheduler) -> None:
    views = {"old": view("old", 0, waiting=0.0), "p": view("p", 60)}
    items = [item(1, "old", at=0.0), item(2, "p", at=2500.0)]
    plan = edf.schedule(2500.0, items, views, 1)  # waited 2500 > max_wait 2000
    assert plan.run[0].session_id == "old"


@pytest.mark.parametrize("policy", ["edf", "round_robin"])
def test_optional_work_is_shed_while_required_work_waits(policy: str) -> None:
    scheduler = make_scheduler(SchedulerConfig(policy=policy))
    partial = WorkItem(1, "a", Stage.ASR, 0, 90.0, 0.0, optional=True)
    final = WorkItem(2, "b", Stage.ASR, 0, 90.0, 10.0)
    views = {"a": view("a", 0.0), "b": view("b", 1500.0)}
    plan = scheduler.schedule(100.0, [partial, final], views, 2)
    # the partial is older and more urgent by deadline, and still never runs before the final
    assert plan.run == (final,) and plan.shed == (partial,)


def test_optional_work_runs_when_nothing_else_waits(edf: DeadlineScheduler) -> None:
    partials = [
        WorkItem(n, sid, Stage.ASR, 0, 90.0, 0.0, optional=True) for n, sid in ((1, "a"), (2, "b"))
    ]
    plan = edf.schedule(0.0, partials, {"a": view("a", 0.0), "b": view("b", 0.0)}, 2)
    assert len(plan.run) == 2 and plan.shed == ()
