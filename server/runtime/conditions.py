"""Conditions (persona, voice, appearance) and their boundary-aligned updates."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace

from server.errors import InvalidConditionUpdate

log = logging.getLogger(__name__)

MAX_PERSONA_CHARS = 4000
MAX_NAME_CHARS = 64


@dataclass(frozen=True)
class Conditions:
    """What output is made under. ``version`` grows by one with every applied update."""

    persona: str
    voice: str
    appearance: str
    version: int = 0
    presence: str = ""  # what the vision stage says about the user; not client-settable

    def anchor(self) -> str:
        """The system prompt: the persona, plus the user's presence when vision knows it."""
        return f"{self.persona} {self.presence}" if self.presence else self.persona


UPDATABLE = tuple(f.name for f in fields(Conditions) if f.name not in ("version", "presence"))


def validate_update(
    changes: Mapping[str, object], choices: Mapping[str, Collection[str]] | None = None
) -> dict[str, str]:
    """Check a ``session.update`` payload; raise InvalidConditionUpdate naming the bad field.

    ``choices``: the values a field may take, for fields limited to a known set.
    """
    if not changes:
        raise InvalidConditionUpdate("session.update: no field to change")
    clean: dict[str, str] = {}
    for key, value in changes.items():
        if key not in UPDATABLE:
            raise InvalidConditionUpdate(
                f"session.update: unknown field {key[:64]!r} (allowed: {', '.join(UPDATABLE)})"
            )
        if not isinstance(value, str) or not value.strip():
            raise InvalidConditionUpdate(f"session.update: {key} must be a non-empty string")
        limit = MAX_PERSONA_CHARS if key == "persona" else MAX_NAME_CHARS
        if len(value) > limit:
            raise InvalidConditionUpdate(f"session.update: {key} longer than {limit} characters")
        allowed = (choices or {}).get(key)
        if allowed is not None and value not in allowed:
            raise InvalidConditionUpdate(
                f"session.update: unknown {key} {value!r} (available: {', '.join(allowed)})"
            )
        clean[key] = value
    return clean


class ConditionQueue:
    """Holds the conditions in force and the changes waiting for the next chunk boundary.

    Several updates queued before one boundary merge (later fields win) into one version step.
    ``choices``: the values a field may take (see :func:`validate_update`).
    """

    def __init__(
        self, initial: Conditions, choices: Mapping[str, Collection[str]] | None = None
    ) -> None:
        self._current = initial
        self._choices = choices
        self._pending: dict[str, str] = {}

    @property
    def current(self) -> Conditions:
        """Conditions in force for chunks opened now."""
        return self._current

    @property
    def pending(self) -> Mapping[str, str]:
        """Changes waiting for the next boundary."""
        return dict(self._pending)

    def request(self, changes: Mapping[str, object]) -> None:
        """Queue validated changes; an invalid request changes nothing."""
        self._pending.update(validate_update(changes, self._choices))

    def observe(self, presence: str) -> None:
        """The server's own observation (vision): queued like a client's change."""
        if presence != self._current.presence or "presence" in self._pending:
            self._pending["presence"] = presence

    def at_boundary(self) -> Conditions:
        """Apply queued changes (a chunk boundary was reached) and return what is in force."""
        if self._pending:
            old = self._current
            self._current = replace(old, version=old.version + 1, **self._pending)
            log.info(
                "conditions v%d -> v%d at chunk boundary: %s",
                old.version,
                self._current.version,
                ", ".join(sorted(self._pending)),
            )
            self._pending.clear()
        return self._current
