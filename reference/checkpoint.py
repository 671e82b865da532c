"""Hugging Face-format checkpoints: config.json (model_type qwen3) + model.safetensors.

The reference model already uses the Hugging Face Qwen3 parameter names, so saving is writing
the state dict; this is how implementations that load their own models (transformers'
generate, servers) are handed the very models the kit checks.
"""

import json
from dataclasses import asdict, fields
from pathlib import Path

import torch

from reference.model import Config, Qwen3

_DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def _safetensors():
    try:
        import safetensors.torch
    except ImportError as error:  # an optional dependency: pip install '.[hf]'
        raise ImportError("checkpoints need safetensors: pip install 'speculative-conformance[hf]'") from error
    return safetensors.torch


def save_pretrained(model: Qwen3, path) -> Path:
    if not isinstance(model, Qwen3):
        raise TypeError(f"save_pretrained needs a reference Qwen3 model, got {type(model).__name__}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = model.lm_head.weight.dtype
    config = asdict(model.config) | {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "use_cache": True, "use_sliding_window": False, "max_window_layers": model.config.num_hidden_layers,
        "torch_dtype": _DTYPE_NAMES[dtype], "dtype": _DTYPE_NAMES[dtype],
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
        "rope_scaling": None, "initializer_range": 0.02,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    state = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")  # one tensor stored once; the loader re-ties it
    _safetensors().save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load_pretrained(path, dtype=None, device=None) -> Qwen3:
    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    if raw.get("model_type") != "qwen3":
        raise ValueError(f"{path}/config.json has model_type={raw.get('model_type')!r}, expected 'qwen3'")
    config = Config(**{f.name: raw[f.name] for f in fields(Config) if f.name in raw})
    model = Qwen3(config)
    state = _safetensors().load_file(str(path / "model.safetensors"))
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    stored = next(iter(state.values())).dtype
    return model.to(dtype=dtype or stored, device=device).eval().requires_grad_(False)
