"""One frozen configuration object built from defaults, a TOML file, environment and CLI.

Precedence (later wins): defaults < TOML file (``--config``) < environment variables
(``AVATAR_<SECTION>_<KEY>``) < command-line options. Every value is validated at start; an
invalid one raises :class:`ConfigError` naming the setting (e.g. ``server.port``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from server.errors import ConfigError
from server.eventloop import EVENT_LOOPS

ENV_PREFIX = "AVATAR_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SCHEDULER_POLICIES = ("edf", "round_robin")
ASR_WINDOWS = ("audio", "full")
ASR_MODELS = ("moonshine-tiny", "whisper-tiny.en")
LLM_ENGINES = ("auto", "llamacpp", "vllm")
PRIVATE_CANDIDATES = ("auto", "allow", "drop")
ANONYMOUS_TURN = ("auto", "allow", "deny")
MIN_TOKEN_CHARS = 16  # a bearer token is at least this long


def _setting(default: Any, help: str, **rules: Any) -> Any:
    """A config field with its help text and validation rules (min, max, choices); a
    ``secret=True`` one is left out of the config's repr (``--print-config``, logs)."""
    return field(
        default=default, repr=not rules.get("secret", False), metadata={"help": help, **rules}
    )


@dataclass(frozen=True)
class ServerConfig:
    """Network and process settings."""

    host: str = _setting("127.0.0.1", "Address to bind the HTTP server to.", nonempty=True)
    port: int = _setting(8080, "TCP port of the HTTP server.", min=0, max=65535)
    log_level: str = _setting("INFO", "Log level.", choices=LOG_LEVELS)
    event_loop: str = _setting(
        "asyncio",
        "Event loop: asyncio (asyncio's loop, each ready UDP socket drained: up to 32 "
        "datagrams a wakeup), uvloop (libuv, which drains them too), or asyncio-stock (as "
        "shipped: one datagram per socket per loop iteration, so with tens of sessions a "
        "socket's backlog grows to seconds; for comparison).",
        choices=EVENT_LOOPS,
    )
    web_dir: str = _setting("web", "Folder of the demo page, relative to the project root.")
    debug_endpoints: bool = _setting(
        False, "Serve GET /debug/sessions (per-session figures; for benchmarks, not the public)."
    )
    shutdown_timeout_s: float = _setting(
        5.0, "Seconds a graceful shutdown waits for sessions to close.", min=0.0, max=600.0
    )
    drain_timeout_s: float = _setting(
        0.0,
        "Seconds a SIGTERM lets live sessions finish before the shutdown: meanwhile new "
        "sessions are refused (503) and /healthz answers 503 'draining', so a proxy takes the "
        "host out of rotation. 0: SIGTERM shuts down at once; SIGINT or a second SIGTERM always "
        "does.",
        min=0.0,
        max=86_400.0,
    )
    agent_port: int = _setting(
        0,
        "TCP port of the load-balancer agent (HAProxy's agent-check, on server.host): each "
        "connection reads one line, the share of sessions free as a weight ('up 75%') or "
        "'drain' while draining. 0: no agent.",
        min=0,
        max=65535,
    )
    auth_tokens: tuple[str, ...] = _setting(
        (),
        f"Bearer tokens (>= {MIN_TOKEN_CHARS} characters, comma-separated in env) accepted for "
        "POST /offer, /whip and its resources, GET /ice-servers, /debug; empty: no "
        "authentication (keep the server on localhost).",
        secret=True,
        min_chars=MIN_TOKEN_CHARS,
    )
    cors_origins: tuple[str, ...] = _setting(
        (),
        "Browser origins allowed to call the API (e.g. https://app.example; '*': any); "
        "the server's own origin always is.",
    )
    trusted_proxies: tuple[str, ...] = _setting(
        (),
        "Reverse proxies whose X-Forwarded-For names the client (rate limits, per-client "
        "limits, the ICE candidate filter): IP addresses or CIDR ranges (10.0.0.0/8), not "
        "host names. The client is the right-most address in the header that none of them "
        "wrote.",
    )
    workers: int = _setting(
        1,
        "Worker processes; above 1 a supervisor routes signaling to them (sessions per worker).",
        min=1,
        max=64,
    )
    session_id_prefix: str = _setting(
        "",
        "Prefix of session ids (URL-safe characters); the supervisor gives worker k 'wk-'.",
        pattern=r"[A-Za-z0-9_.~-]*",
    )
    allowed_hosts: tuple[str, ...] = _setting(
        (),
        "Host names the server answers to besides localhost, IP addresses and the bound name "
        "(e.g. avatar.example; '*': any); a request for another Host gets 421 (DNS rebinding).",
    )
    worker_key: str = _setting(
        "",
        "Key a worker requires of every request (set by the supervisor in the environment of "
        "its workers; empty: none).",
        secret=True,
    )

    def __post_init__(self) -> None:
        for entry in self.trusted_proxies:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ConfigError(
                    f"server.trusted_proxies: {entry!r} is neither an IP address nor a CIDR "
                    "range (e.g. 172.18.0.0/16); name the proxy by its address"
                ) from None
        if self.agent_port and self.agent_port == self.port:
            raise ConfigError(
                f"server.agent_port: {self.agent_port} is server.port too; the agent needs a "
                "port of its own"
            )
        if self.agent_port and self.workers > 1:
            raise ConfigError(
                "server.agent_port: the load-balancer agent is for single-process hosts "
                "(server.workers 1); the supervisor of several workers routes them itself"
            )


