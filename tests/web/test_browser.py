"""The demo page in a real browser: Debian's Chromium (playwright) against the server process.

The fake microphone plays espeak-ng speech (looped, with silence after it so that each turn
ends). Transcripts come from the real recogniser (Whisper), replies from the tone pipeline, so
the test knows how long the avatar speaks. Set ``WEB_TEST_SCREENSHOT=path.png`` to save a
screenshot of the page mid-conversation.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from openai.types.realtime import RealtimeServerEvent
from playwright.sync_api import Browser, Page, Playwright, Route, sync_playwright
from pydantic import TypeAdapter

from client.cli import save_wav
from tests.support import pace
from tests.support.browser import (
    PHONE,
    camera_frames_sent,
    events,
    inbound_stats,
    launch,
    open_page,
    wait_for,
)
from tests.support.coturn import Coturn
from tests.support.lossy_relay import LossyRelay
from tests.support.server_process import ServerProcess, metric_value, server_process, tone_env
from tests.support.speech import silence, speak

pytestmark = pytest.mark.timeout(90)

QUESTION = "What is the capital of France, and how many people live there?"
MORE = " And what is the city famous for?"  # lengthens the question on a slow machine
PARTIAL_START_S = 0.3  # the server decodes a partial once 0.3 s of the utterance are heard
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)
LEAD_MS = 1000  # silence before the question: the call is up before the user speaks
# Silence after it: the turn ends (0.6 s), the final transcript comes (it may wait behind a
# partial, and Whisper shares the CPU with Chromium's media: 6 measured calls' time) and the
# reply starts; then the loop repeats the question while the reply still plays: a barge-in.
# The reply (SENTENCES of SENTENCE_MS) outlasts the tail. Both follow this machine's measured
# Whisper speed (tests/support/pace.py).
TAIL_MS = max(5000, round(1000 * (1.6 + 6 * pace.whisper_call_s())))
PIPELINE = "tests.web.whisper_tone:create"
SLOW_VIDEO = {
    "transport.video_width": "256",
    "transport.video_height": "256",
    "transport.video_fps": "15",
}
SENTENCE_MS = 1500
SENTENCES = max(4, -(-TAIL_MS // SENTENCE_MS) + 1)
NO_FIGURE = "\u2013"  # what the latency panel shows before a figure is known
QUIET = 0.001  # inbound-rtp audioLevel below this: silence


# Records every partial transcript the page shows. On a slow machine the last partial may be
# shown for only a moment before the final replaces it, too short for polling to see.
WATCH_PARTIALS_JS = """() => {
  window.partialsShown = [];
  const list = document.getElementById('conversation');
  new MutationObserver(() => {
    for (const text of list.querySelectorAll('.msg.user[data-state="partial"] .text')) {
      const shown = text.textContent.trim();
      if (shown && window.partialsShown.at(-1) !== shown) window.partialsShown.push(shown);
    }
  }).observe(list, {subtree: true, childList: true, characterData: true, attributes: true});
  window.turnsShown = [];
  const turn = document.getElementById('turn');
  new MutationObserver(() => {
    if (window.turnsShown.at(-1) !== turn.textContent) window.turnsShown.push(turn.textContent);
  }).observe(turn, {subtree: true, childList: true, characterData: true});
}"""


def spoken_question() -> npt.NDArray[np.int16]:
    """The question as the fake microphone says it: long enough that, at this machine's
    measured Whisper speed, a partial decode started once the user has spoken for
    ``PARTIAL_START_S`` ends while they still speak. A decode here runs beside Chromium's
    own media work, so it is given 3.5 times the time of one measured alone."""
    text = QUESTION
    needed_s = PARTIAL_START_S + 3.5 * pace.whisper_call_s()
    for _ in range(6):
        speech = speak(text)
        if len(speech) / 48_000 >= needed_s:
            return speech
        text += MORE
    raise AssertionError(f"no question long enough for a partial at {pace.whisper_call_s()} s")


def sent(page: Page, kind: str | None = None) -> list[dict[str, Any]]:
    """Client events the page sent (``kind``: only that type; else all but playback acks)."""
    out: list[dict[str, Any]] = page.evaluate("() => window.avatarDemo.sent")
    if kind is None:
        return [e for e in out if e["type"] != "x-avatar.playback.ack"]
    return [e for e in out if e["type"] == kind]


def done_of(page: Page, response_id: str) -> list[dict[str, Any]]:
    """The ``response`` of the page's ``response.done`` for ``response_id`` (a list: 0 or 1)."""
    found = [e["response"] for e in events(page, "response.done")]
    return [r for r in found if r["id"] == response_id]


def heard_of(response: dict[str, Any]) -> str:
    """What of a finished response was heard: its assistant item's transcript."""
    (item,) = response["output"]
    assert item["type"] == "message" and item["role"] == "assistant", item
    return str(item["content"][0]["transcript"])


# The words of a reply the page shows as heard: its spoken chunks, the heard part of a cut one.
SHOWN_HEARD_JS = """(id) => [...document.querySelectorAll(
    `.msg.agent[data-response-id="${id}"] .chunk`)].map((c) => c.dataset.state === 'spoken'
      ? c.textContent : c.dataset.state === 'truncated' ? c.querySelector('.heard').textContent
      : '').join(' ').split(/\\s+/).filter(Boolean).join(' ')"""


