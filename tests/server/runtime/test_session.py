from __future__ import annotations

import pytest

from server.clock import FakeClock
from server.config import RuntimeConfig
from server.errors import InvalidConditionUpdate, InvalidTransition
from server.runtime.chunk import WordTiming
from server.runtime.events import ConditionsApplied, ItemTruncated, ResponseDone, ResponseStatus
from server.runtime.history import Role
from server.runtime.media import FRAME_SAMPLES, ms_to_samples
from server.runtime.session import ChunkAudio, Session, heard_prefix
from server.runtime.stage import Stage
from server.runtime.turn import TurnState
from tests.conftest import tone


def user_turn(session: Session, text: str) -> None:
    session.speech_started()
    session.set_user_transcript(text)
    session.speech_stopped()
    session.commit_user_turn(text)


def play(session: Session, ms: float) -> None:
    for _ in range(int(ms // 20)):
        session.pull_audio(FRAME_SAMPLES)


def say(session: Session, text: str, ms: float, words: bool = False) -> int:
    """Open a chunk for ``text`` and deliver ``ms`` of audio for it (final)."""
    chunk = session.open_chunk(session.epoch, text)
    assert chunk is not None
    timings: tuple[WordTiming, ...] = ()
    if words:
        per = ms_to_samples(ms) // len(text.split())
        timings = tuple(WordTiming(w, i * per, (i + 1) * per) for i, w in enumerate(text.split()))
    msg = session.message(chunk, Stage.TTS, ChunkAudio(tone(ms), timings, final=True))
    assert session.deliver_audio(msg) == ms_to_samples(ms)
    return chunk.chunk_id


def test_a_full_exchange_commits_played_text_and_returns_to_listening(session: Session) -> None:
    user_turn(session, "What is the weather like?")
    assert session.state is TurnState.THINKING
    assert session.start_response(session.epoch)
    say(session, "It is sunny.", 200)
    say(session, "Enjoy the day.", 200)
    session.finish_response(session.epoch)
    play(session, 20)
    assert session.state is TurnState.AGENT_SPEAKING
    assert session.history.turns[-1].role is Role.USER  # nothing fully played yet
    play(session, 400)
    assert session.state is TurnState.LISTENING
    agent = session.history.turns[-1]
    assert agent.role is Role.ASSISTANT and agent.text == "It is sunny. Enjoy the day."
    assert not agent.truncated
    assert any(
        isinstance(e, ResponseDone) and e.status is ResponseStatus.COMPLETED
        for e in session.drain_events()
    )
    assert session.playback.underruns == 0


def test_barge_in_truncates_history_to_played_words(session: Session) -> None:
    user_turn(session, "Tell me a story.")
    session.start_response(0)
    say(session, "Once upon a time.", 400, words=True)  # 4 words, 100 ms each
    second = say(session, "There was a dragon.", 400, words=True)
    play(session, 520)  # chunk 1 whole, then 120 ms of chunk 2 = one word ("There")
    barge = session.speech_started()
    assert barge is not None and barge.old_epoch == 0 and barge.new_epoch == 1
    assert session.epoch == 1 and session.state is TurnState.USER_SPEAKING
    agent = session.history.turns[-1]
    assert agent.text == "Once upon a time. There"
    assert agent.truncated
    item_id = agent.item_id
    assert item_id.startswith("item_")
    # 120 ms into the second chunk is 520 ms into the whole assistant item
    assert barge.truncated == ItemTruncated(0, second, 120.0, "There", item_id, 520.0)
    assert agent.audio_ms == 520.0 and len(agent.word_ends_ms) == 5
    assert session.history.current_user_text == ""  # the user's new turn has started
    assert barge.flushed_samples == ms_to_samples(280)


def test_barge_in_without_word_timings_maps_by_share_of_audio(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    say(session, "alpha beta gamma delta", 400)
    play(session, 200)  # half the audio: 11 of 22 characters -> two whole words
    barge = session.speech_started()
    assert barge is not None and barge.truncated is not None
    assert barge.truncated.heard_text == "alpha beta"
    assert session.history.turns[-1].text == "alpha beta"


def test_unplayed_chunks_are_discarded_and_never_committed(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    a = say(session, "One.", 100)
    b = say(session, "Two.", 100)
    barge = session.bump_epoch("test")
    assert set(barge.discarded) == {a, b}
    assert barge.truncated is None
    assert session.history.turns[-1].role is Role.USER
    assert session.pending_chunks() == ()


def test_a_barge_in_between_two_chunks_truncates_the_item_where_the_first_ended(
    session: Session,
) -> None:
    """The first sentence played whole, the next not begun: history keeps the first, the item
    is marked cut, and the client hears where (its unplayed words were sent as text)."""
    user_turn(session, "Tell me a story.")
    session.start_response(0)
    say(session, "Once upon a time.", 400, words=True)
    second = say(session, "There was a dragon.", 400, words=True)
    play(session, 400)  # the first chunk whole, nothing of the second
    barge = session.speech_started()
    assert barge is not None and barge.discarded == (second,)
    agent = session.history.turns[-1]
    assert agent.text == "Once upon a time." and agent.truncated
    assert barge.truncated == ItemTruncated(0, second, 0.0, "", agent.item_id, 400.0)
    assert barge.truncated in session.drain_events()


def test_old_epoch_output_never_reaches_the_playback_buffer(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    chunk = session.open_chunk(0, "Stale soon.")
    assert chunk is not None
    late = session.message(chunk, Stage.TTS, ChunkAudio(tone(300), final=True))
    session.speech_started()  # barge-in: epoch 0 -> 1
    assert session.deliver_audio(late) is None
    assert session.open_chunk(0, "Another stale sentence.") is None
    assert not session.deliver_video(session.message(chunk, Stage.AVATAR, "frame"), 0)
    assert session.playback.buffered == 0 and session.playback.rejected_stale == 0
    assert session.stale_dropped == {Stage.TTS: 1, Stage.LLM: 1, Stage.AVATAR: 1}
    pulled = [session.pull_audio(FRAME_SAMPLES) for _ in range(20)]
    assert all(not p.pcm.any() for p in pulled[1:])  # after the fade frame: silence only
    assert all(span.epoch >= 1 for p in pulled for span in p.spans)


def test_stale_response_cannot_start(session: Session) -> None:
    user_turn(session, "Hi")
    old = session.epoch
    session.speech_started()
    assert not session.start_response(old)


def test_condition_update_mid_chunk_applies_to_next_chunk_only(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    first = session.open_chunk(0, "Before the change.")
    assert first is not None and first.conditions_version == 0
    session.request_update({"voice": "amy", "persona": "You are a pirate."})
    assert session.conditions.voice == "joe"  # not yet: chunk in flight
    assert session.history.anchor != "You are a pirate."
    msg = session.message(first, Stage.TTS, ChunkAudio(tone(100), final=True))
    assert msg.conditions_version == 0
    session.deliver_audio(msg)
    second = session.open_chunk(0, "After the change.")
    assert second is not None and second.conditions_version == 1
    assert session.conditions.voice == "amy"
    assert session.history.anchor == "You are a pirate."
    assert next(e for e in session.drain_events() if isinstance(e, ConditionsApplied)).version == 1


def test_condition_update_while_idle_applies_at_once(session: Session) -> None:
    session.request_update({"appearance": "robot"})
    assert session.conditions.appearance == "robot" and session.conditions.version == 1


@pytest.mark.parametrize(
    "changes", [{}, {"colour": "red"}, {"voice": ""}, {"voice": 3}, {"persona": "x" * 5000}]
)
def test_invalid_condition_update_changes_nothing(
    session: Session, changes: dict[str, object]
) -> None:
    before = session.conditions
    with pytest.raises(InvalidConditionUpdate):
        session.request_update(changes)
    assert session.conditions == before
    session.request_update({"voice": "amy"})
    assert session.conditions.version == 1


def test_a_field_limited_to_choices_refuses_other_values(
    clock: FakeClock, runtime_config: RuntimeConfig
) -> None:
    looks = {"appearance": ("ada", "milo", "default")}
    session = Session("s" * 32, runtime_config, clock, choices=looks)
    before = session.conditions
    with pytest.raises(InvalidConditionUpdate, match="unknown appearance 'robot'"):
        session.request_update({"appearance": "robot", "voice": "amy"})
    assert session.conditions == before  # nothing changed, the valid field neither
    session.request_update({"appearance": "milo", "voice": "robot"})  # voice has no choices
    session.request_update({"appearance": "default"})
    assert session.conditions.appearance == "default" and session.conditions.voice == "robot"


def test_cursors_track_input_and_output(session: Session) -> None:
    session.input.advance_heard(ms_to_samples(500))
    session.input.advance_prefilled(ms_to_samples(300))
    with pytest.raises(ValueError):
        session.input.advance_prefilled(ms_to_samples(600))  # beyond what was heard
    with pytest.raises(ValueError):
        session.input.advance_prefilled(ms_to_samples(100))  # cursors never go back
    user_turn(session, "Hi")
    session.start_response(0)
    say(session, "Hello there.", 300)
    play(session, 100)
    cursors = session.cursors
    assert cursors.heard_until == ms_to_samples(500)
    assert cursors.prefilled_until == ms_to_samples(300)
    assert cursors.playback_cursor == ms_to_samples(100)
    assert cursors.generation_cursor == ms_to_samples(300)
    assert cursors.generation_cursor - cursors.playback_cursor <= ms_to_samples(2000)


def test_lookahead_budget_limits_delivery(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    chunk = session.open_chunk(0, "A very long sentence.")
    assert chunk is not None
    long = tone(3000)
    accepted = session.deliver_audio(
        session.message(chunk, Stage.TTS, ChunkAudio(long, final=True))
    )
    assert accepted == ms_to_samples(2000)
    assert not session.chunk(chunk.chunk_id).audio_complete
    play(session, 1000)
    rest = session.deliver_audio(
        session.message(chunk, Stage.TTS, ChunkAudio(long[accepted:], final=True))
    )
    assert rest == ms_to_samples(1000)
    assert session.chunk(chunk.chunk_id).audio_complete
    session.finish_response(0)
    play(session, 2000)
    assert session.history.turns[-1].text == "A very long sentence."
    assert session.playback.underruns == 0


def test_scheduler_view_reports_slack_and_waiting(clock: FakeClock, session: Session) -> None:
    user_turn(session, "Hi")
    view = session.view()
    assert view.waiting_since_ms == clock.now_ms() and view.slack_ms == 0
    session.start_response(0)
    say(session, "Hello.", 500)
    play(session, 100)
    view = session.view()
    assert view.waiting_since_ms is None
    assert view.slack_ms == pytest.approx(400)
    assert view.budget_ms == 2000 and view.epoch == 0


def test_typed_text_and_cancel(session: Session) -> None:
    turn, barge = session.submit_text("Hello by keyboard")
    assert turn is not None and turn.text == "Hello by keyboard" and barge is None
    assert session.state is TurnState.THINKING
    session.start_response(0)
    say(session, "Hi typist.", 200)
    play(session, 40)
    barge = session.cancel_response()
    assert barge is not None and session.state is TurnState.LISTENING
    assert session.epoch == 1
    assert session.cancel_response() is None  # nothing to cancel: no epoch bump
    assert session.epoch == 1
    events = session.drain_events()
    assert any(isinstance(e, ResponseDone) and e.status is ResponseStatus.CANCELLED for e in events)
    with pytest.raises(ValueError):
        session.submit_text("   ")


def test_empty_transcript_returns_to_listening(session: Session) -> None:
    session.speech_started()
    session.speech_stopped()
    assert session.commit_user_turn("") is None
    assert session.state is TurnState.LISTENING


def test_invalid_turn_transition_raises_and_keeps_state(session: Session) -> None:
    with pytest.raises(InvalidTransition):
        session.speech_stopped()  # listening -> thinking by VAD is not a thing
    assert session.state is TurnState.LISTENING


def test_heard_prefix_whole_chunk_when_fully_played(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    cid = say(session, "Done.", 100)
    chunk = session.chunk(cid)
    assert heard_prefix(chunk, chunk.duration) == "Done."
    assert heard_prefix(chunk, 0) == ""


def test_failed_reply_before_any_chunk_returns_to_listening(session: Session) -> None:
    user_turn(session, "Hi")
    session.finish_response(session.epoch, status=ResponseStatus.FAILED)
    assert session.state is TurnState.LISTENING
    assert any(
        isinstance(e, ResponseDone) and e.status is ResponseStatus.FAILED
        for e in session.drain_events()
    )


def test_failed_reply_plays_what_was_buffered_then_listens(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    say(session, "Half an answer.", 100)
    session.finish_response(0, status="failed")  # a plain string is read as a ResponseStatus
    play(session, 120)
    assert session.state is TurnState.LISTENING
    assert session.history.turns[-1].text == "Half an answer."
    assert any(
        isinstance(e, ResponseDone) and e.status is ResponseStatus.FAILED
        for e in session.drain_events()
    )


def test_playback_ack_is_clamped_to_what_was_sent(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    say(session, "Hello.", 200)
    play(session, 100)
    assert session.ack_playback(60.0) == 60.0
    assert session.ack_playback(500.0) == 100.0  # cannot have played more than was sent
    assert session.ack_playback(10.0) == 100.0  # never backwards


def test_failed_reply_discards_a_chunk_whose_audio_never_came(session: Session) -> None:
    user_turn(session, "Hi")
    session.start_response(0)
    say(session, "Spoken.", 100)
    orphan = session.open_chunk(0, "Never synthesized.")
    assert orphan is not None
    session.finish_response(0, status="failed")
    play(session, 120)
    assert session.state is TurnState.LISTENING
    assert session.history.turns[-1].text == "Spoken."
    assert session.pending_chunks() == ()


def test_response_done_sends_the_status_as_a_plain_string() -> None:
    done = ResponseDone(3, ResponseStatus.CANCELLED, "resp_0002", "item_0004", "Hi.")
    wire = done.to_dict()
    assert wire == {
        "type": "response.done",
        "epoch": 3,
        "status": "cancelled",
        "response_id": "resp_0002",
        "item_id": "item_0004",
        "transcript": "Hi.",
    }
    assert type(wire["status"]) is str
    assert ResponseStatus("failed") is ResponseStatus.FAILED and done.status == "cancelled"


def test_finish_response_refuses_an_unknown_status(session: Session) -> None:
    user_turn(session, "Hi")
    with pytest.raises(ValueError):
        session.finish_response(session.epoch, status="done-ish")
    assert session.state is TurnState.THINKING


# --- pause first, decide second ------------------------------------------------------------
def test_a_paused_reply_that_resumes_is_heard_whole(session: Session) -> None:
    user_turn(session, "Tell me a story.")
    assert session.start_response(session.epoch)
    say(session, "Once upon a time.", 200)
    say(session, "The end.", 200)
    session.finish_response(session.epoch)
    play(session, 100)
    session.drain_events()
    assert session.pause_reply()
    assert session.state is TurnState.PAUSED
    play(session, 300)  # held: nothing of the reply plays, nothing is committed
    assert session.state is TurnState.PAUSED
    assert session.history.turns[-1].role is Role.USER
    session.resume_reply("backchannel")
    assert session.state is TurnState.AGENT_SPEAKING
    play(session, 300)
    assert session.state is TurnState.LISTENING
    agent = session.history.turns[-1]
    assert agent.text == "Once upon a time. The end." and not agent.truncated
    kinds = [e.to_dict() for e in session.drain_events()]
    paused = next(e for e in kinds if e["type"] == "output_audio_buffer.paused")
    resumed = next(e for e in kinds if e["type"] == "output_audio_buffer.resumed")
    assert paused["audio_end_ms"] == 100.0 and paused["position_ms"] == 100.0
    assert resumed["audio_end_ms"] == 100.0 and resumed["paused_ms"] == 300.0
    assert resumed["reason"] == "backchannel" and paused["item_id"] == resumed["item_id"]
    assert kinds[-1]["type"] == "response.done" and kinds[-1]["status"] == "completed"


def test_an_interruption_while_paused_keeps_only_what_was_heard(session: Session) -> None:
    user_turn(session, "Tell me a story.")
    assert session.start_response(session.epoch)
    say(session, "Once upon a time there was a king.", 400, words=True)
    play(session, 200)
    assert session.pause_reply()
    play(session, 200)
    epoch = session.epoch
    barge = session.speech_started(0.0)
    assert barge is not None and barge.new_epoch == epoch + 1
    assert session.state is TurnState.USER_SPEAKING
    agent = [t for t in session.history.turns if t.role is Role.ASSISTANT][-1]
    assert agent.truncated and agent.text == "Once upon a time"  # the words heard by the pause
    assert not session.playback.paused


def test_a_pause_while_thinking_holds_the_first_audio(session: Session) -> None:
    user_turn(session, "Hello?")
    assert session.pause_reply()  # voice heard before the reply's first audio
    assert session.start_response(session.epoch)  # the reply is made while paused
    say(session, "Hi.", 100)
    session.finish_response(session.epoch)
    play(session, 200)
    assert session.state is TurnState.PAUSED and session.playback.buffered > 0
    session.resume_reply("no voice")
    assert session.state is TurnState.THINKING  # back where it paused
    play(session, 120)
    assert session.state is TurnState.LISTENING


def test_pause_needs_a_reply_and_resume_needs_a_pause(session: Session) -> None:
    assert not session.pause_reply()  # listening: nothing to pause
    with pytest.raises(InvalidTransition):
        session.resume_reply("no voice")
    assert session.state is TurnState.LISTENING


def quiet(session: Session, text: str) -> int:
    """Open a chunk for ``text`` whose speech has no samples (the TTS says nothing for "**")."""
    chunk = session.open_chunk(session.epoch, text)
    assert chunk is not None
    msg = session.message(chunk, Stage.TTS, ChunkAudio(tone(0), (), final=True))
    assert session.deliver_audio(msg) == 0
    return chunk.chunk_id


@pytest.mark.parametrize("where", ["first", "between", "last"])
def test_a_chunk_without_sound_never_holds_the_reply(session: Session, where: str) -> None:
    # a model's markdown ("**", "-") becomes a chunk the voice says nothing for: it plays at
    # once in its place, so the reply still ends (it waited for it forever) and history keeps
    # the text in order
    user_turn(session, "List two things.")
    assert session.start_response(session.epoch)
    if where == "first":
        quiet(session, "**")
    say(session, "Apples.", 200)
    if where == "between":
        quiet(session, "**")
    say(session, "Pears.", 200)
    if where == "last":
        quiet(session, "**")
    session.finish_response(session.epoch)
    play(session, 420)
    assert session.state is TurnState.LISTENING
    expected = {
        "first": "** Apples. Pears.",
        "between": "Apples. ** Pears.",
        "last": "Apples. Pears. **",
    }
    assert session.history.turns[-1].text == expected[where]
    assert any(isinstance(e, ResponseDone) for e in session.drain_events())
