"""The partial loop's plan as a decider: looks, decodes and verdicts in, actions out, no asyncio.

``PartialPlan`` (server/conversation/partial_plan.py) is told what the loop sees (clock ms, the
detector's quiet ms, the utterance's 16 kHz samples) and what its asks returned; it returns what
to carry out, in order. These tests drive it synchronously, as server/conversation/partials.py
does around its awaits.
"""

from __future__ import annotations

from server.conversation.partial_plan import (
    BUSY_PAUSE_MS,
    EARLY_REPLY_QUIET_MS,
    Decode,
    EmitPartial,
    Judge,
    Look,
    PartialAction,
    PartialPlan,
    SetTranscript,
    TryEarly,
    Warm,
)
from server.conversation.partial_words import MIN_PARTIAL_SAMPLES, Partial, Said
from server.conversation.unfinished import PENDING, SentenceEnd
from server.pipeline.seams import Transcript
from server.pipeline.turn_detector import PAUSE_MS

INTERVAL_MS = 300.0
PARIS = "I would like to go to Paris."
ASKS = (Decode, Judge, TryEarly)  # what the loop awaits and tells back


class Ending:
    """The floor's ``ending()``: whether the turn may end on the latest partial's words."""

    def __init__(self, ends: bool = False) -> None:
        self.ends = ends
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.ends


def plan_with(
    ending: Ending | None = None, early: bool = False, judges: bool = False
) -> tuple[PartialPlan, Ending]:
    ending = ending or Ending()
    plan = PartialPlan(INTERVAL_MS, "test")
    plan.begin(0.0, ending, early, judges)
    return plan, ending


def at(now_ms: float, quiet_ms: float, samples: int) -> Look:
    return Look(now_ms, quiet_ms, samples)


def asks_last(actions: list[PartialAction]) -> list[PartialAction]:
    """An ask (a decode, a verdict, an early reply) is the last action: its outcome decides."""
    assert not any(isinstance(a, ASKS) for a in actions[:-1]), actions
    return actions


def speech_partial(plan: PartialPlan, words: str = PARIS, samples: int = 8000) -> None:
    """A partial of ``samples`` (16 kHz) decoded in speech, an interval after the loop began."""
    assert plan.look(at(INTERVAL_MS, 0.0, samples), busy=False) == [Decode()]
    asks_last(plan.decoded(samples, 7000, Transcript(words), at(INTERVAL_MS + 50, 0.0, samples)))


def test_a_decode_is_due_an_interval_after_the_last() -> None:
    plan, _ = plan_with()
    assert plan.look(at(100.0, 0.0, 8000), busy=False) == []  # 100 ms: not yet
    short = MIN_PARTIAL_SAMPLES - 1
    assert plan.look(at(INTERVAL_MS, 0.0, short), busy=False) == []  # too short for a partial
    assert plan.look(at(INTERVAL_MS, 0.0, 8000), busy=False) == [Decode()]
    got = plan.decoded(8000, 7000, Transcript("I would"), at(350.0, 0.0, 8800))
    # in speech the growing words are warmed (the turn is left open)
    assert got == [
        EmitPartial("I would", ""),
        SetTranscript("I would"),
        Warm(Said("I would", False, 7000)),
    ]
    assert plan.partial == Partial(8000, "I would") and plan.said == Said("I would")
    assert plan.look(at(400.0, 0.0, 9600), busy=False) == []  # an interval after the last began
    assert plan.look(at(2 * INTERVAL_MS, 0.0, 12800), busy=False) == [Decode()]
    got = plan.decoded(12800, 12000, Transcript("I would like"), at(650.0, 0.0, 13600))
    assert got[0] == EmitPartial("I would like", "I would")  # two partials agree on these
    assert plan.stable == "I would"
    assert got[-1] == Warm(Said("I would like", False, 12000))


def test_the_same_words_again_are_neither_set_nor_warmed() -> None:
    plan, _ = plan_with()
    speech_partial(plan, "I would")
    assert plan.look(at(2 * INTERVAL_MS, 0.0, 12800), busy=False) == [Decode()]
    got = plan.decoded(12800, 12000, Transcript("I would"), at(650.0, 0.0, 13600))
    assert got == [EmitPartial("I would", "I would")]


def test_a_pause_after_speech_the_partial_did_not_hear_is_decoded_at_once() -> None:
    plan, _ = plan_with()
    speech_partial(plan, "I would like")
    quiet = at(400.0, PAUSE_MS, 9600)  # 40 ms of quiet after 1600 samples the partial missed
    assert plan.look(quiet, busy=False) == [Decode()]
    # 60 ms later, in the same pause
    after = at(460.0, PAUSE_MS + 60, 9600 + 960)
    got = plan.decoded(9600, 9000, Transcript(PARIS), after)
    # the turn waits on (ending() says no), no early reply: the pause's words are warmed
    assert got == [
        EmitPartial(PARIS, "I would like"),
        SetTranscript(PARIS),
        Warm(Said(PARIS, True)),
    ]
    assert got[-1] == Warm(Said(PARIS, True, 9000))
    assert plan.said.paused


