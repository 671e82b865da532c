"""Feature-level heads written as vLLM loads them, from the reference heads' own weights.

A head method's export folder (a HeadDraft's `head`) is written beside the target, so that the
engine loads exactly the numbers the kit computes proposals from:

- the served head (properties/models/heads.py `served_head`): for the kit's 32-token served
  target, a head of the drafter's kind and hidden-state convention with seeded random weights;
  EAGLE-3's embedding is the target's (vLLM shares the target's embedding when the head's
  equals it, so either way the numbers are the target's);
- `trained_head(drafter, models)`: the EAGLE-3 head, the Medusa heads, the MTP layer or the
  DFlash drafter trained on a trained pair's target (make models-heads), for `--models trained`.

vLLM 0.32.0's formats, from its source (site-packages/vllm/):
- EAGLE-3 (model_executor/models/qwen3_eagle3.py, Eagle3Qwen3ForCausalLM): a Qwen3 config of
  one layer with architectures ["Eagle3Qwen3ForCausalLM"], `eagle_aux_hidden_state_layer_ids`
  (the residual stream entering each named target layer: models/interfaces.py,
  _maybe_add_hidden_state), `target_hidden_size`; the tensors are the reference head's names
  (fc, midlayer.*, norm, lm_head, embed_tokens) and, with a draft vocabulary, `d2t` holding
  target id - draft id (compute_logits adds it to arange(draft_vocab_size)).
- EAGLE-3 with a Llama layer (qk_norm=False; model_executor/models/llama_eagle3.py,
  LlamaForCausalLMEagle3, EAGLE-3's own checkpoint format): a Llama config of one layer with
  `draft_vocab_size` (always written: llama.cpp's converter recognises an EAGLE-3 head by it
  and a single layer, conversion/llama.py), the same aux-layer ids and tensor names. llama.cpp
  converts this folder to GGUF (properties/engines/llamacpp.py) with the target's folder beside
  it for the tokenizer and the target's depth.
- Medusa (model_executor/models/medusa.py, transformers_utils/configs/medusa.py): model_type
  "medusa", num_heads, num_hidden_layers (residual layers per head), `medusa_fc_bias` (the
  layers have no bias unless it is set: the reference's have one); tensors
  blocks.{i}.layers.{j}.{weight,bias} and lm_heads.{i}.weight, the reference's names.
- DFlash (both engines' `DFlashDraftModel`): properties/export/dflash.py, which write_vllm and
  load_vllm hand a DFlash head to.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from properties.models.heads import DTYPE, served_head
from reference.checkpoint import _safetensors
from reference.heads.eagle3 import Eagle3Head
from reference.heads.medusa import MedusaHeads


def trained_head(drafter, models: str = "trained"):
    """The trained pair's head of the drafter's kind (EAGLE-3, Medusa, MTP, DFlash) in float64;
    the MTP layer read in the drafter's convention (its options). A DFlash drafter is one export
    for both engines (properties/export/dflash.py), its own lm_head shipped."""
    from properties.export.trained import pair_of
    from reference.pretrained import HEADS
    if drafter.kind not in HEADS:
        raise ValueError(f"no trained head of kind {drafter.kind!r}: {', '.join(HEADS)} are "
                         f"trained (make models-heads)")
    head = pair_of(models, torch.float64).head(drafter.kind).to(torch.float64)
    if drafter.kind == "mtp":
        return in_convention(head, dict(drafter.options))
    # an engine that loads only Llama-layer heads (OpenVINO GenAI through optimum-intel) is
    # declared with qk_norm False: it gets, and the kit replays, the trained weights in one
    if drafter.kind == "eagle3" and head.qk_norm and not drafter.qk_norm:
        return llama_layer(head)
    return head


def in_convention(layer, options: dict):
    """An MTPLayer with the weights of `layer` read in an engine's convention: a HeadDraft's
    options (order, recycle, lead, mask0), MTPLayer's defaults for those not given, as a served
    head is built. The trained layer was trained in llama.cpp's; vLLM reads the same weights in
    its own, a different head, replayed as itself."""
    import inspect

    from reference.heads.mtp import MTPLayer
    defaults = {name: p.default for name, p in inspect.signature(MTPLayer).parameters.items()
                if name in ("order", "recycle", "lead", "mask0")}
    wanted = defaults | options
    if wanted == {o: getattr(layer, o) for o in defaults}:
        return layer
    out = MTPLayer(layer.target, layer.hidden, **wanted)
    out.to(dtype=layer.eh_proj.weight.dtype)
    out.load_state_dict(layer.state_dict(), strict=True)
    return out.eval().requires_grad_(False)


def llama_layer(head):
    """A reference Eagle3Head with q/k norm as a Llama layer (qk_norm False): the same weights,
    the per-head q/k norm dropped. A different head from `head` (its own proposals, replayed as
    themselves), for engines whose EAGLE-3 layer has no q/k norm."""
    if not isinstance(head, Eagle3Head):
        raise TypeError(f"llama_layer takes an Eagle3Head, got {type(head).__name__}")
    d2t = None if head.draft_to_target is None else head.draft_to_target.tolist()
    out = Eagle3Head(head.target_config, head.hidden, d2t, qk_norm=False)
    p = head.fc.weight
    out.to(dtype=p.dtype, device=p.device)
    out.load_state_dict({k: v for k, v in head.state_dict().items()
                         if ".q_norm." not in k and ".k_norm." not in k}, strict=True)
    return out.eval().requires_grad_(False)


def write_vllm(head, path) -> Path:
    """Write a reference EAGLE-3 head or Medusa heads to `path` in vLLM's format (float32)."""
    from reference.heads.dflash import DFlashHead
    if isinstance(head, DFlashHead):    # both engines' DFlash format: properties/export/dflash.py
        from properties.export.dflash import write_dflash
        return write_dflash(head, path)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(DTYPE).contiguous().cpu()
             for name, t in head.state_dict().items() if name != "draft_to_target"}
    if isinstance(head, Eagle3Head):
        config = _eagle3_config(head) if head.qk_norm else _eagle3_llama_config(head)
        if head.draft_to_target is not None:
            d2t = head.draft_to_target.cpu()
            state["d2t"] = d2t - torch.arange(len(d2t))   # vLLM stores the offset
    elif isinstance(head, MedusaHeads):
        c = head.config
        config = {"model_type": "medusa", "architectures": ["MedusaModel"],
                  "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
                  "num_heads": head.num_heads, "num_hidden_layers": len(head.blocks[0].layers),
                  "medusa_fc_bias": True, "torch_dtype": "float32"}
    else:
        raise TypeError(f"write_vllm takes an Eagle3Head or MedusaHeads, got "
                        f"{type(head).__name__}")
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _safetensors().save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _eagle3_config(head) -> dict:
    c, hidden = head.config, head.hidden
    if hidden.where != "input" or hidden.normed:
        # vLLM feeds only the residual stream entering each named layer
        raise ValueError(f"vLLM's EAGLE-3 reads the un-normed inputs of target layers; this "
                         f"head reads the {hidden.describe()}")
    config = asdict(c) | {
        "model_type": "qwen3", "architectures": ["Eagle3Qwen3ForCausalLM"],
        "num_hidden_layers": 1, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "torch_dtype": "float32",
        "target_hidden_size": head.target_config.hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(hidden.layers),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(hidden.layers)},
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "rope_scaling": None}
    if head.draft_to_target is not None:
        config["draft_vocab_size"] = len(head.draft_to_target)
    return config


