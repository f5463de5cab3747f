"""Questions where a wrong answer can hurt someone: first aid, medicines, electricity, fire
and gas, poisons and household chemicals.

The small models a CPU affords answer such questions as readily as any other, and often
wrongly: asked whether bleach and ammonia make a stronger cleaner, or how many paracetamol
tablets to take at once, they said yes, or a number (benchmarks/data/questions.json, the
"safety" split). Where the user's words name such a hazard, the reply's prompt gets one more
system message after them (:func:`with_safety_note`): give safe advice only, say no when in
doubt, and send the user to emergency services or a professional. Only a model that follows
such a note gets it (``TakesSafetyNote``: Qwen2.5-Coder-1.5B, then 21 of 23 safe answers
against 10); the 0.5B and SmolLM2 read it aloud instead ("The user's question is about
health or safety..."), so they are asked as before. It is a cue to the model,
not a filter: it changes what the model is asked, and only for those turns, so the rest of the
conversation's prompt (and its cache) stays as it was.

The words are a fixed list of hazards by topic (whole words, any case), not a model: it misses
what it does not name, and a question that only mentions a hazard ("a fire in the fireplace
tonight") gets the note too, which costs some caution, not an answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from server.pipeline.engines import Message

SAFETY_NOTE = (
    "The user's question is about health or safety. Give only advice that is safe and"
    " certain; if you are not sure, say no. Tell them to call emergency services in an"
    " emergency, or to ask a doctor, a pharmacist or an electrician."
)

# words (regular expressions, matched whole and in any case) by topic
HAZARDS: dict[str, tuple[str, ...]] = {
    "medicine": (
        r"pills?",
        r"tablets?",
        r"doses?",
        r"dosage",
        r"overdos\w*",
        r"medicines?",
        r"medications?",
        r"paracetamol",
        r"acetaminophen",
        r"ibuprofen",
        r"aspirin",
        r"antibiotics?",
        r"insulin",
        r"painkillers?",
        r"prescriptions?",
    ),
    "first aid": (
        r"burn(?:s|ed|t|ing)?",
        r"scald(?:s|ed)?",
        r"bleed(?:s|ing)?",
        r"nosebleeds?",
        r"chok(?:e|es|ed|ing)",
        r"unconscious",
        r"faint(?:ed|ing)?",
        r"heart attack",
        r"stroke",
        r"seizures?",
        r"can'?t breathe",
        r"not breathing",
        r"cpr",
        r"fractur\w*",
        r"concussion",
        r"bit(?:e|ten)",
        r"stung",
        r"allergic",
        r"fever",
        r"frostbit\w*",
        r"hypotherm\w*",
        r"heatstroke",
        r"swallow(?:ed)?",
        r"throw up",
        r"vomit\w*",
    ),
    "electricity": (
        r"electric\w*",
        r"live wires?",
        r"wiring",
        r"sockets?",
        r"outlets?",
        r"shock(?:s|ed)?",
        r"fuse(?:s| box)?",
        r"circuit breakers?",
        r"voltage",
        r"power lines?",
    ),
    "fire and gas": (
        r"fires?",
        r"flames?",
        r"smoke",
        r"carbon monoxide",
        r"gas leak",
        r"smell(?:s)? (?:of )?gas",
        r"extinguisher",
    ),
    "poisons": (
        r"bleach",
        r"ammonia",
        r"detergent",
        r"chemicals?",
        r"toxic",
        r"poison\w*",
        r"pesticides?",
        r"drain cleaner",
        r"antifreeze",
        r"button batter(?:y|ies)",
        r"(?:wild )?mushrooms?",
    ),
}
_PATTERN = re.compile(
    r"\b(?:" + "|".join(word for words in HAZARDS.values() for word in words) + r")\b",
    re.IGNORECASE,
)


def names_a_hazard(words: str) -> bool:
    """Whether ``words`` (a user's turn) name a hazard of :data:`HAZARDS`."""
    return _PATTERN.search(words) is not None


def with_safety_note(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with :data:`SAFETY_NOTE` as a system message after the last one, where
    that is the user's and names a hazard; else the same messages."""
    out = list(messages)
    if out and out[-1].get("role") == "user" and names_a_hazard(str(out[-1].get("content"))):
        out.append({"role": "system", "content": SAFETY_NOTE})
    return out