def test_while_a_reply_is_written_the_pause_is_longer() -> None:
    plan, _ = plan_with()
    speech_partial(plan, "I would like")
    quiet = at(400.0, PAUSE_MS, 9600)
    assert plan.look(quiet, busy=True) == []  # BUSY_PAUSE_MS: a gap between two words, maybe
    assert plan.look(at(460.0, BUSY_PAUSE_MS, 9600 + 960), busy=True) == [Decode()]


def test_a_pause_whose_words_the_last_partial_heard_takes_them_without_a_decode() -> None:
    plan, ending = plan_with()
    speech_partial(plan, PARIS, 8000)
    asked = ending.asked
    pause = at(400.0, PAUSE_MS, 8000 + 640)  # the quiet began where the partial ended
    assert plan.look(pause, busy=False) == [SetTranscript(PARIS), Warm(Said(PARIS, True, 7000))]
    assert ending.asked == asked + 1
    # later in the same pause: nothing new (they are warmed), whatever ending() says
    assert plan.look(at(420.0, PAUSE_MS + 20, 8960), busy=False) == []
    ending.ends = True
    assert plan.look(at(440.0, PAUSE_MS + 40, 9280), busy=False) == []


def test_the_turn_that_may_end_on_the_pause_s_words_warms_nothing() -> None:
    plan, _ = plan_with(Ending(ends=True))
    speech_partial(plan, "I would like")
    assert plan.look(at(400.0, PAUSE_MS, 9600), busy=False) == [Decode()]
    got = plan.decoded(9600, 9000, Transcript(PARIS), at(460.0, PAUSE_MS + 60, 10560))
    assert got == [EmitPartial(PARIS, "I would like"), SetTranscript(PARIS)]  # no warm-up
    assert plan.said == Said()  # nor were the speech's words (the turn might have ended)


def test_words_in_speech_are_not_warmed_while_the_turn_may_end() -> None:
    plan, _ = plan_with(Ending(ends=True))
    assert plan.look(at(INTERVAL_MS, 0.0, 8000), busy=False) == [Decode()]
    got = plan.decoded(8000, 7000, Transcript("I would"), at(350.0, 0.0, 8800))
    assert got == [EmitPartial("I would", ""), SetTranscript("I would")]


def test_a_decode_in_speech_that_returns_in_a_pause_leaves_the_warm_up_to_the_pause() -> None:
    plan, _ = plan_with()
    assert plan.look(at(INTERVAL_MS, 0.0, 8000), busy=False) == [Decode()]
    later = at(400.0, 60.0, 9600)  # the user spoke on, then paused, while it ran
    got = plan.decoded(8000, 7000, Transcript("I would"), later)
    assert got == [EmitPartial("I would", ""), SetTranscript("I would")]
    assert plan.look(at(400.0, 60.0, 9600), busy=False) == [Decode()]  # the pause's, at once
    plan.warm_in_pause = True  # the ablation warms them all the same
    got = plan.decoded(9600, 9000, Transcript("I would like"), at(450.0, 0.0, 10400))
    assert got[-1] == Warm(Said("I would like", False, 9000))


def test_a_decode_begun_in_a_pause_that_returns_after_the_user_spoke_on_is_speech() -> None:
    plan, _ = plan_with(judges=True)
    speech_partial(plan, "I would")
    assert plan.look(at(400.0, PAUSE_MS, 9600), busy=False) == [Decode()]
    spoke_on = at(500.0, 0.0, 9600 + 1600)
    got = plan.decoded(9600, 9000, Transcript("I would like"), spoke_on)
    assert got[-1] == Warm(Said("I would like", False, 9000))  # not judged, not the pause's
    assert plan.verdict is None


def test_the_ablation_takes_a_decode_begun_in_a_pause_as_the_pause_s() -> None:
    plan, _ = plan_with()
    plan.gaps_are_pauses = True
    speech_partial(plan, "I would")
    assert plan.look(at(400.0, PAUSE_MS, 9600), busy=False) == [Decode()]
    got = plan.decoded(9600, 9000, Transcript("I would like"), at(500.0, 0.0, 11200))
    assert got[-1] == Warm(Said("I would like", True, 9000))