def _eagle3_llama_config(head) -> dict:
    """LlamaForCausalLMEagle3's config: the Qwen3 one's shapes under Llama's names (head_dim
    given explicitly: the kit's heads are wider than hidden_size / heads)."""
    config = _eagle3_config(head) | {"model_type": "llama",
                                     "architectures": ["LlamaForCausalLMEagle3"],
                                     "mlp_bias": False, "pretraining_tp": 1}
    config.setdefault("draft_vocab_size", head.config.vocab_size)
    return config


def load_vllm(path, target):
    """Read a folder `write_vllm` wrote back into a reference head for `target` (float64): what
    the engine loads, as the reference computes it (the export's round trip)."""
    from reference.hidden import HiddenStates
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    if config.get("architectures") in (["DFlashDraftModel"], ["DSparkDraftModel"]):
        from properties.export.dflash import load_dflash
        return load_dflash(path, target)
    state = _safetensors().load_file(str(path / "model.safetensors"))
    if config.get("model_type") == "medusa":
        head = MedusaHeads(target.config, config["num_heads"],
                           num_layers=config["num_hidden_layers"])
    elif config.get("architectures") in (["Eagle3Qwen3ForCausalLM"], ["LlamaForCausalLMEagle3"]):
        hidden = HiddenStates(tuple(config["eagle_aux_hidden_state_layer_ids"]), "input")
        d2t = state.pop("d2t", None)
        head = Eagle3Head(target.config, hidden,
                          None if d2t is None else (d2t + torch.arange(len(d2t))).tolist(),
                          qk_norm=config["architectures"] == ["Eagle3Qwen3ForCausalLM"])
    elif config.get("architectures") == ["Glm4MoeForCausalLM"]:
        # a target with its MTP layer (glm_mtp.py), in the engine's convention it records
        from properties.export import glm_mtp
        own, layer = glm_mtp.load(path)
        theirs = target.state_dict()
        if any(not torch.equal(t, theirs[name].to(t.dtype)) for name, t in own.state_dict().items()):
            raise ValueError(f"{path} holds another target than the one given")
        return layer
    else:
        raise ValueError(f"{path}/config.json is neither vLLM's Medusa nor an EAGLE-3 "
                         f"(Eagle3Qwen3ForCausalLM, LlamaForCausalLMEagle3) head")
    if getattr(head, "draft_to_target", None) is not None:
        state["draft_to_target"] = head.draft_to_target
    head.load_state_dict(state, strict=True)
    return head.to(torch.float64).eval().requires_grad_(False)


