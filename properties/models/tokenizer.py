"""The served models' tokenizer: token id i is the i-th character of ALPHABET.

One character per token, and no merges: every text over the alphabet has exactly one
tokenization, and every id sequence decodes to a text that encodes back to the same ids. So a
server that speaks only text (transformers serve returns text, no ids) still hands the kit its
exact token ids. The characters are ASCII letters: a byte-level BPE maps them to themselves,
no normalizer or whitespace rule of any server touches them, and JSON carries them verbatim.

`tokenizer_files()` builds the Hugging Face files with the `tokenizers` library; `encode` and
`decode` are the same map in plain Python (the kit side needs no tokenizer library).
"""

from __future__ import annotations

import json

from properties.models.served import VOCAB

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEF"
assert len(ALPHABET) == VOCAB == len(set(ALPHABET))
_IDS = {c: i for i, c in enumerate(ALPHABET)}


class TokenizeError(ValueError):
    """A text or id outside the served models' vocabulary."""


def decode(ids) -> str:
    """Token ids -> text."""
    out = []
    for position, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < VOCAB:
            raise TokenizeError(f"token id {token!r} at position {position} is not in the "
                                f"vocabulary 0..{VOCAB - 1}")
        out.append(ALPHABET[token])
    return "".join(out)


def encode(text: str) -> list[int]:
    """Text -> token ids; a character outside the alphabet is an error, never dropped."""
    if not isinstance(text, str):
        raise TokenizeError(f"text must be a str, got {type(text).__name__}")
    try:
        return [_IDS[c] for c in text]
    except KeyError:
        bad = next(i for i, c in enumerate(text) if c not in _IDS)
        raise TokenizeError(f"character {text[bad]!r} at offset {bad} of {text[:80]!r} is no "
                            f"token of the served models (alphabet {ALPHABET!r})") from None


def build():
    """The tokenizer as a `tokenizers.Tokenizer`: byte-level BPE with no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab=dict(_IDS), merges=[]))
    # no regex split and no prefix space: the text is one word of single-byte tokens
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def tokenizer_config() -> dict:
    """tokenizer_config.json: no special tokens added on either side of a text."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
            "clean_up_tokenization_spaces": False, "add_bos_token": False,
            "add_eos_token": False}


def tokenizer_files() -> dict[str, str]:
    """file name -> content of the Hugging Face tokenizer files."""
    return {"tokenizer.json": build().to_str(pretty=True),
            "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2),
            "special_tokens_map.json": json.dumps({}, indent=2)}