def test_in_speech_the_ablation_warms_the_stable_words_only() -> None:
    plan, _ = plan_with()
    plan.warm_stable = True
    assert plan.look(at(INTERVAL_MS, 0.0, 8000), busy=False) == [Decode()]
    assert plan.decoded(8000, 7000, Transcript("I would"), at(350.0, 0.0, 8800)) == [
        EmitPartial("I would", "")
    ]
    assert plan.look(at(2 * INTERVAL_MS, 0.0, 12800), busy=False) == [Decode()]
    got = plan.decoded(12800, 12000, Transcript("I would like"), at(650.0, 0.0, 13600))
    assert got[1:] == [SetTranscript("I would"), Warm(Said("I would", False, 12000))]


def test_the_pause_s_words_are_judged_before_the_turn_s_end_is_asked() -> None:
    plan, ending = plan_with(judges=True)
    speech_partial(plan, PARIS, 8000)
    asked = ending.asked
    pause = at(400.0, PAUSE_MS, 8640)
    assert asks_last(plan.look(pause, busy=False)) == [SetTranscript(PARIS), Judge(PARIS)]
    assert plan.verdict is PENDING and ending.asked == asked  # the end waits for the verdict
    got = plan.verdict_came(PARIS, 0.2, 30.0, at(430.0, PAUSE_MS + 30, 9120))
    assert got == [Warm(Said(PARIS, True, 7000))]  # the turn waits on: warmed
    assert plan.verdict == SentenceEnd(PARIS, 0.2) and ending.asked == asked + 1
    assert list(plan.verdicts)[-1][:2] == (0.2, 30.0)
    # the same words are not judged again
    plan, _ = plan_with(judges=True)
    plan.verdict = SentenceEnd(PARIS, 0.2)
    speech_partial(plan, PARIS, 8000)
    assert plan.look(pause, busy=False) == [SetTranscript(PARIS), Warm(Said(PARIS, True, 7000))]


def test_a_verdict_that_never_came_is_none() -> None:
    plan, _ = plan_with(judges=True)
    speech_partial(plan, PARIS, 8000)
    assert plan.look(at(400.0, PAUSE_MS, 8640), busy=False)[-1] == Judge(PARIS)
    plan.judge_failed()
    assert plan.verdict is None


def test_the_turn_waiting_on_tries_an_early_reply_from_its_quiet() -> None:
    plan, ending = plan_with(early=True)
    speech_partial(plan, PARIS, 8000)
    # a pause of 40 ms may be a gap between two words: neither an early reply nor a warm-up
    assert plan.look(at(400.0, PAUSE_MS, 8640), busy=False) == [SetTranscript(PARIS)]
    assert plan.look(at(440.0, PAUSE_MS + 40, 9280), busy=False) == []
    quiet = EARLY_REPLY_QUIET_MS
    assert plan.look(at(460.0, quiet, 8000 + int(quiet * 16)), busy=False) == [TryEarly()]
    assert plan.early_began(True) == []  # it reads the words: no warm-up
    assert plan.said == Said(PARIS)  # (as they were in speech)
    assert plan.look(at(480.0, quiet + 20, 8000 + int(quiet * 16) + 320), busy=False) == []
    ending.ends = True  # and once the turn may end, nothing either
    assert plan.look(at(500.0, quiet + 40, 8000 + int(quiet * 16) + 640), busy=False) == []


def test_an_early_reply_that_did_not_begin_leaves_the_words_to_a_warm_up() -> None:
    plan, _ = plan_with(early=True)
    speech_partial(plan, PARIS, 8000)
    assert plan.look(at(400.0, PAUSE_MS, 8640), busy=False) == [SetTranscript(PARIS)]
    quiet = EARLY_REPLY_QUIET_MS
    assert plan.look(at(460.0, quiet, 8000 + int(quiet * 16)), busy=False) == [TryEarly()]
    assert plan.early_began(False) == [Warm(Said(PARIS, True, 7000))]
    # the next look tries again; warmed already, nothing more to push if it fails again
    assert plan.look(at(480.0, quiet + 20, 8000 + int(quiet * 16) + 320), busy=False) == [
        TryEarly()
    ]
    assert plan.early_began(False) == []


def test_a_new_turn_forgets_the_words_but_not_the_schedule() -> None:
    plan, _ = plan_with()
    speech_partial(plan, PARIS, 8000)
    plan.reset()
    assert plan.partial == Partial(0, "") and plan.stable == "" and plan.said == Said()
    assert plan.verdict is None
    # the next decode is an interval after the last began (the loop's begin() resets it)
    assert plan.look(at(INTERVAL_MS + 100, 0.0, 8000), busy=False) == []
    assert plan.look(at(2 * INTERVAL_MS, 0.0, 8000), busy=False) == [Decode()]
