"""The committed trained models (reference/trained/): a target, its early exit, a small draft.

    pair = load()                      # float32; load(torch.float64) for the kit
    pair.target, pair.drafts()["small"], pair.drafts()["early-exit"]
    pair.decode(ids), pair.prompts()   # held-out text prompts

`python -m reference.train` (make models) writes the directory; `check_manifest` compares the
files with the hashes in its manifest.json.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from reference.checkpoint import load_pretrained
from reference.model import EarlyExit, Qwen3

TRAINED_DIR = Path(__file__).parent / "trained"
# the weight-bound pair (make models-large, reference/grow.py): same tokenizer and prompts
LARGE_DIR = Path(__file__).parent / "trained-large"
# the pairs by the name the kit's --models gives them (properties/export/trained.py PAIRS)
PAIR_DIRS = {"trained": TRAINED_DIR, "trained-large": LARGE_DIR}
DRAFTS = ("early-exit", "small")
# the heads make models-heads trains (reference/train_heads.py and its siblings), each in the
# folder of its kind
HEADS = {"eagle3": "EAGLE-3 head", "mtp": "MTP layer", "medusa": "Medusa heads",
         "dflash": "DFlash drafter"}


def _head_kind(kind: str) -> str:
    if kind not in HEADS:
        raise ValueError(f"kind={kind!r}: the trained heads are {', '.join(HEADS)}")
    return kind


@dataclass
class TrainedPair:
    path: Path
    target: Qwen3
    small: Qwen3
    manifest: dict
    held: dict = field(repr=False)

    @property
    def exit_layers(self) -> int:
        return int(self.manifest["early_exit_layers"])

    def early_exit(self) -> EarlyExit:
        return EarlyExit(self.target, self.exit_layers).eval().requires_grad_(False)

    def drafts(self) -> dict:
        return {"early-exit": self.early_exit(), "small": self.small}

    def has_head(self, kind: str) -> bool:
        return (self.path / _head_kind(kind) / "config.json").is_file()

    def head(self, kind: str):
        """The head of `kind` (a HEADS key) trained on this target by make models-heads, in the
        target's dtype; the MTP layer in llama.cpp's draft-mtp convention, as trained."""
        from reference.heads.checkpoint import load_head
        if not self.has_head(kind):
            raise FileNotFoundError(f"no {HEADS[kind]} at {str(self.path / kind)!r}: run "
                                    f"`make models-heads`")
        return load_head(self.path / kind, self.target)

    def prompts(self) -> list[list[int]]:
        """Held-out prompts (token ids), in the order the manifest's figures used them."""
        return [p["ids"] for p in self.held["prompts"]]

    def prompt_texts(self) -> list[str]:
        return [p["text"] for p in self.held["prompts"]]

    @property
    def tokenizer(self):
        return _tokenizer(str(self.path / "tokenizer.json"))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


@lru_cache(maxsize=4)
def _tokenizer(path: str):
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise ImportError("decoding the trained models' text needs tokenizers: "
                          "pip install 'speculative-conformance[serve]'") from error
    return Tokenizer.from_file(path)


def load_dir(path, dtype=torch.float32) -> TrainedPair:
    path = Path(path)
    manifest_file = path / "manifest.json"
    if not manifest_file.is_file():
        raise FileNotFoundError(f"no trained models at {str(path)!r} (manifest.json missing); "
                                f"run `make models`")
    manifest = json.loads(manifest_file.read_text()) if manifest_file.stat().st_size else {}
    held = json.loads((path / "heldout.json").read_text())
    return TrainedPair(path, load_pretrained(path / "target", dtype=dtype),
                       load_pretrained(path / "small", dtype=dtype), manifest, held)


@lru_cache(maxsize=4)
def load(dtype=torch.float32) -> TrainedPair:
    """The committed pair (cached per dtype; the models are frozen, never edit them)."""
    return load_dir(TRAINED_DIR, dtype)


def check_manifest(path=TRAINED_DIR) -> list[str]:
    """Every file the manifest lists, whose sha256 differs or which is missing, and every file
    present but not listed; an empty list means the directory is what the manifest says."""
    path = Path(path)
    listed = json.loads((path / "manifest.json").read_text())["files"]
    problems = []
    for name, digest in sorted(listed.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{name}: listed in the manifest but missing")
        elif hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            problems.append(f"{name}: sha256 differs from the manifest")
    for file in sorted(path.rglob("*")):
        name = file.relative_to(path).as_posix()
        if file.is_file() and name != "manifest.json" and name not in listed:
            problems.append(f"{name}: present but not in the manifest")
    return problems
