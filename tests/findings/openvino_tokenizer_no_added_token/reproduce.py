"""openvino-tokenizers 2026.4.1: a byte-level BPE tokenizer without any added token does not
convert ("Incorrect number of inputs passed to BPETokenizer"); the same tokenizer with one added
special token converts, and maps every text to the ids the original gives. Standalone:
tokenizers, transformers and openvino-tokenizers; no import of the conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: the tokenizer without an added token fails to
convert (with merges and without), and with one added token it converts and agrees.
"""

from __future__ import annotations

import sys

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEF"


def tokenizer(merge: bool, added: bool):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {c: i for i, c in enumerate(ALPHABET)}
    merges = []
    if merge:   # one merge of two tokens outside the alphabet: the alphabet's ids unchanged
        vocab.update({"G": 32, "H": 33, "GH": 34})
        merges = [("G", "H")]
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    if added:
        raw.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def convert(hf) -> str | list:
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    try:
        ov_tokenizer = convert_tokenizer(hf)
    except Exception as exc:   # noqa: BLE001  (the converter raises RuntimeError and others)
        return f"{type(exc).__name__}: " + " ".join(str(exc).split())[-160:]
    text = ALPHABET + ALPHABET[::-1]
    return ov.Core().compile_model(ov_tokenizer)([text])["input_ids"].tolist()[0]


def main() -> int:
    from importlib.metadata import version
    print(", ".join(f"{p} {version(p)}" for p in ("openvino-tokenizers", "openvino",
                                                  "transformers", "tokenizers")))
    text = ALPHABET + ALPHABET[::-1]
    failed_without, agrees_with = True, True
    for merge in (False, True):
        for added in (False, True):
            hf = tokenizer(merge, added)
            got = convert(hf)
            ok = isinstance(got, list) and got == hf(text).input_ids
            print(f"merges: {'one' if merge else 'none'}, added token: {'one' if added else 'none'}"
                  f" -> {'converts, ids agree' if ok else got}")
            if added:
                agrees_with &= ok
            else:
                failed_without &= isinstance(got, str)
    reproduced = failed_without and agrees_with
    print("REPRODUCED" if reproduced else "NOT REPRODUCED")
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