@dataclass(frozen=True)
class RuntimeConfig:
    """Per-session runtime settings."""

    lookahead_budget_ms: int = _setting(
        2000, "Most output (ms) generated ahead of the playback cursor.", min=100, max=60_000
    )
    fade_ms: float = _setting(
        5.0, "Fade (ms) of audio flushed on barge-in, paused or resumed.", min=0.0, max=20.0
    )
    recent_window_tokens: int = _setting(
        1024,
        "Token budget of the recent-turns window in the model context (when full, it keeps the "
        "latest half and grows again).",
        min=0,
        max=1_000_000,
    )
    max_history_turns: int = _setting(
        64, "Turns kept in a session's history (older ones are forgotten).", min=1, max=100_000
    )
    persona: str = _setting(
        "You are a friendly voice assistant. Everything you write is spoken aloud, so answer in"
        " one or two short sentences of plain conversational English. Never use lists,"
        " headings, code or markdown. Write numbers as words, like twenty-five instead of 25."
        " For a how-to question, give the main steps in one sentence.",
        "Default persona (system prompt, the pinned anchor of the context).",
        nonempty=True,
    )
    voice: str = _setting("joe", "Default TTS voice.", nonempty=True)
    appearance: str = _setting("default", "Default avatar appearance.", nonempty=True)
    user_speaking_timeout_ms: int = _setting(
        120_000,
        "Longest user turn (ms): then it ends as if the user paused (and the reply starts).",
        min=1000,
        max=600_000,
    )
    thinking_timeout_ms: int = _setting(
        20_000,
        "Longest wait (ms) from the end of the user's turn to the reply's first audio, whatever "
        "the stage (transcript, first token, speech); then the turn ends with a timeout error.",
        min=100,
        max=600_000,
    )
    tool_output_timeout_ms: int = _setting(
        20_000,
        "Longest wait (ms) for the output of a function call the agent made (the client runs "
        "the tool); then the agent says it got no answer. An interruption cancels the wait.",
        min=100,
        max=600_000,
    )
    paused_timeout_ms: int = _setting(
        2_000,
        "Longest pause of a reply while voice over it is judged (ms): then it is an "
        "interruption if speech was confirmed, else the reply resumes.",
        min=200,
        max=60_000,
    )
    agent_speaking_timeout_ms: int = _setting(
        180_000,
        "Longest reply (ms from its first audio), stalls included; then it is stopped with a "
        "timeout error.",
        min=1000,
        max=3_600_000,
    )


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of the deadline scheduler shared by all sessions."""

    policy: str = _setting("edf", "Scheduling policy.", choices=SCHEDULER_POLICIES)
    first_audio_target_ms: float = _setting(
        500.0,
        "Deadline (ms after end of turn) for a response's first audio.",
        min=0.0,
        max=60_000.0,
    )
    max_wait_ms: float = _setting(
        10_000.0,
        "Aging bound (ms): a runnable item waiting this long runs next, whatever else waits.",
        min=1.0,
        max=600_000.0,
    )


@dataclass(frozen=True)
class TransportConfig:
    """WebRTC peers, signaling limits and outbound media."""

    max_sessions: int = _setting(4, "Concurrent sessions; more get 503.", min=1, max=10_000)
    retry_after_s: int = _setting(5, "Retry-After (s) sent with a 503.", min=1, max=3600)
    max_body_bytes: int = _setting(
        65_536, "Largest accepted signaling body (bytes); larger gets 413.", min=1024, max=1 << 24
    )
    max_event_bytes: int = _setting(
        16_384, "Largest accepted data-channel message (bytes).", min=256, max=1 << 20
    )
    connect_timeout_s: float = _setting(
        20.0, "A peer that does not connect within this many seconds is closed.", min=1.0, max=600.0
    )
    ice_connect_timeout_s: float = _setting(
        8.0,
        "A peer whose ICE has not connected within this many seconds is closed (its slot is "
        "free again); at most connect_timeout_s.",
        min=1.0,
        max=600.0,
    )
    max_sessions_per_client: int = _setting(
        0,
        "Live sessions one client may hold: per client address (an IPv6 /64 is one) and, with "
        "several auth_tokens, per token; more get 429. 0: half of max_sessions (at least 1), "
        "loopback clients exempt.",
        min=0,
        max=10_000,
    )
    max_sdp_lines: int = _setting(
        1000, "Most lines in an SDP offer or fragment; more gets 413.", min=50, max=100_000
    )
    session_rate_per_min: float = _setting(
        60.0,
        "Sessions one client address may create per minute (token bucket refill); 0: no limit.",
        min=0.0,
        max=1_000_000.0,
    )
    session_burst: int = _setting(
        20, "Sessions one client address may create at once (token bucket size).", min=1, max=10_000
    )
    dead_peer_timeout_s: float = _setting(
        10.0,
        "A connected peer whose audio stops for this many seconds is closed (a vanished client).",
        min=0.5,
        max=3600.0,
    )
    stale_peer_s: float = _setting(
        1.0,
        "When the server is full, a connected peer whose audio stopped this many seconds ago "
        "is let go (its conversation waits for a resume) to admit a new session.",
        min=0.2,
        max=3600.0,
    )
    max_remote_candidates: int = _setting(
        32,
        "Distinct remote ICE candidates one session may give (offer and trickle PATCHes "
        "together); more get 422.",
        min=1,
        max=1000,
    )
    patch_rate_per_min: float = _setting(
        60.0,
        "Trickle PATCHes one session may send per minute (token bucket refill); 0: no limit.",
        min=0.0,
        max=1_000_000.0,
    )
    patch_burst: int = _setting(
        30, "Trickle PATCHes one session may send at once (token bucket size).", min=1, max=10_000
    )
    max_media_packets_per_s: float = _setting(
        100.0,
        "Inbound audio (RTP) packets one session may send a second (token bucket refill); more "
        "are dropped before they are decoded and counted in avatar_session_rate_limited_total"
        '{kind="media"}. A WebRTC sender sends 50 (20 ms packets), 100 at 10 ms. The audio '
        "they make heard, with the lost time filled between them, is held to 1.5 s a second "
        "beyond a burst of max_media_gap_ms + 2 s. 0: no limit.",
        min=0.0,
        max=100_000.0,
    )
    media_packets_burst: int = _setting(
        100,
        "Inbound audio packets one session may send at once (token bucket size): 2 s of 20 ms "
        "packets arriving together after a network stall.",
        min=1,
        max=100_000,
    )
    max_media_gap_ms: int = _setting(
        1000,
        "Longest jump (ms) in the microphone's RTP timestamps that is filled (concealment, "
        "silence) to keep the sender's timeline; a longer one (a sender that stopped) or one "
        "back in time is a discontinuity: the timeline is joined, nothing filled. A gap the "
        "audio budget (max_media_packets_per_s) has no room for is joined too, and counted "
        '(kind="jump").',
        min=0,
        max=1000,
    )
    private_candidates: str = _setting(
        "auto",
        "Remote ICE candidates at loopback, link-local or other non-global addresses and mDNS "
        "names: 'allow', 'drop' (never contacted), or 'auto': drop those more local than the "
        "client's own address.",
        choices=PRIVATE_CANDIDATES,
    )
    ice_urls: tuple[str, ...] = _setting(
        (),
        "STUN/TURN server URLs (comma-separated in env); none by default.",
        prefix=("stun:", "turn:", "turns:"),
    )
    ice_username: str = _setting("", "TURN username (static credentials).")
    ice_credential: str = _setting("", "TURN credential (static credentials).", secret=True)
    ice_auth_secret: str = _setting(
        "",
        "Shared secret of the TURN server's REST API (coturn --static-auth-secret): TURN "
        "credentials are then issued per client and expire; instead of ice_username/credential.",
        secret=True,
    )
    ice_credential_ttl_s: int = _setting(
        14_400,
        "Lifetime (s) of issued TURN credentials; a session must end within it (sessions have "
        "no maximum length: a longer call loses its relay and must resume).",
        min=60,
        max=7 * 86_400,
    )
    ice_anonymous_turn: str = _setting(
        "auto",
        "TURN credentials (GET /ice-servers, WHIP Link headers) for callers without a bearer "
        "token, i.e. when server.auth_tokens is empty: 'allow', 'deny' (GET /ice-servers "
        "answers 403, Link headers name no TURN server), or 'auto': allow only while "
        "server.host is a loopback address.",
        choices=ANONYMOUS_TURN,
    )
    ice_host_addresses: tuple[str, ...] = _setting(
        (), "Host addresses offered as ICE candidates (empty: every interface but 127.0.0.1)."
    )
    video: bool = _setting(True, "Send a video track.")
    video_width: int = _setting(512, "Outbound avatar video width (px).", min=128, max=4096)
    video_height: int = _setting(512, "Outbound avatar video height (px).", min=128, max=4096)
    video_fps: int = _setting(25, "Outbound video frame rate.", min=1, max=60)

    def __post_init__(self) -> None:
        if self.ice_auth_secret and (self.ice_username or self.ice_credential):
            raise ConfigError(
                "transport.ice_auth_secret: issued TURN credentials replace the static ones; "
                "set ice_auth_secret or ice_username/ice_credential, not both"
            )


@dataclass(frozen=True)
class VadConfig:
    """Voice activity and turn detection on 16 kHz input."""

    aggressiveness: int = _setting(
        2, "webrtcvad aggressiveness (0-3), the first gate.", min=0, max=3
    )
    silero_threshold: float = _setting(
        0.5, "Silero speech probability that confirms the gate.", min=0.0, max=1.0
    )
    speech_start_ms: int = _setting(
        60, "Confirmed voiced audio (ms) that makes a speech start.", min=20, max=1000
    )
    end_of_turn_ms: int = _setting(
        600, "Silence (ms) after speech that ends the user's turn.", min=100, max=10_000
    )
    semantic: bool = _setting(
        True,
        "Judge whether the user's utterance sounds complete (Smart Turn v3.2) and end the turn "
        "after complete_silence_ms when it does, incomplete_silence_ms when not (off: "
        "end_of_turn_ms always).",
    )
    complete_probability: float = _setting(
        0.9,
        "The end-of-turn model's probability (0-1) above which an utterance sounds complete.",
        min=0.0,
        max=1.0,
    )
    complete_silence_ms: int = _setting(
        160, "Silence (ms) that ends a turn that sounds complete.", min=40, max=10_000
    )
    incomplete_silence_ms: int = _setting(
        1200,
        "Silence (ms) that ends a turn that sounds unfinished (a pause mid-sentence).",
        min=100,
        max=10_000,
    )
    unfinished_words: bool = _setting(
        True,
        "With a semantic end of turn and partial transcripts, a turn that sounds complete also "
        "waits for the partial transcript of the pause; English words that stop mid-sentence "
        "('... go to', '... and') keep it open for incomplete_silence_ms.",
    )
    sentence_end: bool = _setting(
        True,
        "With unfinished_words and an LLM that can tell (llama.cpp), the words at a pause are "
        "judged by the LLM: the probability that a sentence-final mark follows them, their own "
        "mark taken away. That verdict decides in place of the list of words that end no "
        "sentence.",
    )
    sentence_end_probability: float = _setting(
        0.2,
        "The LLM's sentence-end probability (0-1) at or above which a turn ends after "
        "complete_silence_ms even where the end-of-turn model heard it unfinished.",
        min=0.0,
        max=1.0,
    )
    sentence_end_with_model: float = _setting(
        0.05,
        "The LLM's sentence-end probability (0-1) at or above which a turn the end-of-turn "
        "model called complete ends after complete_silence_ms (below it, the turn waits "
        "incomplete_silence_ms).",
        min=0.0,
        max=1.0,
    )
    stranded_word_probability: float = _setting(
        0.02,
        "With unfinished_words, the recogniser's probability (0-1) that the last word at a "
        "pause was one that ends no sentence ('the', 'and', 'my', ...), from the words it "
        "weighed in its place, at or above which the turn waits incomplete_silence_ms whatever "
        "else says it is complete: at a pause mid-sentence Whisper often hears such a word as "
        "one that finishes the sentence ('the' as 'that', 'and' as 'end'). 0 turns this off.",
        min=0.0,
        max=1.0,
    )
    onset_ms: int = _setting(
        20,
        "Audio (ms) the gate alone calls voice that pauses a reply at once, before the "
        "confirming model and the interjection judge decide (20: the first voiced frame; the "
        "echo benchmark's self-interruptions and echo pauses were 0 at 20 and at 40; "
        "BENCHMARKS.md has barge-in as a client hears it).",
        min=20,
        max=1000,
    )
    echo_cancellation: bool = _setting(
        True,
        "Take the avatar's own voice out of the microphone audio before voice detection and "
        "recognition (WebRTC AEC3 fed with the audio sent to the client, and a residual echo "
        "gate), for clients without echo cancellation: speakers with a game engine, GStreamer, "
        "a native app, a browser with its AEC off.",
    )
    pause_first: bool = _setting(
        True,
        "Voice over a reply pauses it first; it is stopped only when judged an interruption "
        "(off: confirmed speech stops it at once).",
    )
    interruption_ms: int = _setting(
        600,
        "Speech over a paused reply (ms from its onset) whose words so far are judged while it "
        "goes on: any word that is not a backchannel interrupts at once.",
        min=100,
        max=5000,
    )
    interjection_quiet_ms: int = _setting(
        160,
        "Quiet (ms) after speech over a paused reply before its words are judged.",
        min=40,
        max=2000,
    )


@dataclass(frozen=True)
class PipelineConfig:
    """What answers the user: a factory ``module:function`` returning a TurnPipeline."""

    factory: str = _setting(
        "server.pipeline.wiring:voice_pipeline",
        "Import path (module:function) of the reply pipeline; empty: listen only (no replies).",
    )
    llm_engine: str = _setting(
        "auto",
        "The in-process LLM engine: 'llamacpp' (llama.cpp on a GGUF file), 'vllm' (a Hugging"
        " Face folder), 'auto' (vLLM where the GPU build of vLLM is installed, else llama.cpp).",
        choices=LLM_ENGINES,
    )
    llm_model: str = _setting(
        "",
        "Local model: a GGUF file (llama.cpp), an embedded model's name (qwen2.5-coder-0.5b,"
        " qwen2.5-coder-1.5b, smollm2-135m) or a Hugging Face folder (vLLM); empty: the"
        " calibration picks from pipeline.llm_ladder (llama.cpp), or SmolLM2-135M's folder"
        " (vLLM).",
    )
    llm_ladder: tuple[str, ...] = _setting(
        ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"),
        "The models the calibration picks from where pipeline.llm_model is empty, smallest"
        " first (embedded names or GGUF files; comma-separated in env): the largest whose"
        " predicted reply meets pipeline.latency_budget_ms, else the smallest that loads.",
        nonempty=True,
        distinct=True,
    )
    latency_budget_ms: int = _setting(
        1000,
        "The longest predicted reply (ms, the end of the user's speech to the first reply"
        " audio at the client) a model of pipeline.llm_ladder may take to be picked.",
        min=100,
        max=60_000,
    )
    llm_slots: int = _setting(
        0,
        "llama.cpp: sessions whose KV cache it keeps at once, decoded together (0: as many as"
        " transport.max_sessions, at least 2).",
        min=0,
        max=256,
    )
    llm_remote_urls: tuple[str, ...] = _setting(
        (),
        "Base URLs of remote vLLM OpenAI-compatible servers, replicas of one model (comma-"
        "separated in env); empty: in-process engine.",
        prefix=("http://", "https://"),
    )
    llm_remote_model: str = _setting("", "Model name to ask the remote servers for.")
    llm_remote_api_key: str = _setting(
        "", "API key of the remote servers (vLLM --api-key).", secret=True
    )
    llm_remote_connect_timeout_s: float = _setting(
        2.0, "Seconds to connect to a remote replica.", min=0.1, max=60.0
    )
    llm_remote_first_token_timeout_s: float = _setting(
        10.0,
        "Seconds a replica may take to its first token before the next replica is tried.",
        min=0.1,
        max=600.0,
    )
    llm_remote_read_timeout_s: float = _setting(
        30.0, "Longest silence (s) in a remote reply's stream; then it fails.", min=0.1, max=600.0
    )
    llm_max_tokens: int = _setting(60, "Most tokens in one reply.", min=1, max=4096)
    llm_kv_cache_gib: float = _setting(
        1.0, "KV cache of the in-process engine on CPU (GiB).", min=0.1, max=512.0
    )
    asr_threads: int = _setting(
        0, "CPU threads of the speech recogniser (0: as the CPU plan says).", min=0, max=64
    )
    asr_model: str = _setting(
        "moonshine-tiny",
        "The speech recogniser: 'moonshine-tiny' (onnxruntime; half Whisper's call time in the"
        " slow profile; clips up to 1 s and the hearing of interjections still go to Whisper,"
        " which can tell a cough from a word) or 'whisper-tiny.en' (CTranslate2, int8).",
        choices=ASR_MODELS,
    )
    asr_cross_check: bool = _setting(
        True,
        "With moonshine-tiny: a final transcript is heard by Whisper too and, where their words"
        " differ, the text both models find likelier is kept (about 2x the final transcript's"
        " cost; espeak-ng's voice 17 % -> 8 % word errors). Unless set, the calibration turns it"
        " off where a checked final transcript of a 3 s question takes over 250 ms.",
    )
    asr_window: str = _setting(
        "audio",
        "Whisper's encoder input: 'audio' (the utterance and 1 s of silence: a call costs in"
        " proportion to the speech) or 'full' (30 s every call: a little more accurate).",
        choices=ASR_WINDOWS,
    )
    tts_threads: int = _setting(
        0, "CPU threads of the speech synthesiser (0: as the CPU plan says).", min=0, max=64
    )
    engine_nice: int = _setting(
        5,
        "Lower the engines' threads (ASR, LLM, TTS) by this nice value, so that the event loop"
        " and the media workers get a core first (0: the same priority).",
        min=0,
        max=19,
    )
    confine_to_quota: bool = _setting(
        True,
        "Under a CFS CPU quota of fewer CPUs than the cores (docker --cpus, a Kubernetes limit),"
        " run every thread on ceil(quota) cores, where the event loop's priority over the"
        " engines holds (spread over every core, an engine spends the quota's pool while the"
        " loop waits for the next period).",
    )
    incremental: bool = _setting(
        True, "Partial transcripts and prefix-cache prefill while the user speaks."
    )
    partial_interval_ms: int = _setting(
        300,
        "Interval (ms) between partial transcripts of the growing utterance.",
        min=50,
        max=10_000,
    )
    early_reply: bool = _setting(
        True,
        "Begin the reply at a pause where the turn waits on (its words end a sentence, heard as"
        " unfinished or a fixed silence):"
        " played at once if the turn ends on the same words, else dropped unheard.",
    )
    first_chunk_words: int = _setting(
        6, "Cut a reply's first chunk after this many words if no clause has ended.", min=1, max=100
    )
    stage_timeout_s: float = _setting(
        20.0,
        "An engine call (transcript, next reply text, speech) over this many s fails the reply.",
        min=0.1,
        max=3600.0,
    )


@dataclass(frozen=True)
class VisionConfig:
    """The camera: sampled frames -> face detection -> presence, gaze and a persona note."""

    enabled: bool = _setting(True, "Analyse the client's camera frames when it sends video.")
    sample_fps: float = _setting(2.0, "Camera frames analysed per second.", min=0.1, max=30.0)
    present_after_ms: float = _setting(
        300.0, "A face seen this long (ms) makes the user present.", min=0.0, max=60_000.0
    )
    away_after_ms: float = _setting(
        3000.0, "No face for this long (ms) makes the user away.", min=100.0, max=600_000.0
    )
    smoothing_ms: float = _setting(
        150.0, "Time constant (ms) of the face-position filter.", min=0.0, max=10_000.0
    )
    max_side: int = _setting(
        320, "Frames are shrunk to at most this many pixels a side.", min=64, max=4096
    )


@dataclass(frozen=True)
class AvatarConfig:
    """The avatar's face beyond lip-sync."""

    builtin_tools: bool = _setting(
        False,
        "The avatar's own actions (expression, appearance, look at the user) as tools its "
        "replies may call; the server runs them itself, beside the client's tools.",
    )


