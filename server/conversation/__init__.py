"""One conversation, apart from its connection: the runtime session, turn detection, partial
transcripts and prefill, the reply loop, the interruption path and lip-sync. It talks to its
transport (server/rtc/peer.py) only through :class:`server.wire.link.Link`."""
