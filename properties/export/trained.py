"""`python -m properties.serve export DIR --models trained` (or `trained-large`): a trained pair as
Hugging Face directories, for timing served engines on models where speculation pays.

Two pairs, same tokenizer, held-out prompts and folder layout (`PAIRS`):

- `trained`: the committed pair (reference/trained: a 6-layer 1.4M-parameter target, its small
  draft with head_dim 24);
- `trained-large`: the weight-bound pair that `make models-large` writes (reference/trained-large,
  committed: an 8-layer 15M-parameter target, hidden 384, and its own small draft with
  head_dim 32), where a target forward costs enough memory traffic for speculation to pay.

DIR/target (the trained target), DIR/draft-small (the separately trained 1-layer draft) and
DIR/draft-early-exit (the target's first exit layers as a standalone model), each with the
trained byte-level BPE tokenizer. The served law checks keep the kit's own exported models (a
32-token vocabulary whose two-token law is enumerable); these are for speed and acceptance,
where a random pair would make speculation lose.

Not every engine loads every shape: an engine's attention kernels take only some head sizes, and
one may accept a model at start-up and fail at its first request (vLLM's CPU build with the
committed small draft's head_dim 24: "Unsupported CPU attention configuration: head_dim=24",
issue 24; the weight-bound pair's draft, head_dim 32, runs). Each engine's file declares the head
sizes it takes (`Engine.head_sizes`); the export warns, naming the model, its head_dim and the
engine, for every pair that fails (`unservable`), and
``python -m properties.serve run ENGINE METHOD --models trained`` refuses before starting
anything (`refusal`), on whichever pair `--models` names.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from pathlib import Path

import torch

from properties.export.kit import generation_config
from properties.models.served import standalone_early_exit
from properties.models.tokenizer import tokenizer_config
from reference.checkpoint import save_pretrained
from reference.pretrained import PAIR_DIRS, TrainedPair, load, load_dir

# --models name -> the pair's directory; "trained" stays the default everywhere, so that callers
# that name no pair get the committed one as before
PAIRS = dict(PAIR_DIRS)

MODELS = {
    "target": "the trained target (6 layers)",
    "draft-small": "the separately trained small draft (1 layer, distilled from the target)",
    "draft-early-exit": "the trained target's first layers, then its final norm and head",
}
# what each export folder holds, per pair (printed by `export --models ...`)
DESCRIPTIONS = {
    "trained": MODELS,
    "trained-large": {
        "target": "the weight-bound trained target (8 layers, hidden 384, 15M parameters)",
        "draft-small": "its own small draft (1 layer, head_dim 32, distilled from that target)",
        "draft-early-exit": "the weight-bound target's first layers, then its final norm and head",
    },
}


def check_models(models: str) -> str:
    """`models` itself when it names a trained pair, else ValueError naming the value."""
    if models not in PAIRS:
        raise ValueError(f"models={models!r}: choose one of {', '.join(PAIRS)}")
    return models


def pair_of(models: str = "trained", dtype=torch.float32) -> TrainedPair:
    """The pair `models` names, in `dtype` (cached: the launcher's refusal, its export and the
    check each ask for it). FileNotFoundError naming `make models-large` when the weight-bound
    pair's directory is missing (a checkout without it, or a path pointed elsewhere)."""
    if check_models(models) == "trained":
        return load(dtype)       # the committed pair, cached by reference.pretrained
    return _load_made(models, PAIRS[models], dtype)


@lru_cache(maxsize=4)
def _load_made(models: str, path: Path, dtype) -> TrainedPair:
    # cached by path too: a test may point PAIRS elsewhere
    if not (path / "manifest.json").is_file():
        raise FileNotFoundError(f"models={models!r}: no trained pair at {str(path)!r} "
                                f"(manifest.json missing): run `make models-large`")
    return load_dir(path, dtype)


def head_size_rules() -> dict:
    """engine -> (rule in words, predicate on head_dim), for each engine of the kit's table that
    declares one (Engine.head_sizes, in its own file: only engine files name engines)."""
    from properties import engines
    rules = {}
    for name in engines.available():
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
    if method is None or method.drafter.model is None:
        return None
    name = method.drafter.model
    if name != "target" and name not in MODELS:
        raise KeyError(f"method {method.name!r} drafts with {name!r}, which the trained pair "
                       f"does not have (its drafts: draft-early-exit, draft-small)")
    return name


def models_of(method, models: str = "trained") -> dict:
    """name -> the float32 model of the pair `models` names, for the target and the draft
    `method` drafts with."""
    pair = pair_of(models, torch.float32)
    made = {"target": pair.target,
            "draft-small": lambda: pair.small,
            "draft-early-exit": lambda: standalone_early_exit(pair.target, pair.exit_layers)}
    draft = draft_of(method)
    out = {"target": pair.target}
    if draft not in (None, "target"):
        out[draft] = made[draft]()
    return out


def refusal(engine, method, models: str = "trained") -> str | None:
    """Why `engine` cannot serve the pair `models` names with `method` (a model whose head size
    its attention refuses, named with its head_dim), or None: said before any server starts, as
    some engines accept such a model at start-up and die at the first request. The answer
    depends on the pair: the committed small draft's head_dim is 24, the weight-bound one's 32."""
    if not engine.head_sizes:
        return None
    rule, takes = engine.head_sizes
    for name, model in models_of(method, models).items():
        head_dim = model.config.head_dim
        if not takes(head_dim):
            # "the trained target", "the trained-large draft-small": names the pair refused
            return (f"{engine.name} cannot run the {models} {name}: head_dim={head_dim} "
                    f"({rule}); method {method.name} needs it")
    return None


def tokenizer_files(pair: TrainedPair) -> dict[str, str]:
    return {"tokenizer.json": (pair.path / "tokenizer.json").read_text(),
            "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2),
            "special_tokens_map.json": json.dumps({}, indent=2)}


def export(directory, method=None, models: str = "trained") -> dict[str, Path]:
    """Write the models of the pair `models` names into `directory`/<name>; returns name ->
    path. `method` (an engine's Method): only the target and the draft it uses (what a run
    converts and loads)."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"export directory {str(root)!r} exists and is not a directory")
    pair = pair_of(models, torch.float32)
    if method is not None:
        chosen = models_of(method, models)
    else:
        chosen = {"target": pair.target, "draft-small": pair.small,
                  "draft-early-exit": standalone_early_exit(pair.target, pair.exit_layers)}
        for problem in unservable(chosen):
            warnings.warn(problem, stacklevel=2)
    files = tokenizer_files(pair)
    paths = {}
    for name, model in chosen.items():
        path = root / name
        save_pretrained(model, path)
        (path / "generation_config.json").write_text(json.dumps(generation_config(), indent=2))
        for file, text in files.items():
            (path / file).write_text(text)
        paths[name] = path
    return paths
