"""The served target with one MTP layer, written as a GLM-4.5 checkpoint (Glm4MoeForCausalLM):
the only way llama.cpp's draft-mtp can run the kit's target, since its converter takes an MTP
layer only for architectures that declare one (GLM-4.5, DeepSeek, Qwen3-Next/3.5, MiMo, ...),
never for Qwen3.

Why the export computes exactly the kit's target and its reference MTP layer
(reference/heads/mtp.py), read from the vendored llama.cpp (.engines/llamacpp/src) and
transformers 5.25 (models/glm4_moe/modeling_glm4_moe.py):

* the trunk. `first_k_dense_replace` = the target's depth makes every trunk layer dense
  (src/models/glm4-moe.cpp, graph: `il < n_layer_dense_lead` -> build_ffn(up, gate, down,
  SILU, PAR)); each layer is attn_norm, q/k/v (no bias: attention_bias false, the biases are
  optional tensors, llama-model.cpp create_tensor_qkv), the per-head q/k RMSNorm
  (use_qk_norm true), RoPE on n_rot = head_dim * partial_rotary_factor dimensions (1.0: all of
  them) of type NEOX for GLM4_MOE (llama-model.cpp llama_model_rope_type: NEOX unless M-RoPE),
  the residual, post_attention_layernorm (GGUF attn_post_norm), the SwiGLU MLP and the
  residual: Qwen3's layer (reference/model.py Block), tensor names included (HF's dense
  Glm4Moe layer has Qwen3's names).
* the MTP layer (model.layers.N, N the depth; graph_mtp in glm4-moe.cpp): enorm(embedding) and
  hnorm(h), concatenated embedding first (ggml_concat(e_norm, h_norm)), eh_proj, then one
  decoder layer as above whose FFN must be a mixture of experts (graph_mtp asserts
  ffn_gate_inp): routed experts that are all the reference layer's SwiGLU (EXPERTS), top-1,
  sigmoid gating with norm_topk_prob: the chosen one's weight is sigmoid(s) / sigmoid(s) = 1
  exactly whatever the router says (build_moe_ffn: probs, then weights / their sum;
  routed_scaling_factor 1.0 is not applied, `w_scale != 1`), and whichever it chooses
  computes the same numbers; the router and its selection bias are zero. The shared
  expert the graph always adds is all zeros, so it adds exactly 0. Then the head norm and the
  lm_head: shared_head.norm / shared_head.head are left out, so llama.cpp uses the target's
  output_norm and output (graph_mtp: `shared_head_norm ? ... : model.output_norm`), which is
  the reference's "the target's final norm and lm_head". The recycled state is that normed
  output (res->t_h_nextn is set after the head norm): recycle="normed".
* a target whose lm_head is its embedding (the trained target, tie_word_embeddings): written
  as two equal tensors with tie_word_embeddings false, so the engine's output is the same
  matrix; nothing above depends on the target's sizes or depth (the trained target's 6 layers:
  first_k_dense_replace 6, the MTP layer model.layers.6).

Two layouts of the same numbers (LAYOUTS, by the head's export name): llama.cpp's, as above;
vLLM's, whose Glm4MoeForCausalLM refuses an all-dense trunk ("RuntimeError: No Glm4MoE layer
found in model.layers.", model_executor/models/glm4_moe.py:509) and whose MTP loader asks for
shared_head.norm: the last trunk layer's MLP as two equal routed experts (top-1, weight 1) and a
zero shared expert, the same function, and shared_head.norm = the target's final norm. The
engine's convention for the layer (hidden state, recycle, lead pair, mask0) is written into
config.json as "kit_mtp" (engines ignore it) so that `load` rebuilds the head the kit replays.

transformers cannot run the MTP layer (a router with one expert fails its group top-2, and
Glm4MoeForCausalLM builds num_hidden_layers layers only, ignoring model.layers.N), so the
trunk is checked against it (tests/test_export_glm_mtp.py) and the MTP layer by reading the
folder back into the reference (`load`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from properties.models import tokenizer
from reference.checkpoint import _safetensors
from reference.heads.mtp import MTPLayer

DTYPE = torch.float32
ARCHITECTURE = "Glm4MoeForCausalLM"
# routed experts of the MTP layer, all the same SwiGLU: one would do, but the converter writes
# transformers' default expert_group_count (1) and llama.cpp's loader asserts n_expert_groups <
# n_expert (src/llama-model.cpp:1365: "GGML_ASSERT(hparams.n_expert_groups < hparams.n_expert)
# failed" with one expert, 2026-12-07); with two equal experts, top-1, whichever the router
# picks computes the same numbers, weighted 1
EXPERTS = 2
# export name -> layout: which trunk layers are a mixture of experts, and whether the MTP
# layer's shared_head.norm is written
# (the -trained names: the trained pair's target and its trained MTP layer, the same layouts)
LLAMACPP = {"moe_trunk": False, "shared_head_norm": False}
VLLM = {"moe_trunk": True, "shared_head_norm": True}
LAYOUTS = {"target-glm4moe-mtp": LLAMACPP, "target-glm4moe-mtp-vllm": VLLM,
           "target-glm4moe-mtp-trained": LLAMACPP, "target-glm4moe-mtp-trained-vllm": VLLM}


def config(target_config, mtp_layers: int = 1, moe_trunk: bool = False) -> dict:
    """config.json of the served target as Glm4MoeForCausalLM, with `mtp_layers` MTP layers
    (`moe_trunk`: the last trunk layer a mixture of experts, vLLM's layout)."""
    c = target_config
    # a tied target's lm_head is written beside its embedding (tensors): untied here
    return {
        "architectures": [ARCHITECTURE], "model_type": "glm4_moe",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
        "hidden_act": "silu", "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta,
                            "partial_rotary_factor": 1.0},
        "partial_rotary_factor": 1.0, "rope_theta": c.rope_theta,
        "attention_bias": False, "use_qk_norm": True,
        # every trunk layer dense; the MTP layer's FFN is one routed expert and a zero shared one
        "first_k_dense_replace": c.num_hidden_layers - (1 if moe_trunk else 0),
        "n_routed_experts": EXPERTS, "num_experts_per_tok": 1, "n_shared_experts": 1,
        "moe_intermediate_size": c.intermediate_size, "norm_topk_prob": True,
        "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
        "num_nextn_predict_layers": mtp_layers, "num_mtp_layers": mtp_layers,
        "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": None,
        "pad_token_id": None,
    }


