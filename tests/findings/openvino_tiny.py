"""Shared by the OpenVINO GenAI reproductions in this folder (none imports the conformance kit):
the tiny Qwen3 checkpoints of ../tiny.py converted to OpenVINO IR with optimum-cli, and an
LLMPipeline fed token ids.

Run with the Python of an environment holding openvino-genai 2026.4.1.0, optimum-intel 2.2.0
(its `optimum-cli` beside that Python), transformers < 5.6 and scipy:

    python -m venv ov && ov/bin/pip install openvino-genai==2026.4.1.0 \
        "optimum-intel[openvino]==2.2.0" "transformers<5.6" scipy
    ov/bin/pip uninstall -y torchvision       # its import breaks the export

(pip pulls a CUDA build of torch unless torch 2.13.0+cpu is installed first, from
https://download.pytorch.org/whl/cpu.) The EAGLE-3 reproductions (`eagle3_models`: a 4-layer
target and an EAGLE-3 head converted by optimum-intel's own class, loaded as remote code) also
need `diffusers einops "huggingface-hub>=1.5,<1.22"` (that code's imports; diffusers alone
pulls a huggingface-hub that transformers refuses).

The tokenizer: ../tiny.py writes a byte-level BPE of 32 one-character tokens with no merges
and no added token, which openvino-tokenizers 2026.4.1 does not convert ("Incorrect number of
inputs passed to BPETokenizer"), and a speculative LLMPipeline does not start without one. With
one added special token at id 32 it converts, and maps every id to itself; the models' 32
logits never reach id 32, which also serves as the end-of-sequence id (the checkpoints name
none, and the pipeline refuses the null one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import _config, exact_law, tiny_models  # noqa: E402,F401  (exact_law: for the callers)

EOS = 32     # no model emits it: 32 logits


def add_special_token(model_dir: Path) -> None:
    """Rewrite the checkpoint's tokenizer.json with "<|endoftext|>" added at id 32."""
    from tokenizers import AddedToken, Tokenizer
    path = model_dir / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    assert tokenizer.token_to_id("<|endoftext|>") == EOS
    tokenizer.save(str(path))


def convert_command(model_dir: Path, out: Path) -> list:
    cli = Path(sys.executable).with_name("optimum-cli")
    return [str(cli), "export", "openvino", "--model", str(model_dir), "--task",
            "text-generation-with-past", "--weight-format", "fp32", str(out)]


def openvino_models(root: Path) -> tuple[Path, Path, Path]:
    """(HF target, IR target, IR draft) under `root`: ../tiny.py's checkpoints (a 2-layer
    target and its early-exit draft), their tokenizer given the added token, converted."""
    target, draft = tiny_models(root / "hf")
    out = []
    for model in (target, draft):
        add_special_token(model)
        ir = root / "ir" / model.name
        done = subprocess.run(convert_command(model, ir), capture_output=True, text=True)
        if done.returncode != 0 or not (ir / "openvino_tokenizer.xml").exists():
            sys.exit(f"optimum-cli failed on {model}:\n{done.stderr[-3000:]}")
        out.append(ir)
    return target, out[0], out[1]


DEVICE = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def pipeline(target: Path, draft: Path | None = None, prompt_lookup: bool = False):
    import openvino_genai as genai
    options = dict(DEVICE)
    if draft is not None:
        options["draft_model"] = genai.draft_model(str(draft), "CPU", **DEVICE)
    if prompt_lookup:
        options["prompt_lookup"] = True
    return genai.LLMPipeline(str(target), "CPU", **options)


def config(pipe, max_new_tokens: int, **fields):
    """The pipeline's generation config: end of sequence at EOS (never emitted), no stop id
    unless given, then `fields` (GenerationConfig attributes)."""
    c = pipe.get_generation_config()
    c.set_eos_token_id(EOS)
    c.stop_token_ids = set()
    c.ignore_eos = True
    c.max_new_tokens = max_new_tokens
    for key, value in fields.items():
        setattr(c, key, value)
    return c


def ids(prompt) -> "object":
    import numpy as np
    import openvino as ov
    return ov.Tensor(np.array([list(prompt)], dtype=np.int64))


def versions() -> str:
    from importlib.metadata import version
    return ", ".join(f"{p} {version(p)}" for p in ("openvino-genai", "openvino",
                                                    "openvino-tokenizers", "optimum-intel",
                                                    "transformers", "torch"))


# ----------------------------------------------------------------- EAGLE-3 (4-layer target)

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


def write_head(target: Path, out: Path, d2t: bool = True) -> Path:
    """A random EAGLE-3 head for the target as LlamaForCausalLMEagle3 (fc over three hidden
    states, one Llama layer whose q/k/v read [embedding, hidden], its own norm and lm_head),
    with d2t (all 0: the whole vocabulary) and t2d unless `d2t` is False, and the target's
    tokenizer."""
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
    if d2t:     # the map to target ids: 0 (target id - draft id) over the whole vocabulary
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



def eagle3_models(root: Path, d2t: bool = True) -> tuple[Path, Path]:
    """(IR target, IR head) under `root`: write_target's 4-layer target, its tokenizer given
    the added token, and write_head's EAGLE-3 head, converted (the head by optimum-intel's own
    LlamaEagle3ForCausalLM, loaded as remote code: --trust-remote-code)."""
    target_hf = write_target(root / "hf")
    add_special_token(target_hf)
    head_hf = write_head(target_hf, root / "hf" / "head", d2t)
    return (convert(target_hf, root / "ir" / "target"),
            convert(head_hf, root / "ir" / "head", "--trust-remote-code"))


def eagle3_greedy(target: Path, head: Path, prompt, max_new_tokens: int = 12, k: int = 4,
                  **draft_options):
    """(tokens, drafted, accepted) of one greedy request with the EAGLE-3 head drafting k per
    round, or the last line of the engine's exception (a refusal is the engine's own words)."""
    import openvino_genai as genai
    try:
        draft = genai.draft_model(str(head), "CPU", **DEVICE, **draft_options)
        pipe = genai.LLMPipeline(str(target), "CPU", draft_model=draft, **DEVICE)
        result = pipe.generate(ids(prompt), config(pipe, max_new_tokens, num_assistant_tokens=k))
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[-1]
    m = result.extended_perf_metrics
    return list(result.tokens[0]), m.get_num_draft_tokens(), m.get_num_accepted_tokens()
