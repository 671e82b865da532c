"""`python -m properties.serve export DIR --models trained`: the committed trained pair as
Hugging Face directories, for timing served engines on models where speculation pays.

DIR/target (the 6-layer trained target), DIR/draft-small (the separately trained 1-layer
draft) and DIR/draft-early-exit (the target's first exit layers as a standalone model), each
with the trained byte-level BPE tokenizer. The served law checks keep the kit's own exported
models (a 32-token vocabulary whose two-token law is enumerable); these are for speed and
acceptance, where a random pair would make speculation lose.

Not every engine loads every shape: an engine's attention kernels take only some head sizes, and
one may accept a model at start-up and fail at its first request (vLLM's CPU build with the small
draft's head_dim 24: "Unsupported CPU attention configuration: head_dim=24", issue 24). Each
engine's file declares the head sizes it takes (`Engine.head_sizes`); the export warns, naming
the model, its head_dim and the engine, for every pair that fails (`unservable`), and
``python -m properties.serve run ENGINE METHOD --models trained`` refuses before starting
anything (`refusal`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from properties.export.kit import generation_config
from properties.models.served import standalone_early_exit
from properties.models.tokenizer import tokenizer_config
from reference.checkpoint import save_pretrained
from reference.pretrained import TrainedPair, load

MODELS = {
    "target": "the trained target (6 layers)",
    "draft-small": "the separately trained small draft (1 layer, distilled from the target)",
    "draft-early-exit": "the trained target's first layers, then its final norm and head",
}


def head_size_rules() -> dict:
    """engine -> (rule in words, predicate on head_dim), for each engine of the kit's table that
    declares one (Engine.head_sizes, in its own file: only engine files name engines)."""
    from properties import engines
    rules = {}
    for name in engines.ENGINES:
        declared = getattr(engines.get(name), "head_sizes", None)
        if declared:
            rules[name] = declared
    return rules


def unservable(models: dict) -> list[str]:
    """One line per (model, engine) whose head size the engine cannot run; models: name ->
    a Qwen3-family module (its config's head_dim is what the engine sees)."""
    problems = []
    for name, model in models.items():
        head_dim = model.config.head_dim
        for engine, (rule, takes) in head_size_rules().items():
            if not takes(head_dim):
                problems.append(f"{name} has head_dim={head_dim}, which {engine} cannot run "
                                f"({rule}): serve it with another engine")
    return problems


def draft_of(method) -> str | None:
    """The trained export's folder a method drafts with (None: no draft model), or KeyError
    when the trained pair has no such draft."""
    if method is None or method.draft == "ngram":
        return None
    if method.draft == "perfect":
        return "target"
    if method.draft not in MODELS:
        raise KeyError(f"method {method.name!r} drafts with {method.draft!r}, which the trained "
                       f"pair does not have (its drafts: draft-early-exit, draft-small)")
    return method.draft


def models_of(method) -> dict:
    """name -> the float32 model, for the target and the draft `method` drafts with."""
    pair = load(torch.float32)
    made = {"target": pair.target,
            "draft-small": lambda: pair.small,
            "draft-early-exit": lambda: standalone_early_exit(pair.target, pair.exit_layers)}
    draft = draft_of(method)
    out = {"target": pair.target}
    if draft not in (None, "target"):
        out[draft] = made[draft]()
    return out


def refusal(engine, method) -> str | None:
    """Why `engine` cannot serve the trained pair with `method` (a model whose head size its
    attention refuses, named with its head_dim), or None: said before any server starts, as
    some engines accept such a model at start-up and die at the first request."""
    if not engine.head_sizes:
        return None
    rule, takes = engine.head_sizes
    for name, model in models_of(method).items():
        head_dim = model.config.head_dim
        if not takes(head_dim):
            return (f"{engine.name} cannot run the trained {name}: head_dim={head_dim} ({rule}); "
                    f"method {method.name} needs it")
    return None


def tokenizer_files(pair: TrainedPair) -> dict[str, str]:
    return {"tokenizer.json": (pair.path / "tokenizer.json").read_text(),
            "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2),
            "special_tokens_map.json": json.dumps({}, indent=2)}


def export(directory, method=None) -> dict[str, Path]:
    """Write the trained models into `directory`/<name>; returns name -> path. `method` (an
    engine's Method): only the target and the draft it uses (what a run converts and loads)."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"export directory {str(root)!r} exists and is not a directory")
    pair = load(torch.float32)
    if method is not None:
        models = models_of(method)
    else:
        models = {"target": pair.target, "draft-small": pair.small,
                  "draft-early-exit": standalone_early_exit(pair.target, pair.exit_layers)}
        for problem in unservable(models):
            warnings.warn(problem, stacklevel=2)
    files = tokenizer_files(pair)
    paths = {}
    for name, model in models.items():
        path = root / name
        save_pretrained(model, path)
        (path / "generation_config.json").write_text(json.dumps(generation_config(), indent=2))
        for file, text in files.items():
            (path / file).write_text(text)
        paths[name] = path
    return paths
