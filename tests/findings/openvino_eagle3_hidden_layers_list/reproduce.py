"""OpenVINO GenAI 2026.4.1: an EAGLE-3 draft's `hidden_layers_list` cannot be given through the
Python API. The property is read as a C++ vector of int32 (eagle3_model_transforms.cpp,
extract_eagle3_info_from_config), while the Python bindings turn a list of ints into a vector
of int64 (src/python/py_utils.cpp), so every list is refused: "hidden_layers_list must be a
vector of int32_t values". The same list written into the draft IR's rt_info is taken, and the
pipeline drafts. Standalone: the engine's Python API, models built with transformers (a 4-layer
tiny Qwen3 target and a random EAGLE-3 head in EAGLE-3's Llama-layer checkpoint format,
converted with optimum-cli); no import of the conformance kit.

    python reproduce.py

Exit status 0 when the finding reproduces: the Python list is refused with that message and the
rt_info route runs and drafts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openvino_tiny import (DEVICE, add_special_token, config, convert_command, ids,  # noqa: E402
                           versions)
from tiny import _config, tiny_models  # noqa: E402

LAYERS = [0, 1, 2]          # the outputs of target layers 0, 1, 2 (of 4)
PROMPT = [0, 1, 2, 3, 4, 5, 6, 7]


def write_target(root: Path) -> Path:
    """../tiny.py's target folder (its tokenizer) with a 4-layer target in it: OpenVINO's
    EAGLE-3 reads three distinct layers, which a 2-layer model does not have."""
    import torch
    from transformers import Qwen3ForCausalLM
    target, _ = tiny_models(root)
    torch.manual_seed(2)
    model = Qwen3ForCausalLM(_config(4)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.6)
    model.save_pretrained(target)
    return target


def write_head(target: Path, out: Path) -> Path:
    """A random EAGLE-3 head for the target as LlamaForCausalLMEagle3 (fc over three hidden
    states, one Llama layer whose q/k/v read [embedding, hidden], its own norm and lm_head),
    with d2t (all 0: the whole vocabulary) and t2d, and the target's tokenizer."""
    import torch
    from safetensors.torch import save_file
    H, V, heads, kv, d, inter = 64, 32, 2, 1, 64, 128
    torch.manual_seed(3)
    shapes = {"embed_tokens.weight": (V, H), "fc.weight": (H, 3 * H),
              "midlayer.self_attn.q_proj.weight": (heads * d, 2 * H),
              "midlayer.self_attn.k_proj.weight": (kv * d, 2 * H),
              "midlayer.self_attn.v_proj.weight": (kv * d, 2 * H),
              "midlayer.self_attn.o_proj.weight": (H, heads * d),
              "midlayer.mlp.gate_proj.weight": (inter, H), "midlayer.mlp.up_proj.weight": (inter, H),
              "midlayer.mlp.down_proj.weight": (H, inter), "lm_head.weight": (V, H)}
    state = {k: torch.randn(s) * 0.2 for k, s in shapes.items()}
    for norm in ("midlayer.input_layernorm", "midlayer.hidden_norm",
                 "midlayer.post_attention_layernorm", "norm"):
        state[f"{norm}.weight"] = torch.ones(H)
    state["d2t"] = torch.zeros(V, dtype=torch.int64)
    state["t2d"] = torch.ones(V, dtype=torch.bool)
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": V,
        "draft_vocab_size": V, "hidden_size": H, "target_hidden_size": H,
        "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": d, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (target / name).exists():
            (out / name).write_bytes((target / name).read_bytes())
    return out


def convert(model: Path, out: Path, *extra: str) -> Path:
    argv = convert_command(model, out)
    done = subprocess.run(argv[:-1] + list(extra) + argv[-1:], capture_output=True, text=True)
    if done.returncode != 0 or not (out / "openvino_model.xml").exists():
        sys.exit(f"optimum-cli failed on {model}:\n{done.stderr[-3000:]}")
    return out


def with_rt_info(head: Path, out: Path, layers) -> Path:
    """A copy of the converted head whose rt_info holds hidden_layers_list."""
    import shutil
    import openvino as ov
    shutil.copytree(head, out)
    model = ov.Core().read_model(str(head / "openvino_model.xml"))
    model.set_rt_info(" ".join(map(str, layers)), ["hidden_layers_list"])
    ov.save_model(model, str(out / "openvino_model.xml"), compress_to_fp16=False)
    return out


def attempt(target: Path, head: Path, **draft_options):
    """(tokens, drafted, accepted) of one greedy request, or the exception's text."""
    import openvino_genai as genai
    try:
        draft = genai.draft_model(str(head), "CPU", **DEVICE, **draft_options)
        pipe = genai.LLMPipeline(str(target), "CPU", draft_model=draft, **DEVICE)
        result = pipe.generate(ids(PROMPT), config(pipe, 12, num_assistant_tokens=4))
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[-1]
    m = result.extended_perf_metrics
    return list(result.tokens[0]), m.get_num_draft_tokens(), m.get_num_accepted_tokens()


def main() -> int:
    print(versions())
    root = Path(tempfile.mkdtemp(prefix="ov-eagle3-layers-"))
    target_hf = write_target(root / "hf")
    add_special_token(target_hf)
    head_hf = write_head(target_hf, root / "hf" / "head")
    target = convert(target_hf, root / "ir" / "target")
    # optimum-intel loads the head through its own LlamaEagle3ForCausalLM, as remote code
    head = convert(head_hf, root / "ir" / "head", "--trust-remote-code")
    print(f"target: 4 Qwen3 layers; head: EAGLE-3 (LlamaForCausalLMEagle3); "
          f"hidden_layers_list {LAYERS}; greedy, num_assistant_tokens 4, prompt {PROMPT}")
    listed = attempt(target, head, hidden_layers_list=LAYERS)
    print(f"1. draft_model(head, 'CPU', hidden_layers_list={LAYERS}):\n   {listed}")
    unset = attempt(target, head)
    print(f"2. no hidden_layers_list (the default needs 10 layers or more):\n   {unset}")
    written = attempt(target, with_rt_info(head, root / "ir" / "head-rt", LAYERS))
    print(f"3. the same list in the head IR's rt_info (tokens, drafted, accepted):\n   {written}")
    refused = isinstance(listed, str) and "must be a vector of int32_t values" in listed
    ran = isinstance(written, tuple) and written[1] > 0
    print("REPRODUCED" if refused and ran else "NOT REPRODUCED")
    return 0 if refused and ran else 1


if __name__ == "__main__":
    sys.exit(main())
