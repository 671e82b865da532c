"""A reference DFlash head (reference/heads/dflash.py) written as both engines read a DFlash
drafter, and read back.

The folder: config.json, a Qwen3 config of the head's own layers with
`architectures: ["DFlashDraftModel"]` and
`dflash_config: {target_layer_ids, mask_token_id, block_size}`, and model.safetensors with the
head's own tensors under the reference's names (fc, hidden_norm, layers.{i}.*, norm, and
lm_head when the head has its own); no embed_tokens, so that both engines take the target's.

What each engine reads (vendored llama.cpp source, vLLM 0.32.0's package):
- llama.cpp's converter (conversion/qwen.py:664, `DFlashModel(Qwen3Model)`, registered for
  "DFlashDraftModel"): needs --target-model-dir for the tokenizer; writes
  `target_layers = [i + 1 for i in dflash_config.target_layer_ids]`, `dflash.block_size`
  (dflash_config.block_size, default 16) and the vocabulary's mask token id from
  dflash_config.mask_token_id; the tensors map as model.fc, model.hidden_norm (the encoder's
  output norm), model.lm_head (gguf-py/gguf/tensor_mapping.py). An `output` tensor is the
  draft's own lm_head; without it the target's is used, and with embed_tokens but no lm_head the
  embedding would be tied in as the lm_head (src/models/dflash.cpp:167-171), hence none here.
- vLLM (model_executor/models/registry.py:634 "DFlashDraftModel" -> DFlashQwen3ForCausalLM;
  config/speculative.py reads dflash_config.target_layer_ids and mask_token_id): tensors other
  than lm_head are loaded under "model." (qwen3_dflash.py load_weights), q/k/v stacked into
  qkv_proj; a checkpoint lm_head different from the target's is kept as the draft's own
  (v1/spec_decode/llm_base_proposer.py _maybe_share_lm_head).

A DSpark head (reference/heads/dspark.py) is the same folder with `architectures:
["DSparkDraftModel"]`, `markov_rank`, `markov_head_type: "vanilla"` and `sample_from_anchor:
true` beside it and its Markov head's tensors (markov_head.markov_w1, markov_head.markov_w2).
llama.cpp's converter (conversion/qwen.py:861-913, `DSparkModel(DFlashModel)`) keeps the
nested dflash_config, writes `dflash.sample_from_anchor` and `dflash.has_confidence_head`
(false: no confidence_head here), maps the Markov tensors to markov_w1 / markov_w2
(gguf-py/gguf/tensor_mapping.py) and drops an lm_head of the full vocabulary, so the head
borrows the target's (own_lm_head False). vLLM rewrites a "DSparkDraftModel" of model_type
qwen3 to Qwen3DSparkModel (config/speculative.py:1423-1430) and reads target_layer_ids as
DFlash does (dflash_config first, v1/worker/gpu/spec_decode/eagle/eagle3_utils.py:108-127).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from reference.checkpoint import _safetensors
from reference.heads.dflash import DFlashHead
from reference.heads.dspark import DSparkHead
from reference.hidden import HiddenStates

ARCHITECTURE = "DFlashDraftModel"
DSPARK_ARCHITECTURE = "DSparkDraftModel"


def config_of(head: DFlashHead) -> dict:
    """The HF-style config.json of a DFlash head for its target."""
    if not isinstance(head, DFlashHead):
        raise TypeError(f"config_of takes a DFlashHead, got {type(head).__name__}")
    c, hidden = head.config, head.hidden
    if hidden.where != "output" or hidden.normed:
        raise ValueError(f"DFlash's target_layer_ids name un-normed layer outputs; this head "
                         f"reads the {hidden.describe()}")
    dflash = {"target_layer_ids": list(hidden.layers), "mask_token_id": head.mask_token_id,
              "block_size": head.block_size}
    dspark = {} if not isinstance(head, DSparkHead) else {
        "markov_rank": head.markov_rank, "markov_head_type": "vanilla",
        "sample_from_anchor": True, "target_layer_ids": list(hidden.layers),
        "mask_token_id": head.mask_token_id}
    return asdict(c) | dspark | {
        "model_type": "qwen3",
        "architectures": [DSPARK_ARCHITECTURE if dspark else ARCHITECTURE],
        "num_hidden_layers": len(head.layers), "tie_word_embeddings": False,
        "hidden_act": "silu", "attention_bias": False, "torch_dtype": "float32",
        "target_hidden_size": c.hidden_size,
        "num_target_layers": head.target.config.num_hidden_layers,
        "block_size": head.block_size, "dflash_config": dflash,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "rope_scaling": None}


def write_dflash(head: DFlashHead, path) -> Path:
    """Write `head` to the folder `path` (float32 tensors)."""
    config = config_of(head)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(torch.float32).contiguous().cpu()
             for name, t in head.state_dict().items()}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _safetensors().save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load_dflash(path, target) -> DFlashHead:
    """The head a folder write_dflash wrote holds, for `target` (float64): what the engines
    load, as the reference computes it."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    if config.get("architectures") not in ([ARCHITECTURE], [DSPARK_ARCHITECTURE]):
        raise ValueError(f"{path}/config.json has architectures="
                         f"{config.get('architectures')!r}, not [{ARCHITECTURE!r}] or "
                         f"[{DSPARK_ARCHITECTURE!r}]")
    dflash = config.get("dflash_config") or {}
    missing = [k for k in ("target_layer_ids", "mask_token_id", "block_size") if k not in dflash]
    if missing:
        raise ValueError(f"{path}/config.json: dflash_config lacks {missing}")
    if config.get("num_target_layers", target.config.num_hidden_layers) != \
            target.config.num_hidden_layers:
        raise ValueError(f"{path}: made for a target of {config['num_target_layers']} layers, "
                         f"not this one's {target.config.num_hidden_layers}")
    state = _safetensors().load_file(str(path / "model.safetensors"))
    dspark = config["architectures"] == [DSPARK_ARCHITECTURE]
    head = (DSparkHead if dspark else DFlashHead)(
        target, HiddenStates(tuple(dflash["target_layer_ids"]), "output"),
        block_size=dflash["block_size"], mask_token_id=dflash["mask_token_id"],
        num_layers=config["num_hidden_layers"], own_lm_head="lm_head.weight" in state,
        **({"markov_rank": config["markov_rank"]} if dspark else {}))
    head.load_state_dict(state, strict=True)
    return head.to(torch.float64).eval().requires_grad_(False)