def export(directory, drafter, models: str = "kit") -> Path:
    """Write the head a HeadDraft loads into `directory`/<drafter.head>: the served head, or
    with `models` a trained pair, that pair's trained head."""
    head = served_head(drafter) if models == "kit" else trained_head(drafter, models)
    if drafter.hidden is not None and head.hidden != drafter.hidden:
        raise ValueError(f"the {models} {drafter.kind} head reads the {head.hidden.describe()}, "
                         f"not the {drafter.hidden.describe()} the method declares")
    if drafter.kind == "mtp":
        # an MTP layer ships inside its target: the served target and the layer as GLM-4.5
        # (properties/export/glm_mtp.py), the one format llama.cpp's converter takes for both
        from properties.export import glm_mtp
        files = None
        if models != "kit":     # a trained target: its own tokenizer
            from properties.export.trained import pair_of, tokenizer_files
            files = tokenizer_files(pair_of(models))
        return glm_mtp.write(head, Path(directory) / drafter.head, files)
    return write_vllm(head, Path(directory) / drafter.head)


def export_declared(directory) -> dict[str, Path]:
    """Every served head the engines' methods declare (not the trained-only ones, nor those
    of a deeper variant of the served target, whose run exports its own target), written into
    `directory`: what `python -m properties.serve export DIR` adds, so that the recipes' head
    command lines find their folders. head name -> path."""
    from properties import engines
    from properties.methods import HeadDraft
    drafters = {m.drafter.head: m.drafter for name in engines.available()
                for m in engines.get(name).methods.values()
                if isinstance(m.drafter, HeadDraft) and not m.drafter.trained_only
                and m.drafter.target == "target"}
    return {head: export(directory, drafter) for head, drafter in sorted(drafters.items())}
