"""The training text of the trained models: the Python standard library's own sources.

Every Python install carries them, so training needs no network. Files are chosen
deterministically (sorted relative paths under `sysconfig`'s stdlib directory, tests and
machine-generated tables left out) and split by a hash of the path, so the held-out files are
the same on every machine that has the same Python; a different patch release changes a few
files, which moves the losses a little, not the recipe (the manifest records what was used).
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

# Directories that are tests, vendored third-party code or generated tables (encodings' charmap
# tables and the like teach a model nothing about text).
EXCLUDED_PARTS = {"test", "tests", "idle_test", "site-packages", "encodings", "__pycache__",
                  "lib2to3", "ensurepip", "turtledemo", "__phello__"}
HELD_OUT_EVERY = 10          # one file in ten (by path hash) is held out
EOT = "<|endoftext|>"        # the separator between files, token id 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative: str) -> bool:
    digest = hashlib.sha256(relative.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELD_OUT_EVERY == 0


def corpus_files(root: Path | None = None) -> list[str]:
    """Relative paths of the chosen .py files, sorted."""
    root = stdlib_root() if root is None else Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"standard library directory {str(root)!r} does not exist")
    chosen = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if EXCLUDED_PARTS.intersection(relative.parts[:-1]) or relative.name.startswith("test_"):
            continue
        chosen.append(relative.as_posix())
    if not chosen:
        raise FileNotFoundError(f"no Python sources under {str(root)!r}")
    return sorted(chosen)


def read(relative: str, root: Path | None = None) -> str:
    root = stdlib_root() if root is None else Path(root)
    # a few stdlib files hold bytes that are not UTF-8 (in comments); replace, never fail
    return (root / relative).read_text(encoding="utf-8", errors="replace")


def split(files: list[str]) -> tuple[list[str], list[str]]:
    """(training files, held-out files)."""
    held = [f for f in files if is_held_out(f)]
    return [f for f in files if not is_held_out(f)], held


def digest(files: list[str], root: Path | None = None) -> str:
    """One sha256 over the chosen files' paths and contents: which text a run saw."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode() + b"\0" + read(f, root).encode() + b"\0")
    return h.hexdigest()


def train_tokenizer(texts, vocab_size: int):
    """A byte-level BPE tokenizer (the `tokenizers` library) with EOT as token 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or vocab_size < 300:
        raise ValueError(f"vocab_size must be an int >= 300 (256 bytes + merges), got {vocab_size!r}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def encode_files(tokenizer, texts) -> list[int]:
    """The texts' token ids, each file followed by EOT."""
    eot = tokenizer.token_to_id(EOT)
    ids = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids.extend(encoding.ids)
        ids.append(eot)
    return ids