@dataclass(frozen=True)
class SessionConfig:
    """A conversation beyond one connection."""

    resume_window_s: float = _setting(
        30.0,
        "Seconds a conversation waits for its client to resume it (a new offer with its resume "
        "token) after the connection is lost; 0 ends it with the connection.",
        min=0.0,
        max=3600.0,
    )
    max_detached: int = _setting(
        64,
        "Conversations waiting for a resume (they do not count against max_sessions); past "
        "this the oldest ends (its token then gets 410).",
        min=0,
        max=100_000,
    )
    max_detached_per_client: int = _setting(
        4,
        "Conversations one client address may have waiting for a resume; past this its oldest "
        "ends.",
        min=0,
        max=100_000,
    )
    max_detached_mb: float = _setting(
        256.0,
        "Memory (MB, estimated) the conversations waiting for a resume may hold together; past "
        "this the oldest ends.",
        min=0.0,
        max=1_000_000.0,
    )
    max_events_per_s: float = _setting(
        20.0,
        "Client events (data-channel messages, valid or not) one session may send a second "
        "(token bucket refill); past it they are dropped unanswered, but for one 'rate_limited' "
        "error until the bucket is full again, and counted in "
        'avatar_session_rate_limited_total{kind="events"}. A client sends a few a second '
        "(typed text, response.cancel, playback.ack 4 a second). 0: no limit.",
        min=0.0,
        max=100_000.0,
    )
    events_burst: int = _setting(
        50,
        "Client events one session may send at once (token bucket size).",
        min=1,
        max=100_000,
    )
    flood_s: float = _setting(
        3.0,
        "A session that sends more than 10x max_events_per_s events, or 10x "
        "transport.max_media_packets_per_s audio packets, in each of this many seconds in a row "
        "is ended (as one that leaves its events unread); 0: never.",
        min=0.0,
        max=3600.0,
    )