def tensors(head: MTPLayer, moe_trunk: bool = False, shared_head_norm: bool = False) -> dict:
    """The checkpoint's tensors (float32): the target's under their own (Qwen3 = GLM dense)
    names, the MTP layer as model.layers.N (LAYOUTS for the two flags)."""
    if not isinstance(head, MTPLayer):
        raise TypeError(f"glm_mtp.tensors takes an MTPLayer, got {type(head).__name__}")
    if head.order != "embedding-first":
        raise ValueError(f"GLM-4.5's MTP layer reads [enorm(e), hnorm(h)]: "
                         f"order='embedding-first', got order={head.order!r}")
    c = head.target.config
    state = {name: t for name, t in head.target.state_dict().items()}
    n = c.num_hidden_layers
    mtp = f"model.layers.{n}."
    block = head.mtp_block
    state[mtp + "enorm.weight"] = head.enorm.weight
    state[mtp + "hnorm.weight"] = head.hnorm.weight
    state[mtp + "eh_proj.weight"] = head.eh_proj.weight
    for name, t in block.state_dict().items():
        if name.startswith("mlp."):
            # the reference layer's SwiGLU is every routed expert; one is chosen, weight 1
            for e in range(EXPERTS):
                state[mtp + f"mlp.experts.{e}." + name[len("mlp."):]] = t
        else:
            state[mtp + name] = t
    H, I = c.hidden_size, c.intermediate_size
    like = head.eh_proj.weight
    moe = [mtp] + ([f"model.layers.{n - 1}."] if moe_trunk else [])
    for layer in moe[1:]:   # the dense MLP as every routed expert
        for name in ("gate_proj", "up_proj", "down_proj"):
            w = state.pop(layer + f"mlp.{name}.weight")
            for e in range(EXPERTS):
                state[layer + f"mlp.experts.{e}.{name}.weight"] = w
    for layer in moe:
        state[layer + "mlp.gate.weight"] = torch.zeros(EXPERTS, H, dtype=like.dtype)
        state[layer + "mlp.gate.e_score_correction_bias"] = torch.zeros(EXPERTS, dtype=like.dtype)
        for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            state[layer + f"mlp.shared_experts.{name}.weight"] = torch.zeros(shape, dtype=like.dtype)
    if shared_head_norm:
        state[mtp + "shared_head.norm.weight"] = head.target.model.norm.weight
    return {name: t.detach().to(DTYPE).cpu().clone() for name, t in state.items()}


