"""Writing the served models as Hugging Face directories that real servers load.

Each directory holds config.json (model_type qwen3), model.safetensors (float32),
generation_config.json, and the tokenizer files. `check_export` reads a directory back and
confirms it is bit for bit the model the kit computes its exact law from.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from properties.models import served as models
from properties.models import tokenizer
from reference.checkpoint import load_pretrained, save_pretrained

DTYPE = torch.float32


def generation_config() -> dict:
    # Plain greedy by default, and no end-of-sequence token: the kit's models have none, and a
    # server must stop only at max_tokens or at the stop ids a request names.
    return {"do_sample": False, "bos_token_id": None, "eos_token_id": None,
            "pad_token_id": None, "max_new_tokens": 64}


def export_model(name: str, directory) -> Path:
    """Write served model `name` to `directory` (created if needed)."""
    path = Path(directory)
    model = copy.deepcopy(models.build(name)).to(DTYPE)  # .to() would convert the cached one
    save_pretrained(model, path)
    (path / "generation_config.json").write_text(json.dumps(generation_config(), indent=2))
    for file, text in tokenizer.tokenizer_files().items():
        (path / file).write_text(text)
    return path


def export(directory) -> dict[str, Path]:
    """Write every served model into `directory`/<name>; returns name -> path."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"export directory {str(root)!r} exists and is not a directory")
    return {name: export_model(name, root / name) for name in models.MODELS}


def check_export(name: str, directory) -> None:
    """Raise ValueError unless `directory` holds served model `name` exactly."""
    loaded = load_pretrained(directory, dtype=torch.float64)
    expected = models.build(name).state_dict()
    for key, tensor in loaded.state_dict().items():
        if not torch.equal(tensor, expected[key]):
            raise ValueError(f"{directory}: tensor {key} differs from the kit's {name!r} model")