def reveals_so_far(page: Page, at_least: int) -> list[dict[str, Any]]:
    """When the page showed each chunk's words (``id``, ``agent``: the reply's level then)."""
    reveals: list[dict[str, Any]] = page.evaluate("() => window.avatarDemo.reveals")
    return reveals if len(reveals) >= at_least else []


def state(page: Page) -> str:
    return str(page.evaluate("() => window.avatarDemo.state"))


def live_session(server: ServerProcess, session_id: str) -> dict[str, Any]:
    found = server.session(session_id, ("live",))
    assert found is not None, f"session {session_id} is not live"
    return found


def audio_level(page: Page) -> float:
    stats = inbound_stats(page)
    return float(stats["audio"]["audioLevel"]) if stats and stats["audio"] else 0.0


def frames_decoded(page: Page) -> int:
    stats = inbound_stats(page)
    return int(stats["video"]["framesDecoded"]) if stats and stats["video"] else 0


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()


def start(page: Page) -> str:
    """Press Start; returns the session id once the page shows it is connected."""
    page.click("#start")
    wait_for(lambda: state(page) == "connected", 20, "the page to connect")
    assert page.get_attribute("#state", "data-state") == "connected"
    assert page.inner_text("#state-text") == "Connected"
    return str(page.evaluate("() => window.avatarDemo.sessionId"))


def stop(page: Page, server: ServerProcess) -> None:
    page.click("#stop")
    assert state(page) == "idle"
    wait_for(lambda: server.health()["sessions"] == 0, 10, "the server to close the session")


def server_settings() -> dict[str, str]:
    return {
        "server.debug_endpoints": "true",
        "transport.max_sessions": "1",
        # Chromium decodes the avatar beside the server on the same CPU: on a slow machine
        # (measured pace over 1.5) a smaller, slower video, as a slow machine should send
        **({} if pace.factor() <= 1.5 else SLOW_VIDEO),
    }


server = server_process(
    server_settings, pipeline=PIPELINE, env=tone_env(SENTENCE_MS, SENTENCES), log_tail=3000
)