def write(head: MTPLayer, path, tokenizer_files: dict | None = None) -> Path:
    """Write the target of `head` with `head` as its MTP layer to the folder `path`, in the
    layout its name declares (LAYOUTS; the folder's name is the head's export name), with the
    tokenizer files given (file name -> text; default the kit's 32-token tokenizer)."""
    from properties.export.kit import generation_config
    path = Path(path)
    if path.name not in LAYOUTS:
        raise ValueError(f"glm_mtp.write: no layout for the export name {path.name!r}; choose "
                         f"from {sorted(LAYOUTS)}")
    layout = LAYOUTS[path.name]
    path.mkdir(parents=True, exist_ok=True)
    cfg = config(head.target.config, moe_trunk=layout["moe_trunk"]) | {"kit_mtp": {
        "hidden": {"layers": list(head.hidden.layers), "where": head.hidden.where,
                   "normed": head.hidden.normed},
        "recycle": head.recycle, "lead": head.lead, "mask0": head.mask0}}
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    _safetensors().save_file(tensors(head, **layout), str(path / "model.safetensors"),
                             metadata={"format": "pt"})
    (path / "generation_config.json").write_text(json.dumps(generation_config(), indent=2))
    for file, text in (tokenizer_files or tokenizer.tokenizer_files()).items():
        (path / file).write_text(text)
    return path


def load(path):
    """The folder `write` wrote, read back into the reference: (target Qwen3, MTPLayer) in
    float64, the layer with the engine's convention the folder records ("kit_mtp")."""
    from dataclasses import replace

    from reference.hidden import HiddenStates
    from reference.model import Config, Qwen3
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("architectures") != [ARCHITECTURE] or cfg.get("num_nextn_predict_layers") != 1:
        raise ValueError(f"{path}/config.json is not a {ARCHITECTURE} with one MTP layer")
    state = _safetensors().load_file(str(path / "model.safetensors"))
    n = cfg["num_hidden_layers"]
    shapes = Config(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                    intermediate_size=cfg["intermediate_size"], num_hidden_layers=n,
                    num_attention_heads=cfg["num_attention_heads"],
                    num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"],
                    rope_theta=cfg["rope_parameters"]["rope_theta"],
                    rms_norm_eps=cfg["rms_norm_eps"],
                    max_position_embeddings=cfg["max_position_embeddings"])
    mtp = f"model.layers.{n}."
    trunk = {}
    for name, t in state.items():
        if name.startswith(mtp):
            continue
        if ".mlp.experts." in name:    # a mixture-of-experts trunk layer: its MLP is every expert
            key = name.split(".mlp.experts.")[0] + ".mlp." + name.split(".", 6)[6]
            if key in trunk and not torch.equal(trunk[key], t):
                raise ValueError(f"{path}: {name} differs from another expert's")
            trunk[key] = t
        elif ".mlp.gate." in name or ".mlp.shared_experts." in name:
            if torch.count_nonzero(t):
                raise ValueError(f"{path}: {name} is not zero: the export's routers and shared "
                                 f"experts must be")
        else:
            trunk[name] = t
    target = Qwen3(replace(shapes))
    target.load_state_dict(trunk, strict=True)
    target = target.to(torch.float64).eval().requires_grad_(False)
    kit = cfg.get("kit_mtp")
    if not isinstance(kit, dict):
        raise ValueError(f"{path}/config.json records no kit_mtp convention")
    h = kit["hidden"]
    head = MTPLayer(target, HiddenStates(tuple(h["layers"]), h["where"], h["normed"]),
                    order="embedding-first", recycle=kit["recycle"], lead=kit["lead"],
                    mask0=kit["mask0"])
    own = {}
    for name, t in state.items():
        if not name.startswith(mtp):
            continue
        name = name[len(mtp):]
        if name.startswith("mlp.experts."):
            key = "mtp_block.mlp." + name.split(".", 3)[3]
            if key in own and not torch.equal(own[key], t):
                raise ValueError(f"{path}: {mtp}{name} differs from another expert's: the "
                                 f"export's routed experts must be one SwiGLU")
            own[key] = t
        elif name.startswith(("mlp.gate.", "mlp.shared_experts.")):
            if torch.count_nonzero(t):
                raise ValueError(f"{path}: {mtp}{name} is not zero: the export's router and "
                                 f"shared expert must be")
        elif name in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
            own[name] = t
        elif name == "shared_head.norm.weight":
            if not torch.equal(t.to(torch.float64), target.model.norm.weight):
                raise ValueError(f"{path}: {mtp}{name} is not the target's final norm")
        else:
            own["mtp_block." + name] = t
    head.load_state_dict(own, strict=True)
    return target, head.to(torch.float64).eval().requires_grad_(False)
