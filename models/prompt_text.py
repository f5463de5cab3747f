"""Chat prompts as text, by a model's own chat template (Jinja, as Hugging Face renders it).

An engine that tokenizes the text itself (llama.cpp) needs no tokenizer here: a prompt's
tokens are a prefix of a longer prompt's when its text is, up to the last token or two, and
the engine reuses whatever prefix its cache holds.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.gguf_meta import read_gguf_metadata
from models.llm import LlmError, Message, open_text, words_open_text


def _raise(message: str) -> None:
    raise LlmError(f"the chat template refused the chat: {message}")


@dataclass(frozen=True)
class ChatText:
    """A chat template with its special tokens; renders chats to prompt text."""

    template: str
    bos_token: str = ""
    eos_token: str = ""
    eos_token_id: int = -1  # the end-of-turn token's id (-1: unknown)

    @classmethod
    def from_gguf(cls, path: Path) -> ChatText:
        """The template and BOS/EOS tokens in a GGUF file's metadata."""
        try:
            meta = read_gguf_metadata(path)
        except (OSError, ValueError) as e:
            raise LlmError(f"cannot read GGUF metadata of {path}: {e}") from e
        template = meta.values.get("tokenizer.chat_template")
        if not isinstance(template, str):
            raise LlmError(f"{path} has no chat template")
        ids = {key: meta.values.get(f"tokenizer.ggml.{key}_token_id") for key in ("bos", "eos")}
        ints = {key: value for key, value in ids.items() if type(value) is int}
        try:
            tokens = meta.strings_at("tokenizer.ggml.tokens", ints.values())
        except (OSError, ValueError) as e:
            raise LlmError(f"cannot read the tokens of {path}: {e}") from e
        bos, eos = (tokens.get(ints[k], "") if k in ints else "" for k in ("bos", "eos"))
        return cls(template, bos, eos, ints.get("eos", -1))

    def render_user_open(self, messages: Sequence[Message]) -> str:
        """Prompt text that ends right after the last (user) message's words, its turn still
        open: the next token says whether the message ends there."""
        return words_open_text(self.render, messages)

    @property
    def calls_tools(self) -> bool:
        """Whether the template writes function calls in the Hermes format (``<tool_call>``)."""
        return "<tool_call>" in self.template

    def _compiled(self) -> Any:
        cached = _COMPILED.get(self.template)
        if cached is None:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = _tojson
            cached = env.from_string(self.template)
            _COMPILED[self.template] = cached
        return cached

    def render(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> str:
        """Prompt text: the chat template with the assistant turn opened; ``tools`` (OpenAI
        Chat-style function tools) listed where the template lists them (None: the first
        message's ``tools``, if it has any; none: the same text as without). An assistant
        message's ``tool_calls`` may give their arguments as JSON text (OpenAI's form) or as
        an object."""
        if tools is None and messages:  # a chat may carry them on its system message
            tools = messages[0].get("tools")
        extra: dict[str, Any] = {"tools": [dict(t) for t in tools]} if tools else {}
        try:
            return str(
                self._compiled().render(
                    messages=[_with_call_objects(m) for m in messages],
                    add_generation_prompt=True,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                    **extra,
                )
            )
        except LlmError:
            raise
        except Exception as e:  # jinja2's errors
            raise LlmError(f"the chat template failed: {type(e).__name__}: {e}") from e

    def render_open(self, messages: Sequence[Message]) -> str:
        """Prompt text of a chat whose last message is still being said
        (:func:`models.llm.open_text`)."""
        return open_text(self.render, messages)


_COMPILED: dict[str, Any] = {}  # template source -> compiled template


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Hugging Face's ``tojson`` (keys in their order, no HTML escapes), not Jinja's: the
    text the model was trained on."""
    return json.dumps(
        value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _with_call_objects(message: Message) -> dict[str, Any]:
    """A copy of ``message`` whose tool calls' arguments are objects (a template writes them
    with ``tojson``; text would come out quoted)."""
    copy = dict(message)
    calls = copy.get("tool_calls")
    if not isinstance(calls, list):
        return copy
    fixed: list[Any] = []
    for call in calls:
        if isinstance(call, Mapping):
            call = dict(call)
            inner = call.get("function")
            target = dict(inner) if isinstance(inner, Mapping) else call
            arguments = target.get("arguments")
            if isinstance(arguments, str):
                with contextlib.suppress(ValueError):  # else written as it is
                    target["arguments"] = json.loads(arguments) if arguments.strip() else {}
            if isinstance(inner, Mapping):
                call["function"] = target
        fixed.append(call)
    copy["tool_calls"] = fixed
    return copy
