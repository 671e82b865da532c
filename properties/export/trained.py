"""`python -m properties.serve export DIR --models trained`: the committed trained pair as
Hugging Face directories, for timing served engines on models where speculation pays.

DIR/target (the 6-layer trained target), DIR/draft-small (the separately trained 1-layer
draft) and DIR/draft-early-exit (the target's first exit layers as a standalone model), each
with the trained byte-level BPE tokenizer. The served law checks keep the kit's own exported
models (a 32-token vocabulary whose two-token law is enumerable); these are for speed and
acceptance, where a random pair would make speculation lose.

Not every engine loads every shape: an engine's attention kernels take only some head sizes, and
one may accept a model at start-up and fail at its first request (vLLM's CPU build with the small
draft's head_dim 24: "Unsupported CPU attention configuration: head_dim=24", issue 24). The
export warns, naming the model, its head_dim and the engine, for every such pair
(`unservable`).
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


# Head sizes each engine's attention takes, with where the rule comes from.
HEAD_SIZES = {
    # vLLM 0.32.0 (CPU build): vllm/v1/attention/backends/cpu_attn.py,
    # CPUAttentionBackend.get_supported_head_sizes
    "vllm": ("vLLM's CPU attention takes head_dim in {32, 64, 80, 96, 112, 128, 160, 192, 224, "
             "256, 512}", lambda d: d in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)),
}


def head_size_rules() -> dict:
    """engine -> (rule in words, predicate on head_dim): the table above, and each engine of
    the kit's table that declares its own (Engine.head_sizes, in its file)."""
    from properties import engines
    rules = dict(HEAD_SIZES)
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


def tokenizer_files(pair: TrainedPair) -> dict[str, str]:
    return {"tokenizer.json": (pair.path / "tokenizer.json").read_text(),
            "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2),
            "special_tokens_map.json": json.dumps({}, indent=2)}


def export(directory) -> dict[str, Path]:
    """Write the trained models into `directory`/<name>; returns name -> path."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"export directory {str(root)!r} exists and is not a directory")
    pair = load(torch.float32)
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
