"""Log lines never hold a whole session id: without bearer tokens the id is the only credential
of its WHIP resource (``PATCH``/``DELETE /whip/<id>``) and its OpenAI call
(``/v1/realtime/calls/<id>``: ``DELETE``, ``hangup``, ``OPTIONS``, ``GET``), so whoever reads the
access log could hang up a session. Ids in those paths, answered or refused, are cut to their
first 8 characters, the way every other log line names a session."""

from __future__ import annotations

import logging
import re

SHOWN_CHARS = 8
_SESSION_PATH = re.compile(
    rf"(/whip/|/v1/realtime/calls/)([A-Za-z0-9_.~-]{{{SHOWN_CHARS}}})[A-Za-z0-9_.~%-]+"
)


def short_session_ids(text: str) -> str:
    """``text`` with every ``/whip/<id>`` and ``/v1/realtime/calls/<id>`` cut to the id's
    first 8 characters and ``…``."""
    return _SESSION_PATH.sub(r"\1\2…", text)


class ShortSessionIds(logging.Filter):
    """A handler filter that shortens session ids in every record it passes (see the module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        short = short_session_ids(message)
        if short != message:
            record.msg, record.args = short, None
        return True


def install(handlers: list[logging.Handler]) -> None:
    """Shorten session ids in everything these handlers write."""
    for handler in handlers:
        handler.addFilter(ShortSessionIds())
