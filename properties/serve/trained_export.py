"""`python -m properties.serve export DIR --models trained`: the committed trained pair as
Hugging Face directories, for timing served engines on models where speculation pays.

DIR/target (the 6-layer trained target), DIR/draft-small (the separately trained 1-layer
draft) and DIR/draft-early-exit (the target's first exit layers as a standalone model), each
with the trained byte-level BPE tokenizer. The served law checks keep the kit's own exported
models (a 32-token vocabulary whose two-token law is enumerable); these are for speed and
acceptance, where a random pair would make speculation lose.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from properties.serve.export import generation_config
from reference.checkpoint import save_pretrained
from reference.model import Qwen3
from reference.pretrained import TrainedPair, load

MODELS = {
    "target": "the trained target (6 layers)",
    "draft-small": "the separately trained small draft (1 layer, distilled from the target)",
    "draft-early-exit": "the trained target's first layers, then its final norm and head",
}


def standalone_early_exit(pair: TrainedPair) -> Qwen3:
    """The early exit as a model of its own (a checkpoint cannot share the target's weights):
    the same numbers as reference.model.EarlyExit(pair.target, exit_layers)."""
    depth = pair.exit_layers
    config = replace(pair.target.config, num_hidden_layers=depth)
    model = Qwen3(config).to(pair.target.lm_head.weight.dtype)
    keep = {name: t for name, t in pair.target.state_dict().items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < depth}
    model.load_state_dict(keep, strict=True)
    return model.eval().requires_grad_(False)


def tokenizer_files(pair: TrainedPair) -> dict[str, str]:
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
              "clean_up_tokenization_spaces": False, "add_bos_token": False,
              "add_eos_token": False}
    return {"tokenizer.json": (pair.path / "tokenizer.json").read_text(),
            "tokenizer_config.json": json.dumps(config, indent=2),
            "special_tokens_map.json": json.dumps({}, indent=2)}


def export(directory) -> dict[str, Path]:
    """Write the trained models into `directory`/<name>; returns name -> path."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"export directory {str(root)!r} exists and is not a directory")
    pair = load(torch.float32)
    models = {"target": pair.target, "draft-small": pair.small,
              "draft-early-exit": standalone_early_exit(pair)}
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
