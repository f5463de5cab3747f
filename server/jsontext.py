"""JSON from clients, parsed within limits: one nesting limit for every body and event.

Python's parser recurses once per level, so a few thousand ``[`` raise RecursionError (and
a traceback) before any check on the result could run. Here the nesting is measured on the
text first, without recursion, and refused past MAX_DEPTH. An object that names a key twice
is refused too: parsers disagree on which one counts (HAProxy's ``json_query`` reads the
first ``resume_token``, Python's the last), so a proxy and this server would act on
different values.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32  # nesting levels of arrays and objects in one body or event
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)  # a JSON string, escapes included
_BRACKET = re.compile(r"[\[\]{}]")


class JsonRefused(ValueError):
    """The text is not JSON this server takes; the message says why (for the client)."""


def _nesting_exceeds(text: str, limit: int) -> bool:
    """Whether ``text`` opens more than ``limit`` arrays or objects inside each other
    (brackets inside strings do not count)."""
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict; JsonRefused when a key comes twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise JsonRefused(f"the key {key[:64]!r} appears twice in one object")
        seen.add(key)
    return dict(pairs)


def load_json(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """``text`` parsed; JsonRefused when it is not JSON, nests deeper than ``max_depth`` or
    repeats a key in an object."""
    if _nesting_exceeds(text, max_depth):
        raise JsonRefused(f"JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except JsonRefused:
        raise
    except (ValueError, RecursionError):
        raise JsonRefused("not valid JSON") from None