@dataclass(frozen=True)
class Config:
    """The whole configuration; immutable once built."""

    server: ServerConfig = field(default_factory=ServerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    avatar: AvatarConfig = field(default_factory=AvatarConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    # the dotted names the operator set (file, environment, --set); the calibration chooses
    # the others that follow the machine (server/pipeline/calibration.py)
    explicit: frozenset[str] = frozenset()


def _sections() -> dict[str, type[Any]]:
    hints = get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if f.name != "explicit"}


def _field_names(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def describe() -> list[tuple[str, str, Any, str]]:
    """Every setting as ``(dotted name, env var, default, help)``, for docs and ``--help``."""
    rows = []
    for section, cls in _sections().items():
        for f in dataclasses.fields(cls):
            env = f"{ENV_PREFIX}{section}_{f.name}".upper()
            rows.append((f"{section}.{f.name}", env, f.default, f.metadata["help"]))
    return rows


def secret_settings() -> dict[str, str]:
    """The secret settings (tokens, credentials, keys): dotted name -> environment variable."""
    return {
        f"{section}.{f.name}": f"{ENV_PREFIX}{section}_{f.name}".upper()
        for section, cls in _sections().items()
        for f in dataclasses.fields(cls)
        if f.metadata.get("secret", False)
    }


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, kind: type[Any], raw: Any, from_text: bool) -> Any:
    """Turn ``raw`` into ``kind`` or raise ConfigError naming ``name``."""
    if kind == tuple[str, ...]:
        if from_text and isinstance(raw, str):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if isinstance(raw, list | tuple) and all(isinstance(x, str) for x in raw):
            return tuple(raw)
        raise ConfigError(f"{name}: expected a list of strings, got {raw!r}")
    if from_text and isinstance(raw, str):
        text = raw.strip()
        try:
            if kind is bool:
                if text.lower() in _TRUE:
                    return True
                if text.lower() in _FALSE:
                    return False
                raise ValueError
            if kind is int:
                return int(text)
            if kind is float:
                return float(text)
        except ValueError:
            raise ConfigError(f"{name}: expected {kind.__name__}, got {raw!r}") from None
        return raw
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if not isinstance(raw, kind) or (kind is not bool and isinstance(raw, bool)):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {type(raw).__name__} {raw!r}")
    return raw


def _validate(name: str, value: Any, meta: Mapping[str, Any]) -> None:
    if "min" in meta and value < meta["min"]:
        raise ConfigError(f"{name}: must be >= {meta['min']}, got {value!r}")
    if "max" in meta and value > meta["max"]:
        raise ConfigError(f"{name}: must be <= {meta['max']}, got {value!r}")
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{name}: must be one of {', '.join(meta['choices'])}; got {value!r}")
    if meta.get("nonempty") and not (value if isinstance(value, tuple) else str(value).strip()):
        raise ConfigError(f"{name}: must not be empty")
    if meta.get("distinct") and len(set(value)) != len(value):
        raise ConfigError(f"{name}: names an entry twice: {', '.join(value)}")
    if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
        raise ConfigError(f"{name}: must match {meta['pattern']}, got {value!r}")
    if "min_chars" in meta:
        for entry in value:
            if len(entry) < meta["min_chars"] or any(ch.isspace() for ch in entry):
                raise ConfigError(
                    f"{name}: every entry needs >= {meta['min_chars']} characters, no spaces"
                )
    if "prefix" in meta:
        for entry in value:
            if not entry.startswith(meta["prefix"]):
                raise ConfigError(
                    f"{name}: {entry!r} must start with {' or '.join(meta['prefix'])}"
                )


def _read_toml(path: Path) -> dict[str, dict[str, Any]]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    sections = _sections()
    for key, value in data.items():
        if key not in sections:
            raise ConfigError(f"config file {path}: unknown section [{key}]")
        if not isinstance(value, dict):
            raise ConfigError(f"config file {path}: [{key}] must be a table")
    return data


def _env_values(env: Mapping[str, str]) -> dict[str, str]:
    """Map ``AVATAR_SECTION_KEY`` variables to dotted names; unknown ones are an error."""
    by_env = {env_name: dotted for dotted, env_name, _, _ in describe()}
    out: dict[str, str] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        if key not in by_env:
            raise ConfigError(f"environment variable {key}: unknown setting")
        out[by_env[key]] = value
    return out


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the config: defaults < TOML ``path`` < ``env`` < ``overrides`` (dotted names).

    String values from the environment or from ``overrides`` are parsed to the field type.
    Raises ConfigError naming the first invalid setting; nothing is partially applied.
    """
    layers: list[tuple[dict[str, Any], bool]] = []
    if path is not None:
        flat = {
            f"{section}.{key}": value
            for section, table in _read_toml(path).items()
            for key, value in table.items()
        }
        layers.append((flat, False))
    layers.append((_env_values(env or {}), True))
    layers.append((dict(overrides or {}), True))

    sections = _sections()
    built: dict[str, Any] = {}
    for section, cls in sections.items():
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        known = {f.name: f for f in dataclasses.fields(cls)}
        for layer, from_text in layers:
            for dotted, raw in layer.items():
                sec, _, key = dotted.partition(".")
                if sec not in sections or key not in _field_names(sections[sec]):
                    raise ConfigError(f"{dotted}: unknown setting")
                if sec != section:
                    continue
                values[key] = _coerce(dotted, hints[key], raw, from_text)
        for key, f in known.items():
            value = values.get(key, f.default)
            _validate(f"{section}.{key}", value, f.metadata)
        built[section] = cls(**values)
    explicit = frozenset(dotted for layer, _ in layers for dotted in layer)
    return Config(**built, explicit=explicit)