@pytest.fixture(scope="module")
def pw() -> Iterator[Playwright]:
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def talking(pw: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """A browser whose microphone asks the question, again and again."""
    wav = tmp_path_factory.mktemp("mic") / "question.wav"
    save_wav(wav, np.concatenate([silence(LEAD_MS), spoken_question(), silence(TAIL_MS)]))
    browser = launch(pw, wav)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def quiet(pw: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """A browser whose microphone hears silence."""
    wav = tmp_path_factory.mktemp("mic") / "silence.wav"
    save_wav(wav, silence(1000))
    browser = launch(pw, wav)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def beeping(pw: Playwright) -> Iterator[Browser]:
    """A browser whose fake microphone has no file: Chromium's own beep, twice a second."""
    browser = launch(pw, None)
    yield browser
    browser.close()


LAST_ANSWER_PLAYS_JS = """() => {
  const all = [...document.querySelectorAll('.msg')];
  const asked = all.map((m) => m.classList.contains('user')).lastIndexOf(true);
  return all.slice(asked + 1).some((m) =>
    m.classList.contains('agent') && m.querySelector('.chunk:not([data-state="queued"])'));
}"""  # an answer after the last question plays


def test_ten_starts_in_a_row_never_hang_and_beeps_are_not_speech(
    server: ServerProcess, beeping: Browser
) -> None:
    """Start, a typed question, its answer, Stop: ten times, with Chromium's beeping fake
    microphone on all along. No call hangs in "Thinking", each question is answered, and the
    beeps never start a user turn."""
    with open_page(beeping, server.url) as page:
        for n in range(10):
            start(page)
            page.fill("#message", f"Question number {n + 1}")
            page.press("#message", "Enter")
            # no reply in progress: the item, then a response asked for (nothing cancelled)
            kinds = [e["type"] for e in sent(page)]
            assert kinds[-2:] == ["conversation.item.create", "response.create"], kinds
            assert not sent(page, "response.cancel")
            # this question's answer (the bubbles of the answers before it stay on the page)
            wait_for(lambda: page.evaluate(LAST_ANSWER_PLAYS_JS), 10, f"answer {n + 1}", page)
            wait_for(
                lambda: page.get_attribute("#turn", "data-turn") == "speaking",
                5,
                "the page to show the avatar speaking",
                page,
            )
            assert not page.query_selector('.msg.agent[data-state="thinking"]')
            assert not events(page, "error"), events(page, "error")
            assert not events(page, "input_audio_buffer.speech_started")  # beeps: no speech
            history = live_session(server, str(page.evaluate("() => avatarDemo.sessionId")))
            assert history["history"][0]["text"] == f"Question number {n + 1}"
            stop(page, server)


def test_a_spoken_conversation(server: ServerProcess, talking: Browser) -> None:
    errors: list[str] = []
    requests: list[str] = []
    with open_page(talking, server.url, errors=errors, requests=requests) as page:
        assert page.title().startswith("Avatar")
        page.evaluate(WATCH_PARTIALS_JS)
        # the fake microphone has no echo path, as with headphones: echo cancellation off (on,
        # Chromium damps the voice for seconds while the avatar talks)
        page.check("#headphones")
        session_id = start(page)
        assert server.health()["sessions"] == 1
        (realtime,) = events(page, "session.created")  # the GA dialect's session
        assert realtime["session"]["type"] == "realtime"
        created = events(page, "x-avatar.session")[0]["session"]  # the server's own
        assert created["id"] == session_id

        # the persona goes to the server as GA's session.update (its instructions), the
        # appearance as x-avatar.session.update
        page.select_option("#persona", label="Tour guide")
        persona = page.eval_on_selector("#persona", "(s) => s.value")
        appearance = next(iter(created.get("appearances") or []), "default")
        page.select_option("#appearance", value=appearance)
        wait_for(
            lambda: [
                e for e in events(page, "x-avatar.session.applied") if e["appearance"] == appearance
            ],
            10,
            "x-avatar.session.applied with the appearance",
            page,
        )
        updates = [e["session"] for e in sent(page, "session.update")]
        assert updates == [{"type": "realtime", "instructions": persona}], updates
        looks = [e["session"] for e in sent(page, "x-avatar.session.update")]
        assert looks == [{"appearance": appearance}], looks
        answered = wait_for(lambda: events(page, "session.updated"), 5, "session.updated", page)
        assert answered[0]["session"]["instructions"] == persona
        wait_for(
            lambda: (
                page.get_attribute("#conditions", "data-appearance") == appearance
                and "Tour guide" in page.inner_text("#conditions")
            ),
            10,
            "the applied conditions on the page",
        )

        # the server hears the question; the page shows partial, then final transcripts
        wait_for(lambda: events(page, "input_audio_buffer.speech_started"), 15, "speech", page)
        partials = wait_for(
            lambda: page.evaluate("() => window.partialsShown"), 15, "a partial transcript", page
        )
        assert partials[0].strip()
        final = wait_for(
            lambda: page.query_selector('.msg.user[data-state="final"] .text'),
            20,
            "the final transcript",
            page,
        ).inner_text()
        assert {"capital", "france", "people"} <= set(words(final)), final
        completed = events(page, "conversation.item.input_audio_transcription.completed")[0]
        assert completed["transcript"] == final
        assert (
            completed["item_id"] == events(page, "input_audio_buffer.speech_started")[0]["item_id"]
        )
        # the partials shown were the server's whole hypotheses, not GA's appended deltas
        assert events(page, "x-avatar.transcription.partial")
        history = live_session(server, session_id)["history"]
        user = history[0]
        assert (user["role"], user["text"], user["truncated"]) == ("user", final, False), user

        # the reply is heard and seen
        wait_for(lambda: audio_level(page) > 0.01, 15, "reply audio (inbound-rtp audioLevel)")
        assert created["video"] is True
        before = frames_decoded(page)
        wait_for(lambda: frames_decoded(page) > before + 10, 5, "video frames to decode")
        assert page.get_attribute("#screen", "data-video") == "playing"
        spoken = wait_for(
            lambda: page.query_selector_all('.msg.agent .chunk:not([data-state="queued"])'),
            5,
            "the reply's words on the page",
        )
        assert spoken[0].inner_text().startswith("Tone number 1")
        # the reply whose words are shown: its first delta, and visemes that name it
        first = str(spoken[0].evaluate("(c) => c.closest('.msg').dataset.responseId"))
        deltas = [
            d
            for d in events(page, "response.output_audio_transcript.delta")
            if d["response_id"] == first
        ]
        assert deltas[0]["delta"].strip() == spoken[0].inner_text().strip()
        item_id = deltas[0]["item_id"]
        # each chunk's words appeared when its audio was playing, in order
        reveals = wait_for(lambda: reveals_so_far(page, 2), 5, "the second chunk's words", page)
        assert [r["id"] for r in reveals] == sorted(r["id"] for r in reveals)
        assert all(r["agent"] > 0.005 for r in reveals), reveals
        acks = wait_for(lambda: sent(page, "x-avatar.playback.ack"), 5, "playback acknowledgements")
        assert acks[-1]["played_ms"] > 0

        # the looped question comes back while the avatar talks: a barge-in by voice
        truncated = wait_for(
            lambda: events(page, "conversation.item.truncated"), 15, "a barge-in", page
        )[0]
        assert truncated["item_id"] == item_id and truncated["audio_end_ms"] > 0
        # the reply paused at the voice's onset, and the page said so, before it was judged
        paused = events(page, "x-avatar.output_audio_buffer.paused")
        assert paused and paused[0]["item_id"] == item_id, paused
        assert "Paused: hearing you" in page.evaluate("() => window.turnsShown")
        # what was heard (the item's transcript in response.done) is shown as heard, the rest
        # struck through, and it is what the server keeps in its history
        cancelled = wait_for(lambda: done_of(page, first), 5, "the cut reply's end", page)[0]
        assert cancelled["status"] == "cancelled"
        heard = heard_of(cancelled)
        bubble = f'.msg.agent[data-response-id="{first}"]'
        cut = page.query_selector(f'{bubble} .chunk[data-state="truncated"]')
        assert cut is not None, "the chunk playing at the barge-in is shown cut"
        assert page.evaluate(SHOWN_HEARD_JS, first) == " ".join(heard.split())
        agent = live_session(server, session_id)["history"][1]
        assert (agent["role"], agent["text"], agent["truncated"]) == ("assistant", heard, True)
        dropped = page.query_selector_all(f"{bubble} del.dropped")
        assert dropped, "the unplayed remainder is struck through"
        who = page.text_content(f"{bubble} .who") or ""
        assert "interrupted" in who
        wait_for(
            lambda: page.inner_text("#lat-barge") != NO_FIGURE, 5, "the barge-in reaction figure"
        )
        assert live_session(server, session_id)["barge_in_reactions_ms"]
        assert page.inner_text("#lat-v2v").endswith("ms")
        for figure in ("#lat-rtt", "#lat-jitter", "#lat-lost"):
            assert page.inner_text(figure) != NO_FIGURE, figure
        shot = os.environ.get("WEB_TEST_SCREENSHOT")
        if shot:
            page.screenshot(path=shot)

        # the second reply: the Interrupt button silences it
        ids = [e["response"]["id"] for e in events(page, "response.created")]
        second = wait_for(
            lambda: [
                e["response"]["id"]
                for e in events(page, "response.created")[ids.index(first) + 1 :]
            ],
            20,
            "the reply to the second question",
        )[0]
        wait_for(lambda: audio_level(page) > 0.01, 10, "the second reply's audio")
        page.click("#interrupt")
        assert sent(page, "response.cancel")
        done = wait_for(lambda: done_of(page, second), 5, "cancel")[0]
        assert done["status"] == "cancelled"
        wait_for(lambda: audio_level(page) < QUIET, 3, "the reply to go silent")
        assert not events(page, "error"), events(page, "error")
        assert not errors, errors
        # the GA dialect throughout: every event has an id, none has a native-only name
        received = events(page)
        assert all(isinstance(e.get("event_id"), str) for e in received), received[:5]
        native = {"response.audio_transcript.delta", "avatar.viseme", "response.timings"}
        assert not [e for e in received if e["type"] in native]
        visemes = [v for v in received if v["type"] == "x-avatar.viseme"]
        replies = {e["response"]["id"] for e in received if e["type"] == "response.created"}
        named = {v.get("response_id") for v in visemes}
        assert first in named and named <= replies, visemes[:3]  # each names its reply
        # every GA event of the spoken exchange and its barge-in validates (openai's models)
        ga = [e for e in received if not e["type"].startswith("x-avatar.")]
        assert [SERVER_EVENT.validate_python(e).type for e in ga] == [e["type"] for e in ga]
        kinds = {e["type"] for e in ga}
        print(f"\ndemo page: {len(ga)} GA events of {len(kinds)} types validated")
        assert {"conversation.item.truncated", "output_audio_buffer.cleared"} <= kinds
        # everything the page loaded came from the server itself (no CDN, no fonts)
        assert requests and all(u.startswith(server.url + "/") for u in requests), requests

        stop(page, server)
        closed = wait_for(lambda: server.session(session_id, ("closed",)), 5, "the closed session")
        assert closed["state"] == "closed"


def test_typed_message_and_camera_on_a_phone_sized_screen(
    server: ServerProcess, quiet: Browser
) -> None:
    with open_page(quiet, server.url, viewport=PHONE) as page:
        page.select_option("#camera", index=1)  # Chromium's fake camera
        start(page)
        assert page.is_visible("#self-view")
        wait_for(lambda: camera_frames_sent(page) > 5, 10, "camera frames sent")
        page.fill("#message", "Hello by keyboard")
        page.press("#message", "Enter")
        typed = wait_for(lambda: page.query_selector(".msg.user.typed .text"), 5, "typed bubble")
        assert typed.inner_text() == "Hello by keyboard"
        item = sent(page, "conversation.item.create")[0]["item"]
        assert item == {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Hello by keyboard"}],
        }
        kinds = [e["type"] for e in sent(page)]
        assert kinds == ["conversation.item.create", "response.create"], kinds
        wait_for(
            lambda: page.query_selector('.msg.agent .chunk:not([data-state="queued"])'),
            10,
            "the reply's words",
        )
        # typed over the reply: it is cancelled first, then the new message gets its own
        first = events(page, "response.created")[0]["response"]["id"]
        page.fill("#message", "Another question")
        page.press("#message", "Enter")
        kinds = [e["type"] for e in sent(page)]
        assert kinds[2:] == ["response.cancel", "conversation.item.create", "response.create"]
        assert (
            wait_for(lambda: done_of(page, first), 5, "the first reply to end")[0]["status"]
            == "cancelled"
        )
        second = wait_for(
            lambda: [e for e in events(page, "response.created") if e["response"]["id"] != first],
            10,
            "the reply to the second message",
        )[0]["response"]["id"]
        wait_for(
            lambda: page.query_selector(
                f'.msg.agent[data-response-id="{second}"] .chunk:not([data-state="queued"])'
            ),
            10,
            "the second reply's words",
        )
        # nothing sticks out sideways at 390 px, with the conversation filled in
        overflow = page.evaluate(
            """() => {
              const width = document.documentElement.clientWidth;
              const wide = [...document.querySelectorAll('body *')].filter((el) => {
                const r = el.getBoundingClientRect();
                return r.width > 0 && r.right > width + 1;
              }).map((el) => el.id || el.className || el.tagName);
              return {width, scroll: document.documentElement.scrollWidth, wide};
            }"""
        )
        assert overflow["width"] == PHONE["width"]
        assert overflow["scroll"] <= PHONE["width"], overflow
        assert overflow["wide"] == [], overflow
        assert page.is_visible("#start") and page.is_visible("#interrupt")
        # Escape interrupts too
        page.press("body", "Escape")
        done = wait_for(lambda: done_of(page, second), 5, "the reply to end")[0]
        assert done["status"] == "cancelled"
        stop(page, server)


# Records every text the page's connection status shows (a reconnection may be brief).
WATCH_STATES_JS = """() => {
  window.statesShown = [];
  const text = document.getElementById('state-text');
  const record = () => {
    if (window.statesShown.at(-1) !== text.textContent) window.statesShown.push(text.textContent);
  };
  record();
  new MutationObserver(record).observe(text, {subtree: true, childList: true, characterData: true});
}"""

# The conversation as the page shows it: each line's kind, label, text and chunks.
TRANSCRIPT_JS = """() => [...document.querySelectorAll('#conversation > li')].map((li) => ({
  kind: li.className,
  who: li.querySelector('.who')?.textContent ?? '',
  text: (li.querySelector('.text') ?? li).textContent,
  chunks: [...li.querySelectorAll('.chunk')].map((c) => ({
    id: c.dataset.chunkId, state: c.dataset.state, text: c.textContent})),
}))"""

# Cuts the page's connection as a network would: Chrome fires no event for a local close, so
# the page has to notice by itself.
CUT_JS = """() => {
  window.cutPc = window.avatarDemo.pc;
  window.cutPc.close();
}"""

# Whether the avatar element plays the current connection's audio track.
AVATAR_AUDIO_JS = """() => {
  const el = document.getElementById('avatar');
  const track = el.srcObject ? el.srcObject.getAudioTracks()[0] : null;
  const pc = window.avatarDemo.pc;
  return {
    paused: el.paused,
    live: !!track && track.readyState === 'live',
    current: !!track && !!pc && pc.getReceivers().some((r) => r.track === track),
    tracks: el.srcObject ? el.srcObject.getTracks().length : 0,
  };
}"""


def transcript(page: Page) -> list[dict[str, Any]]:
    return list(page.evaluate(TRANSCRIPT_JS))


def agent_level(page: Page) -> float:
    """The reply's level as the page's meter hears it (WebAudio on the remote track)."""
    return float(page.evaluate("() => window.avatarDemo.level.agent"))


INBOUND_AUDIO_LOG = re.compile(r"inbound audio: (\d+) packets, (\d+) with a FEC copy")
LOST = "avatar_inbound_audio_lost_seconds_total"


def test_chromium_sends_fec_copies_and_the_server_recovers_lost_packets(
    server: ServerProcess, talking: Browser
) -> None:
    """The server's answer says ``useinbandfec=1``. A relay loses 10 % of Chromium's audio
    packets on their way; the server's reports of that loss make Chromium's encoder put a copy
    of each frame into the packet after it, and the server hears lost frames recovered from
    those copies (/metrics), where they would have been silence."""
    relays: list[LossyRelay] = []

    def via_relay(route: Route) -> None:
        request = json.loads(route.request.post_data or "{}")
        opus = re.search(r"a=rtpmap:(\d+) opus/48000", request["sdp"])
        assert opus is not None, request["sdp"]
        relays.append(relay := LossyRelay(int(opus.group(1)), share=0.1))
        request["sdp"] = relay.offer(request["sdp"])
        response = route.fetch(post_data=json.dumps(request))
        body = response.json()
        assert "useinbandfec=1" in body["sdp"], body["sdp"]
        body["sdp"] = relay.answer(body["sdp"])
        route.fulfill(status=response.status, json=body)

    before = metric_value(server.metrics(), LOST, 'heard_as="recovered"')
    try:
        with open_page(talking, server.url) as page:
            page.route("**/offer", via_relay)
            page.check("#headphones")
            start(page)
            wait_for(lambda: events(page, "input_audio_buffer.speech_started"), 15, "speech", page)
            wait_for(
                lambda: metric_value(server.metrics(), LOST, 'heard_as="recovered"') > before,
                30,
                "a lost packet recovered from its copy",
                page,
            )
            stop(page, server)
    finally:
        for each in relays:
            each.close()
    (used,) = relays
    # lost, and not most of them: the seeded draws lose 10 % in the long run, and at most 5 of
    # the first 21 (the page may stop after 30 packets, once one was recovered)
    assert used.lost > 0 and used.relayed >= 3 * used.lost
    found = wait_for(lambda: INBOUND_AUDIO_LOG.findall(server.log()), 5, "the peer's audio log")
    packets, with_copy = map(int, found[-1])
    assert packets > 0 and with_copy > 0, found[-1]


def test_a_cut_connection_resumes_mid_reply(server: ServerProcess, quiet: Browser) -> None:
    """The page's connection is cut mid-reply (its RTCPeerConnection closed from here): the
    page says it reconnects, resumes the same conversation on a new connection by itself, its
    transcript stays as it was, and the reply's audio plays again and finishes."""
    errors: list[str] = []
    resumes_before = metric_value(server.metrics(), "avatar_session_resumes_total")
    with open_page(quiet, server.url, errors=errors) as page:
        page.evaluate(WATCH_STATES_JS)
        session_id = start(page)
        (created,) = events(page, "x-avatar.session")
        assert created["resumed"] is False
        token = created["session"]["resume_token"]
        assert token.startswith(f"{session_id}.") and created["session"]["resume_window_s"] > 0

        page.fill("#message", "Tell me a long story")
        page.press("#message", "Enter")
        wait_for(
            lambda: page.query_selector('.msg.agent .chunk[data-state="playing"]'),
            10,
            "the reply to play",
            page,
        )
        wait_for(lambda: audio_level(page) > 0.01, 5, "the reply's audio")
        wait_for(lambda: sent(page, "x-avatar.playback.ack"), 5, "playback acknowledgements")
        before = transcript(page)
        acked_before = sent(page, "x-avatar.playback.ack")[-1]["played_ms"]
        assert [line["kind"] for line in before] == ["msg user typed", "msg agent"], before

        page.evaluate(CUT_JS)
        cut = time.monotonic()
        wait_for(
            lambda: "Reconnecting…" in page.evaluate("() => window.statesShown"),
            5,
            "the page to say it reconnects",
            page,
        )
        wait_for(
            lambda: state(page) == "connected" and page.evaluate("() => avatarDemo.resumes") == 1,
            15,
            "the page to resume by itself",
            page,
        )
        assert page.inner_text("#state-text") == "Connected"
        assert page.evaluate("() => window.avatarDemo.pc !== window.cutPc")
        shown = page.evaluate("() => window.statesShown")
        assert shown[shown.index("Reconnecting…") :] == ["Reconnecting…", "Connected"], shown

        # the same conversation, on a new connection, with a new resume token
        assert page.evaluate("() => avatarDemo.sessionId") == session_id
        assert live_session(server, session_id)["state"] == "connected"
        assert server.health()["sessions"] == 1
        resumed = [e for e in events(page, "x-avatar.session") if e["resumed"]]
        assert len(resumed) == 1 and resumed[0]["session"]["id"] == session_id
        assert len(events(page, "session.created")) == 2  # GA's, on each connection
        assert resumed[0]["session"]["resume_token"] not in ("", token)
        assert metric_value(server.metrics(), "avatar_session_resumes_total") == resumes_before + 1

        # the reply's audio plays again, on the avatar element
        wait_for(lambda: audio_level(page) > 0.01, 10, "the reply's audio after the resume", page)
        wait_for(lambda: agent_level(page) > 0.01, 5, "the page's meter to hear the reply", page)
        print(f"\ncut to audio playing again: {1000 * (time.monotonic() - cut):.0f} ms")
        avatar = page.evaluate(AVATAR_AUDIO_JS)
        assert avatar == {"paused": False, "live": True, "current": True, "tracks": 2}, avatar

        # the transcript is as it was: the same lines, each chunk as it was or further on
        after = transcript(page)
        assert [(a["kind"], a["who"]) for a in after] == [(b["kind"], b["who"]) for b in before]
        assert after[0]["text"] == before[0]["text"] == "Tell me a long story"
        chunks_after = {c["id"]: c for c in after[1]["chunks"]}
        for chunk in before[1]["chunks"]:
            now = chunks_after.get(chunk["id"])
            assert now is not None and now["text"] == chunk["text"], (chunk, after)
            if chunk["state"] != "queued":
                assert now["state"] in ("playing", "spoken"), (chunk, now)

        # the reply plays out: completed, nothing dropped, its playback acknowledged further on
        done = wait_for(lambda: events(page, "response.done"), 20, "the reply to end", page)[0]
        assert done["response"]["status"] == "completed", done
        played = " ".join(c["text"].strip() for c in transcript(page)[1]["chunks"])
        assert heard_of(done["response"]) == played
        assert page.get_attribute(".msg.agent", "data-state") == "completed"
        assert not page.query_selector(".msg.agent del.dropped")
        assert page.text_content(".msg.agent .who") == "Avatar"
        assert sent(page, "x-avatar.playback.ack")[-1]["played_ms"] > acked_before
        assert not events(page, "error"), events(page, "error")
        assert not errors, errors

        stop(page, server)
        closed = wait_for(lambda: server.session(session_id, ("closed",)), 5, "the closed session")
        assert closed["state"] == "closed"


def test_a_conversation_the_server_ended_is_not_resumed(
    server: ServerProcess, quiet: Browser
) -> None:
    """The server ends the conversation (its ``DELETE /whip/<id>``): the page's one resume
    attempt is refused (410) and it explains the lost call at once, without retrying."""
    requests: list[str] = []
    with open_page(quiet, server.url, requests=requests) as page:
        session_id = start(page)
        delete = urllib.request.Request(f"{server.url}/whip/{session_id}", method="DELETE")
        with urllib.request.urlopen(delete, timeout=5) as response:
            assert response.status == 200
        wait_for(lambda: state(page) == "error", 5, "the page to give up", page)
        assert "closed the conversation" in page.inner_text("#notice-text")
        assert [u for u in requests if u.endswith("/offer")] == [f"{server.url}/offer"] * 2
        assert page.evaluate("() => avatarDemo.sessionId") is None
        assert page.is_enabled("#start") and not page.is_enabled("#stop")
        assert server.health()["sessions"] == 0


def test_the_page_uses_the_servers_turn_relay(quiet: Browser) -> None:
    """The page asks ``GET /ice-servers`` before its offer and gives Chromium the TURN server
    with the credential the server issued it (TURN REST API, coturn ``--use-auth-secret``)."""
    secret = "page-test-secret"
    turn = Coturn(auth_secret=secret, relay_ports=(49260, 49300)).start()
    server = ServerProcess(
        {
            "pipeline.factory": "",
            "transport.video": "false",
            "transport.ice_urls": turn.url,
            "transport.ice_auth_secret": secret,
        }
    ).start()
    try:
        with open_page(quiet, server.url) as page:
            start(page)
            (given,) = page.evaluate("() => window.avatarDemo.pc.getConfiguration().iceServers")
            assert given["urls"] == [turn.url] and given["username"].endswith(":client")
            username = given["username"]
            wait_for(
                lambda: (
                    f"user <{username}>: incoming packet ALLOCATE processed, success" in turn.log()
                ),
                10,
                "Chromium's relay allocation",
            )
            stop(page, server)
    finally:
        assert server.stop() == 0, server.log()[-3000:]
        turn.stop()


def test_server_full_is_explained(server: ServerProcess, quiet: Browser) -> None:
    with open_page(quiet, server.url) as first, open_page(quiet, server.url) as second:
        start(first)
        second.click("#start")
        wait_for(lambda: state(second) == "error", 15, "the second page to give up")
        assert second.is_visible("#notice")
        text = second.inner_text("#notice-text")
        assert "server is full" in text and "Try again in 5 s" in text, text
        assert second.inner_text("#state-text") == "Server full"
        assert second.is_enabled("#start")
        assert server.health()["sessions"] == 1  # the refused call left nothing behind
        stop(first, server)


def test_start_right_after_stop_finds_room_on_a_full_server(
    server: ServerProcess, quiet: Browser
) -> None:
    """Stop, then Start at once, on a server with room for one call: the new call connects
    (not "Server full"), even with the page's request to end the old one held back a second:
    the old peer connection's close frees its place."""
    with open_page(quiet, server.url) as page:
        first = start(page)
        deletes: list[str] = []

        def slow_delete(route: Route) -> None:
            if route.request.method == "DELETE":
                deletes.append(route.request.url)
                time.sleep(1.0)
            route.continue_()

        page.route("**/whip/*", slow_delete)
        page.click("#stop")
        second = start(page)
        assert second != first and len(deletes) == 1 and first in deletes[0]
        assert server.health()["sessions"] == 1
        stop(page, server)


def test_a_reload_or_a_closed_tab_hangs_up(server: ServerProcess, quiet: Browser) -> None:
    """Leaving the page ends the conversation (its DELETE on pagehide, sent with keepalive):
    nothing waits for a resume that will not come, neither a slot nor the memory of a
    detached conversation."""
    with open_page(quiet, server.url) as page:
        start(page)
        page.reload()
        wait_for(
            lambda: server.health()["sessions"] == server.health()["detached_sessions"] == 0,
            10,
            "the reloaded page's hang-up",
        )
        start(page)
    wait_for(
        lambda: server.health()["sessions"] == server.health()["detached_sessions"] == 0,
        10,
        "the closed tab's hang-up",
    )


def test_lost_and_unreachable_server_are_explained(quiet: Browser) -> None:
    gone = ServerProcess({"pipeline.factory": "", "transport.video": "false"}).start()
    with open_page(quiet, gone.url) as page:
        start(page)
        assert gone.stop() == 0  # the server goes away mid-call
        wait_for(lambda: state(page) == "error", 10, "the page to notice", page)
        assert "closed the conversation" in page.inner_text("#notice-text")
        page.click("#start")
        wait_for(lambda: state(page) == "error", 20, "the page to give up")
        text = page.inner_text("#notice-text")
        assert "Cannot reach the server" in text and gone.url in text, text
        assert page.is_enabled("#start") and not page.is_enabled("#stop")


def test_denied_microphone_is_explained(
    server: ServerProcess, pw: Playwright, tmp_path: Path
) -> None:
    save_wav(tmp_path / "silence.wav", silence(1000))
    browser = launch(pw, tmp_path / "silence.wav", grant_media=False)
    try:
        denied_microphone(server, browser)
    finally:
        browser.close()


def denied_microphone(server: ServerProcess, browser: Browser) -> None:
    with open_page(browser, server.url) as page:
        cdp = page.context.new_cdp_session(page)
        cdp.send(
            "Browser.setPermission",
            {"permission": {"name": "microphone"}, "setting": "denied", "origin": server.url},
        )
        page.click("#start")
        wait_for(lambda: state(page) == "error", 10, "the page to give up")
        text = page.inner_text("#notice-text")
        assert "Microphone permission was denied" in text, text
        assert server.health()["sessions"] == 0  # no call was attempted


FOLLOWER_JS = """
async () => {
  const { SpeechFollower } = await import('/static/spoken.js');
  const out = {};
  // placed chunks (from viseme pts): the first at the reply's first sound, which also learns
  // the offset between the browser's played time and the server's timeline
  let f = new SpeechFollower();
  f.add(1, 'First sentence.');
  f.add(2, 'Second sentence.');
  f.place(1, 1000);
  f.place(2, 2500);
  out.silent = f.update(0, false, 900);
  out.first = f.update(20, true, 1100);
  out.offset = f.offsetMs;
  out.early = f.update(1500, true, 2550);
  out.second = f.update(1560, true, 2610);
  // a pause of 700 ms at 2000 on the timeline (a resumed reply): chunks placed after it move
  f = new SpeechFollower(65, 0);
  f.add(1, 'Before.');
  f.add(2, 'After.');
  f.place(1, 1500);
  f.place(2, 2500);
  f.shift(2000, 700);
  out.shifted = f.queue.map((c) => c.startMs);
  // by sound (no visemes): the next chunk after its estimated length, or at a pause
  f = new SpeechFollower(50);
  f.add(1, 'x'.repeat(20));
  f.add(2, 'y'.repeat(20));
  f.add(3, 'z'.repeat(20));
  const steps = [];
  for (let t = 0; t <= 1000; t += 20) steps.push([t, f.update(t, true)]);
  for (let t = 1020; t <= 1600; t += 20) steps.push([t, f.update(t, true)]);
  for (let t = 1620; t <= 1800; t += 20) f.update(t, false); // a pause after half of chunk 2
  out.bySound = steps.filter(([, ids]) => ids.length);
  out.afterPause = f.update(1820, true);
  out.remaining = f.finish();
  out.learnt = f.msPerChar;
  return out;
}
"""


def test_speech_follower_reveals_chunks_when_their_audio_plays(
    server: ServerProcess, quiet: Browser
) -> None:
    with open_page(quiet, server.url) as page:
        out = page.evaluate(FOLLOWER_JS)
    assert out["silent"] == []
    assert out["first"] == [1] and out["offset"] == -100
    assert out["early"] == []  # 2550 - 100 < 2500
    assert out["second"] == [2]
    assert out["shifted"] == [1500, 3200]  # only what starts after the pause moves
    assert out["bySound"] == [[0, [1]], [1000, [2]]]  # 20 chars x 50 ms
    assert out["afterPause"] == [3]
    assert out["remaining"] == []
    assert 25 <= out["learnt"] <= 200


CUT_REPLY_JS = """
async () => {
  const { Conversation } = await import('/static/transcript.js');
  const list = document.createElement('ol');
  document.body.append(list);
  const c = new Conversation(list);
  const shown = (id) => [...list.querySelectorAll(`[data-response-id="${id}"] .chunk`)].map((s) => [
    s.dataset.state, s.querySelector('.heard')?.textContent ?? null,
    s.querySelector('del')?.textContent.trim() ?? null]);
  const out = {};
  // cut in the second chunk: the first was heard, the third never played
  c.responseCreated('resp_a');
  c.chunk('resp_a', 1, 'One two three.');
  c.chunk('resp_a', 2, 'Four five six.');
  c.chunk('resp_a', 3, 'Seven.');
  c.spoken(1);
  c.cut('resp_a', 'One two three. Four', true);
  out.midChunk = shown('resp_a');
  // cancelled before a word was heard: all dropped
  c.responseCreated('resp_b');
  c.chunk('resp_b', 4, 'Eight nine.');
  c.cut('resp_b', '', false);
  out.unheard = shown('resp_b');
  // cut as the second chunk began: it shows no heard word, the first was heard in full
  c.responseCreated('resp_c');
  c.chunk('resp_c', 5, 'Ten.');
  c.chunk('resp_c', 6, 'Eleven twelve.');
  c.cut('resp_c', 'Ten.', true);
  out.atBoundary = shown('resp_c');
  list.remove();
  return out;
}
"""


def test_a_cut_reply_shows_what_the_server_says_was_heard(
    server: ServerProcess, quiet: Browser
) -> None:
    """The page splits a cut reply by the heard transcript of ``response.done``: chunks heard
    in full, the cut one (heard words, the rest struck through), and those never played."""
    with open_page(quiet, server.url) as page:
        out = page.evaluate(CUT_REPLY_JS)
    assert out["midChunk"] == [
        ["spoken", None, None],
        ["truncated", "Four", "five six."],
        ["dropped", None, "Seven."],
    ]
    assert out["unheard"] == [["dropped", None, "Eight nine."]]
    assert out["atBoundary"] == [["spoken", None, None], ["truncated", "", "Eleven twelve."]]
