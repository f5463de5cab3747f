"""A tiny random-weight Llama model folder (~1 MB) for fast engine tests.

Byte-level BPE tokenizer trained on a built-in English text (vocab up to 768, ChatML special
tokens and chat template), a 2-layer Llama with hidden size 128 (4 heads of 32) and seeded random
weights saved in bfloat16 (vLLM's CPU default). The output rows of every token that does not
decode to printable ASCII (the special tokens included) are zeroed, so greedy decoding never
stops early and every generated token is a visible text delta. Seeded and deterministic.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SEED = 1234
VOCAB_SIZE = 768
UNK, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MARKER = ".tiny_llama.json"

TEXT = """\
The quick brown fox jumps over the lazy dog. A small model answers short questions about the
weather, the time of day, the names of cities and the colours of things. Paris is the capital
of France. Berlin is the capital of Germany. Rome is the capital of Italy. Madrid is the capital
of Spain. The sun rises in the east and sets in the west. Water boils at one hundred degrees.
Hello, how are you today? I am fine, thank you. What would you like to talk about? Tell me a
story about a cat who lived in a house near the sea. Once upon a time there was a cat. She liked
to sit by the window and watch the boats. Every morning the fisherman waved at her, and every
evening she waited for him to come home. One day a storm came, and the boats did not return.
The cat waited all night. In the morning the sky was clear and the boats came back one by one.
Numbers: one two three four five six seven eight nine ten eleven twelve twenty thirty hundred.
Please speak slowly and clearly. The assistant is helpful, honest and brief. It says what it
knows, and it says when it does not know. Questions and answers, turns and replies, words and
sentences make a conversation. The user talks, the assistant listens, then the assistant talks.
"""

_built: dict[Path, Path] = {}


def _train_tokenizer() -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[UNK, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([line for line in TEXT.splitlines() if line], trainer=trainer)
    return tok


def _save_tokenizer(tok: Tokenizer, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": UNK}) + "\n"
    )


def _printable_ids(tok: Tokenizer) -> list[int]:
    """Ids of the tokens that decode to non-empty printable ASCII."""
    allowed = set(string.ascii_letters + string.digits + string.punctuation + " ")
    specials = {tok.token_to_id(t) for t in (UNK, BOS, EOS)}
    ids = []
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i])
        if i not in specials and text and set(text) <= allowed:
            ids.append(i)
    return ids


def _special_id(tok: Tokenizer, token: str) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise RuntimeError(f"tokenizer lacks {token}")
    return found


def _save_model(tok: Tokenizer, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,  # room for the remote abort tests' long replies
        tie_word_embeddings=False,
        bos_token_id=_special_id(tok, BOS),
        eos_token_id=_special_id(tok, EOS),
        pad_token_id=_special_id(tok, UNK),
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # untyped in transformers
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise RuntimeError(f"unexpected output layer {type(head)}")
    silent = torch.ones(config.vocab_size, dtype=torch.bool)
    silent[_printable_ids(tok)] = False
    with torch.no_grad():
        head.weight.normal_(0.0, 0.5)
        head.weight[silent] = 0.0
    model.bfloat16().save_pretrained(str(out))


def build_tiny_llama(directory: Path) -> Path:
    """Build the tiny model into ``directory`` (once per process and folder); return it."""
    directory = directory.resolve()
    if directory in _built:
        return _built[directory]
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / MARKER).is_file():
        tok = _train_tokenizer()
        _save_tokenizer(tok, directory)
        _save_model(tok, directory)
        (directory / MARKER).write_text(json.dumps({"seed": SEED, "vocab": VOCAB_SIZE}) + "\n")
    _built[directory] = directory
    return directory
