"""When the end-of-turn model hears a pause, and how sure it must then be.

The model (Smart Turn) hears the utterance at ``HEARINGS`` into the pause. Where the words at
the pause are judged too (the partial loop's decode and the LLM's verdict on it,
server/conversation/unfinished.py), the model's verdict only counts where it can change what
the words say: words that surely end a sentence end the turn, a fragment or a doubted last
word keeps it open, whatever the model hears. So the model hears such a pause only once the
words leave it to the model (a verdict in the band between the bars, or none), or at
``HEARING_LATEST_MS`` of quiet while they are still coming: on a slow machine it would
otherwise take the cores from the decode and the verdict the turn waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.conversation.unfinished import Words

# quiet (ms) from which the model hears a pause whose words may still decide alone (the second
# hearing's): 400 ms for its hearing (~40 ms on two cores, 150-200 ms in the slow profile, more
# under load) before the turn would go by it (floor.WORDS_WAIT_MS, 600 ms). At 400 ms it came
# too late under two sessions in the slow profile, and the turn waited past 600 ms for it.
HEARING_LATEST_MS = 200.0


@dataclass(frozen=True)
class Hearing:
    """When in a pause the end-of-turn model hears the utterance (``quiet_ms``: ms of quiet),
    and how sure it must then be: ``doubt`` is the share of the doubt that
    ``vad.complete_probability`` allows (1: all of it, 0.9 as set; 0.5: 0.95)."""

    quiet_ms: float
    doubt: float = 1.0

    def sounds_complete(self, probability: float, threshold: float) -> bool:
        return probability >= 1.0 - self.doubt * (1.0 - threshold)


# Smart Turn reads the silence after the words too: one that sounded unfinished at 60 ms of
# quiet is heard again at 200 ms, where more complete utterances pass (benchmarks/
# end_of_turn_bench.py --ablate hearings); so do more fragments, and the words at the pause do
# not catch them all (Whisper hears "why the..." as "why there?"), hence the stricter bar
HEARINGS: tuple[Hearing, ...] = (Hearing(60.0), Hearing(200.0, doubt=0.5))


def words_alone(if_unfinished: Words, if_complete: Words) -> Words | None:
    """What the words at a pause say whatever the model hears (``WAIT``: their decode or
    verdict is still coming), from what they say with each of its verdicts; None where its
    verdict decides."""
    return if_unfinished if if_unfinished is if_complete else None


def hears_now(quiet_ms: float, alone: Words | None, latest_ms: float = HEARING_LATEST_MS) -> bool:
    """Whether the model should hear the pause now (its hearing is due): where its verdict
    decides, or the words are still coming at ``latest_ms`` of quiet; not where they decide
    alone."""
    return alone is None or (alone is Words.WAIT and quiet_ms >= latest_ms)
